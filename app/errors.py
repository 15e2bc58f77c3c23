"""Readable errors: an engine exception becomes a Problem (a headline, what happened, what to do, and
the page that fixes it), shown by ErrorDialog or the notice bar. The window makes them from the engine's events.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.errors import (AudioDeviceError, AudioDeviceLostError, FeatureUnavailableError, GPUUnavailableError,
                           HistoryError, InputTextError, MicrophoneAccessError, MicrophoneSilentError, ModelFilesError,
                           ModelMissingError, ParleyError, ReferenceAudioError, VoiceNameError)

ACTIONS = {"models": "Open Models…", "settings": "Open Settings…"}


@dataclass(frozen=True)
class Problem:
    """Something the user should know about, in their words.

    headline: one short sentence ("The speech model is missing").
    detail: what happened, usually the engine's own message (it names the file, device or value).
    advice: one line of what to do next in Parley; empty where the detail already says all there is to do.
    action: the window page that fixes it: "models", "settings", or None.
    """

    headline: str
    detail: str
    advice: str
    action: str | None = None

    def __post_init__(self):
        if self.action is not None and self.action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)} or None; got {self.action!r}")

    def html(self, headline: bool = True) -> str:
        """The problem as Qt rich text, each part shown as written: an engine message may hold '<' (a command's
        placeholder), '&' or line breaks, which rich text would otherwise swallow or join."""
        parts = [f"<b>{_html(self.headline)}</b>"] if headline else []
        parts += [_html(part) for part in (self.detail, self.advice) if part]
        return "<p>" + "<br>".join(parts) + "</p>"


def _html(text: str) -> str:
    return html.escape(text).replace("\n", "<br>")


def _out_of_memory(error: BaseException) -> bool:
    # torch.OutOfMemoryError is matched by name: this module must not import torch
    return isinstance(error, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(error).__mro__)


def problem_for(error: BaseException, doing: str) -> Problem:
    """The Problem to show for an exception raised while `doing` something.

    Args:
        error: what the engine raised.
        doing: what was under way, for the headline: "loading the speech model", "this turn", ...
    """
    detail = str(error) or type(error).__name__
    detail = detail[:1].upper() + detail[1:]  # the engine's messages begin in lower case, to follow a colon
    if _out_of_memory(error):
        return Problem(f"Out of memory while {doing}", detail,
                       "Close other programs, or choose a smaller model or the CPU in Settings.", "settings")
    if isinstance(error, ModelMissingError):
        return Problem(f"A model is missing ({doing})", detail, "Choose or download the model on the Models page.",
                       "models")
    if isinstance(error, ModelFilesError):
        return Problem(f"A model cannot be read ({doing})", detail,
                       "Download it again or choose another on the Models page.", "models")
    if isinstance(error, MicrophoneSilentError):  # a notice: the loop says when sound comes
        # the engine's message already says how to allow access or unmute: the advice adds only Parley's part
        return Problem("The microphone hears nothing", detail, "To use another microphone, choose it in Settings.",
                       "settings")
    if isinstance(error, AudioDeviceLostError):  # a notice, not a dialog: Parley opens it again by itself
        lost = error.lost[:1].upper() + error.lost[1:] + "."  # the headline and advice say the rest
        if error.kind == "output":
            return Problem("The speakers were disconnected", lost,
                           "Parley carries on by itself once they are back; replies still show here.")
        return Problem("The microphone was disconnected", lost,
                       "Parley listens again by itself once it is back; typing still works.")
    if isinstance(error, MicrophoneAccessError):
        # the fix is in the system's settings, which the engine's message names
        return Problem("Access to the microphone is denied", detail, "")
    if isinstance(error, AudioDeviceError):
        return Problem(f"A sound device is not working ({doing})", detail,
                       "Connect the device, or choose another one in Settings.", "settings")
    if isinstance(error, HistoryError):
        return Problem("The conversation history cannot be saved", detail,
                       "The conversation goes on, and is saved as soon as the file can be written.")
    if isinstance(error, FeatureUnavailableError):
        return Problem("Parley runs without one of its parts", detail,
                       "The conversation goes on; the message says how to get the part back.")
    if isinstance(error, GPUUnavailableError):
        return Problem("The GPU is not available; Parley is using the CPU", detail,
                       "Replies may be slower; the conversation goes on. Close other programs using the GPU, "
                       "or choose the CPU in Settings to stop this message.", "settings")
    if isinstance(error, InputTextError):
        return Problem("Parley cannot use that", detail, "Change the text or the voice and try again.")
    if isinstance(error, ParleyError):
        return Problem(f"Something went wrong while {doing}", detail, "Check the settings and try again.", "settings")
    return Problem(f"Something went wrong while {doing}", f"{type(error).__name__}: {detail}",
                   "Try again; if it keeps happening, restart Parley.")


def voice_off(error: BaseException, doing: str) -> Problem:
    """The Problem for speech recognition or a microphone that could not be opened (VoiceInputOff): typing works."""
    problem = problem_for(error, doing)
    return replace(problem, headline="Voice input is off: " + problem.headline[0].lower() + problem.headline[1:],
                   advice=" ".join(filter(None, ("You can still type to Parley.", problem.advice))))


def unknown_voice(speaker: str, speakers: tuple[str, ...], used: str) -> Problem:
    """The Problem for a configured speaker the speech model has no voice of (VoiceNotFound)."""
    return Problem("This speech model has no voice of that name",
                   f"{speaker!r} is not one of its voices ({', '.join(speakers)}); Parley speaks as {used!r}.",
                   "Choose a voice in Settings.", action="settings")


def saved_voice_off(name: str, message: str, error: BaseException) -> Problem:
    """The Problem for a saved voice the settings choose that cannot be spoken (SavedVoiceUnavailable): Parley speaks
    as the speaker instead; the engine's message says why. A missing Base model is fixed on the Models page."""
    detail = message[:1].upper() + message[1:]
    if isinstance(error, ModelFilesError):
        return Problem(f"Parley cannot speak in your voice “{name}”", detail,
                       "Download the voice-cloning model on the Models page.", "models")
    return Problem(f"Parley cannot speak in your voice “{name}”", detail, "Choose another voice in Settings.",
                   "settings")


