"""The one worker that owns the engine: it holds the Assistant (engine/assistant.py), runs the window's requests on
it, and relays its events (engine/events.py) to the window as one Qt signal.

The window moves an EngineWorker into a QThread and talks to it only through signals; loading runs in
that thread, so the window opens first and never freezes. The engine (and torch) is imported there,
on first load, never at the window's start-up.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from engine.settings import AssistantConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CloneRequest:
    """A voice to clone and save (the New-voice dialog's): its name, the recording (a file, or (n,) float32 samples
    and their rate), what it says ("" for Whisper to hear it), and the mode, "icl" or "x_vector" (engine/tts/clone.py).
    cancelled: set by the window when the user gives up; a voice finished after that is not kept."""

    name: str
    audio: object
    sample_rate_hz: int | None
    text: str
    mode: str
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False)


class EngineWorker(QObject):
    """Owns the Assistant; lives in its own QThread. Slots are the window's requests.

    Signals:
        event(object): each of the assistant's events (engine/events.py), in order, from the worker's thread and
            the conversation's; LoadFailed after a failed load (nothing runs until load() is asked again).
        closed(): shutdown() finished; everything is closed.
    """

    event = Signal(object)
    closed = Signal()

    def __init__(self):
        super().__init__()  # no parent, so it can move to its thread
        self._assistant = None

    @Slot(object)
    def load(self, config: AssistantConfig) -> None:
        """Close what is open, then load everything `config` names (Loading events, then Ready or LoadFailed)."""
        from engine.assistant import Assistant

        self._close()
        assistant = Assistant(config, subscribe=self.event.emit)
        try:
            assistant.load()
        except Exception:  # LoadFailed told the window
            return
        self._assistant = assistant

    @Slot(object)
    def apply(self, config: AssistantConfig) -> None:
        """New settings: the voice, listening and prompt apply at once; new models or devices reload."""
        if self._assistant is None:
            self.load(config)
            return
        try:
            self._assistant.apply(config)
        except Exception:  # a reload that failed: LoadFailed told the window, and nothing runs
            self._assistant = None

    # -- the conversation: the window's requests -------------------------------------------------------

    @Slot(str)
    def send(self, text: str) -> None:
        """A typed turn: the LLM answers and the reply is spoken."""
        self._assistant.send(text)

    @Slot(str)
    def speak(self, text: str) -> None:
        """Speak `text` as it is, without the LLM."""
        self._assistant.speak(text)

    @Slot(str)
    def preview_voice(self, speaker: str) -> None:
        """A short sample of a voice, from the settings."""
        self._assistant.preview_voice(speaker)

    @Slot(str)
    def preview_saved_voice(self, name: str) -> None:
        """A short sample of a saved voice, from the settings (heard only while the Base model speaks)."""
        self._assistant.preview_saved_voice(name)

    @Slot()
    def press(self) -> None:
        """Push-to-talk key down."""
        self._assistant.press()

    @Slot()
    def release(self) -> None:
        """Push-to-talk key up: what was said becomes a turn."""
        self._assistant.release()

    @Slot()
    def stop(self) -> None:
        """Interrupt the speech at once."""
        self._assistant.stop()

    @Slot(bool)
    def set_muted(self, muted: bool) -> None:
        self._assistant.muted = muted

    @Slot(str)
    def set_mode(self, listen_mode: str) -> None:
        """"hands-free" or "push-to-talk"."""
        self._assistant.set_mode(listen_mode)

    @Slot(int)
    def open_conversation(self, conversation_id: int) -> None:
        """Carry on a saved conversation: the LLM sees its turns, new turns are saved to it."""
        self._assistant.open_conversation(conversation_id)

    @Slot()
    def new_conversation(self) -> None:
        """Start afresh: the LLM forgets, the next turn opens a new saved conversation."""
        self._assistant.new_conversation()

    @Slot(int)
    def conversation_deleted(self, conversation_id: int) -> None:
        """A conversation was deleted from the history: if it is the one under way, start afresh."""
        if self._assistant is not None:
            self._assistant.conversation_deleted(conversation_id)

    @Slot(object)
    def delete_history(self, path: Path) -> None:
        """Erase every conversation in the history file `path`, in place: through the assistant's own store where it
        has that file open (no connection is ever left on a deleted file), else directly (HistoryErased)."""
        from engine.errors import HistoryError
        from engine.events import HistoryErased
        from engine.history import erase_history

        assistant = self._assistant
        if assistant is not None and assistant.history.path == Path(path):
            assistant.erase_history()
            return
        try:
            erase_history(path)
        except HistoryError as e:
            self.event.emit(HistoryErased(e))
            return
        self.event.emit(HistoryErased(None))

    # -- saved voices ----------------------------------------------------------------------------------------

    @Slot(object, object)
    def clone_voice(self, request: CloneRequest, config: AssistantConfig) -> None:
        """Clone and save a voice (VoiceCloned): with the loaded assistant's models where one runs, else with an
        assistant of `config` that loads only what cloning needs (the Base model, and Whisper without a text). Takes
        seconds; the conversation's requests wait meanwhile."""
        from engine.assistant import Assistant
        from engine.events import VoiceCloned
        from engine.voice_library import VoiceLibrary

        assistant = self._assistant or Assistant(config)
        try:
            voice = assistant.clone_voice(request.name, request.audio, request.sample_rate_hz,
                                          text=request.text or None, mode=request.mode)
        except Exception as e:  # the dialog shows it and keeps what the user entered
            self.event.emit(VoiceCloned(request.name, None, e))
            return
        if request.cancelled.is_set():  # the dialog was closed meanwhile: the user did not want it after all
            VoiceLibrary().remove(voice.name)
            voice = None
        self.event.emit(VoiceCloned(request.name, voice))

    @Slot()
    def erase_saved_voices(self) -> None:
        """Delete every saved voice (SavedVoicesErased): through the assistant where one runs, so a saved voice that
        speaks gives way to the speaker; else the files directly."""
        from engine.events import SavedVoicesErased
        from engine.voice_library import VoiceLibrary

        try:
            count = (self._assistant.erase_saved_voices() if self._assistant is not None else
                     VoiceLibrary().erase_all())
        except OSError as e:
            self.event.emit(SavedVoicesErased(0, e))
            return
        self.event.emit(SavedVoicesErased(count))

    @Slot()
    def shutdown(self) -> None:
        """Close everything (joins the loop's threads); then closed()."""
        self._close()
        self.closed.emit()

    def _close(self) -> None:
        if self._assistant is not None:
            self._assistant.close()
            self._assistant = None
