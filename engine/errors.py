"""Parley's error tree: what the app and the CLI catch and show as a headline plus what to do."""


class ParleyError(Exception):
    """Base of every error Parley raises on purpose; its message is meant for the user."""


class ModelFilesError(ParleyError):
    """A model folder is missing, incomplete, corrupt, or does not match its config."""


class ModelMissingError(ModelFilesError):
    """No model where Parley looked: the folder, file or package is not there at all (as opposed to damaged)."""


class InputTextError(ParleyError, ValueError):
    """Text that cannot be spoken as given (empty, or an unknown speaker or language)."""


class ReferenceAudioError(ParleyError, ValueError):
    """A recording to clone a voice from that cannot be used as given: not audio, too short or too long, silent,
    or clipped. The message says what is wrong with it and how to record it again."""


class VoiceFileError(ParleyError):
    """A saved voice file that cannot be used: missing, damaged, or of a format this Parley does not read.
    Cloning the voice again from its recording makes a new one."""


class VoiceNameError(ParleyError, ValueError):
    """A saved voice's name that cannot be used as given: empty, too long, holding control characters, taken by
    another saved voice, or naming none. The message lists the saved voices where that helps."""


class AudioDeviceError(ParleyError):
    """An audio device is missing, busy, or was lost."""


class AudioDeviceLostError(AudioDeviceError):
    """A device that was working stopped (unplugged, or the sound server quit). kind is "output" (the
    speakers) or "input" (the microphone); the voice loop opens it again by itself once it is back. lost says
    which device and why, without what the rest of the message says (for a window that says that itself)."""

    def __init__(self, message: str, kind: str, lost: str = ""):
        super().__init__(message)
        self.kind = kind
        self.lost = lost or message


class MicrophoneSilentError(AudioDeviceLostError):
    """The microphone delivers nothing but digital silence (exact zeros), which no working one does: the
    system denies access without saying so (macOS does), or the input is muted. The stream still runs,
    so the voice loop keeps listening and says when sound comes back."""

    def __init__(self, message: str):
        super().__init__(message, "input")


class MicrophoneAccessError(AudioDeviceError):
    """This user may not record: the system's privacy settings or the device's permissions deny it.
    The message says how to allow it on this system; typed turns still work."""


class HistoryError(ParleyError):
    """The conversation history database cannot be read or written (locked, disk full, corrupt)."""


class SpeechServerError(ParleyError):
    """The speech server the settings name (engine/speech_client.py) cannot speak: unreachable, refusing the token,
    busy, not a Parley speech server, or gone mid-sentence. The message names its address and what to do; the next
    turn asks it again."""


class FeatureUnavailableError(ParleyError):
    """An optional part of Parley cannot run (its model is not installed); the message says what Parley does
    instead and how to get the part. Reported as a notice: the conversation goes on."""


class GPUUnavailableError(ParleyError):
    """The GPU cannot run a model (there is none, or it ran out of memory); the message says what Parley
    does instead (the CPU). Reported as a notice: the conversation goes on."""


def user_message(error: BaseException) -> str:
    """What to tell the user of an error: a ParleyError's own message, else that Parley itself failed (and how)."""
    if isinstance(error, ParleyError):
        return str(error)
    return f"something went wrong inside Parley ({type(error).__name__}: {error}); the conversation goes on"
