"""Parley's error tree: what the app and the CLI catch and show as a headline plus what to do."""


class ParleyError(Exception):
    """Base of every error Parley raises on purpose; its message is meant for the user."""


class ModelFilesError(ParleyError):
    """A model folder is missing, incomplete, corrupt, or does not match its config."""


class InputTextError(ParleyError, ValueError):
    """Text that cannot be spoken as given (empty, or an unknown speaker or language)."""


class AudioDeviceError(ParleyError):
    """An audio device is missing, busy, or was lost."""


class HistoryError(ParleyError):
    """The conversation history database cannot be read or written (locked, disk full, corrupt)."""


class GPUUnavailableError(ParleyError):
    """The GPU cannot run a model (there is none, or it ran out of memory); the message says what Parley
    does instead (the CPU). Reported as a notice: the conversation goes on."""