def clone_failed(error: BaseException) -> Problem:
    """The Problem for a voice that could not be cloned (VoiceCloned.error), said in the New-voice dialog, which keeps
    what the user entered: so the advice is what to change there, or the page that fixes a missing model."""
    detail = str(error) or type(error).__name__
    detail = detail[:1].upper() + detail[1:]
    if isinstance(error, ModelMissingError):
        return Problem("The voice-cloning model is not on this computer", detail,
                       "Download it on the Models page (Qwen3-TTS 0.6B Base), then save again.", "models")
    if isinstance(error, ModelFilesError):
        return Problem("The voice-cloning model cannot be used", detail,
                       "Download it again or choose another on the Models page, then save again.", "models")
    if isinstance(error, ReferenceAudioError):
        return Problem("This recording cannot be used", detail, "Record again, or choose another recording.")
    if isinstance(error, VoiceNameError):
        return Problem("Choose another name", detail, "")
    if isinstance(error, InputTextError):
        return Problem("The voice needs what the recording says", detail,
                       "Type what it says, or clone from the sound alone.")
    return problem_for(error, "making the voice")


def erase_failed(error: HistoryError) -> Problem:
    """The Problem for a "Delete all history" that failed; the engine's message says what is still there."""
    return Problem("The history could not be erased", str(error),
                   "Close other Parley windows or programs using the file, then delete all history again.")


class ErrorDialog(QMessageBox):
    """A Problem as a message box: the headline, what happened and what to do, and a button to the
    page that fixes it. Opened with open() (window-modal, never blocking the event loop).

    Signals:
        action_chosen(str): the user pressed the action button; carries Problem.action.
    """

    action_chosen = Signal(str)

    def __init__(self, problem: Problem, parent: QWidget | None = None):
        super().__init__(parent)
        self.problem = problem
        self.setObjectName("errorDialog")
        self.setIcon(QMessageBox.Icon.Warning)
        self.setWindowTitle("Parley")
        self.setText(problem.headline)
        self.setInformativeText(problem.html(headline=False))
        self.action_button = None
        if problem.action is not None:
            self.action_button = self.addButton(ACTIONS[problem.action], QMessageBox.ButtonRole.AcceptRole)
            self.action_button.clicked.connect(lambda: self.action_chosen.emit(problem.action))
        close = self.addButton(QMessageBox.StandardButton.Close)
        self.setDefaultButton(self.action_button or close)
