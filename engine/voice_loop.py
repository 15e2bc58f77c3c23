"""The live conversation: spoken and typed turns, one at a time, through a Dialogue, and what it does as events.

Three jobs on threads of their own (the map is in docs/ARCHITECTURE.md): the Listener (engine/listening.py) turns the
microphone into utterances, speech starts and the input level; TranscribingAhead (engine/transcribing.py)
transcribes an utterance while its end-of-turn silence runs out, and the utterance so far for the live transcript;
the turn worker here runs each queued turn (an utterance, typed text, text to speak as it is) through the Dialogue
(engine/dialogue.py). Speech that starts while Parley talks stops it at once (barge-in) and becomes the next turn.
When the user pauses and the early transcript is ready before the turn is sure, the worker starts the LLM's reply
to it (an early reply, generated between checks of the queue): the turn takes it if the pause ends the turn, and it
is dropped, unheard and unsaved, if the user goes on.
The loop keeps the one state the user sees (StateChanged) and delivers every event of engine/events.py to its
subscribers, on its own threads.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.dialogue import Dialogue, TurnResult
from engine.errors import AudioDeviceError, InputTextError, ParleyError, user_message
from engine.events import (BargeIn, DeviceLost, DeviceRestored, Heard, Notice, ReplyText, SpeakingClause,
                           StateChanged, TurnFailed, TurnFinished)
from engine.listening import Listener, Mode, VoiceOptions
from engine.stt.vad import SileroVad
from engine.subscribers import Subscribers
from engine.transcribing import TranscribingAhead

if TYPE_CHECKING:
    from engine.llm.chat import Reply
    from engine.stt.whisper import Transcript
    from engine.tts.clone import ClonedVoice

log = logging.getLogger(__name__)

__all__ = ["VoiceLoop"]

SWITCH_INTERVAL_S = 0.001  # the longest a thread of the loop waits for Python's lock while another runs Python


# The turns the worker runs, queued by the loop's callers and the Listener
@dataclass(frozen=True)
class _Typed:
    """A typed turn: the LLM answers `text` aloud."""

    text: str


@dataclass(frozen=True)
class _SpeakOnly:
    """Text to speak as it is."""

    text: str


@dataclass(frozen=True)
class _Preview:
    """A voice's sample, from the settings: no turn, nothing saved. voice: a cloned voice, spoken instead of speaker."""

    speaker: str | None
    text: str
    voice: ClonedVoice | None = None


@dataclass(frozen=True)
class _Spoken:
    """An utterance the Listener heard."""

    audio: np.ndarray  # 16 kHz mono float32
    speech_end: float  # perf_counter() of the block holding the last speech
    turn_end: float  # perf_counter() when the end of the turn was decided
    key: tuple[int, int]  # its (start_sample, end_sample) in the stream: the key of its early transcript


@dataclass(frozen=True)
class _Provisional:
    """The early transcript of the turn `key`, which the user's pause may still end: begin its reply."""

    key: tuple[int, int]
    text: str


@dataclass(frozen=True)
class _EarlyReply:
    """A reply begun on a provisional end of turn, and that turn's key."""

    key: tuple[int, int]
    reply: Reply


class VoiceLoop:
    """A spoken (and typed) conversation running on its own threads over a Dialogue and a Microphone.

        loop = VoiceLoop(dialogue, microphone, options=VoiceOptions(mode=Mode.HANDS_FREE))
        unsubscribe = loop.subscribe(print)   # events, on the loop's threads
        loop.start()
        loop.submit_text("hello")             # a typed turn, queued behind any running one
        loop.close()                          # stops the turn, joins the threads; idempotent

    The loop owns neither the Dialogue nor the Microphone: close them after close().

    Args:
        dialogue: runs the turns; its player speaks, its transcriber hears.
        microphone: 16 kHz blocks (engine/audio Microphone); None for typed turns only.
        options: VoiceOptions() when None.
        vad: the Silero model for the Endpointer; loaded from faster-whisper when None.
        turn_model: the end-of-turn model (engine/stt/turn.py TurnModel) for hands-free turns, or None: a pause of
            options.vad.silence_ms alone ends a turn.
        text_model: with turn_model, the reader of the pause's words (engine/stt/turn_text.py TextTurnModel), or
            None.
    Raises:
        ModelFilesError: the Silero VAD model is missing (only with a microphone).
    """

    def __init__(self, dialogue: Dialogue, microphone=None, options: VoiceOptions | None = None, *,
                 vad: SileroVad | None = None, turn_model=None, text_model=None):
        self.dialogue, self.microphone = dialogue, microphone
        self.options = opts = options or VoiceOptions()
        self._subscribers: Subscribers[object] = Subscribers("voice-loop")
        self._closing = threading.Event()
        self._ahead = None
        self._listener = None
        if microphone is not None:
            if dialogue.transcriber is not None:  # a partial transcript goes to the Listener, which knows if it is late
                self._ahead = TranscribingAhead(dialogue.transcriber, opts.partials, self._closing,
                                                on_partial=lambda *partial: self._listener.partial(*partial),
                                                on_early=self._early_transcript)
            self._listener = Listener(microphone, opts, self, self._closing, self._ahead, vad, turn_model,
                                      text_model)
        self._mode = opts.mode
        self._lock = threading.RLock()  # guards the state below; StateChanged is emitted under it, in order
        self._state: str | None = None  # the last state announced; the first, at start(), is always announced
        self._running = False  # between start() and close()
        self._closed = False
        self._hearing = False  # an utterance is being collected
        self._phase: str | None = None  # "thinking" or "speaking" while the worker runs a turn
        self._pressed = False
        self._muted = False
        self._mic_lost = False
        self._speakers_lost = False  # DeviceLost("output") was emitted; only the turn worker touches it
        self._stop_turn = False  # a barge-in came for the turn now running (or about to)
        self._provisional: tuple[int, int] | None = None  # the turn the user's pause may end (Owner.provisional)
        self._early: _EarlyReply | None = None  # set by the worker, cancelled by provisional()
        self._reading = dialogue.chat is not None  # the worker reads the next prompt ahead while idle (_read_ahead)
        # _Typed, _SpeakOnly, _Spoken or _Provisional; None ends the worker
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._echo = None  # the EchoCanceller between the player and the microphone while the loop runs

    # -- events and state -------------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[object], None]) -> Callable[[], None]:
        """Call `callback(event)` for each event from now on (on the loop's threads); returns the unsubscriber.

        A callback that raises is logged; the others still run.
        """
        return self._subscribers.subscribe(callback)

    def emit(self, event) -> None:
        """Deliver `event` to the subscribers (the Listener's way to report, too)."""
        self._subscribers.emit(event)

    @property
    def state(self) -> str:
        """The last state announced by StateChanged (one of engine.events.STATES); "idle" before start()."""
        return self._state or "idle"

    @property
    def turn_running(self) -> bool:
        """Whether the worker is running a turn (for the Listener: speech now may be a barge-in)."""
        return self._phase is not None

    def update(self, **changes) -> None:
        """Apply state changes (hearing=, phase=, pressed=, ...) and announce the new state if it moved."""
        with self._lock:
            for name, value in changes.items():
                setattr(self, "_" + name, value)
            if not self._running:
                state = "idle"
            elif self._hearing:
                state = "hearing"
            elif self._phase is not None:
                state = self._phase
            elif self._muted:
                state = "muted"
            elif self.microphone is None or self._mic_lost:
                state = "idle"
            elif self._mode is Mode.HANDS_FREE or self._pressed:
                state = "listening"
            else:
                state = "idle"
            if state != self._state:
                self._state = state
                self.emit(StateChanged(state))

    # -- control, from any thread -----------------------------------------------------------------------------

    def start(self) -> None:
        """Starts listening (with a microphone) and the turn worker.

        Raises:
            RuntimeError: already started, or closed.
        """
        with self._lock:
            if self._running or self._closed:
                raise RuntimeError("this VoiceLoop was already started; make a new one after close()")
            self._running = True
        self._threads = [threading.Thread(target=self._work, name="parley-turns", daemon=True)]
        if self._listener is not None:
            self._threads.append(threading.Thread(target=self._listener.run, name="parley-listen", daemon=True))
        if self._ahead is not None:
            self._threads += self._ahead.threads
        # the loop's threads pass Python's lock (the GIL) back and forth all through a turn, and a model's call takes
        # it back after each step that released it, each time waiting up to the switch interval: at Python's 5 ms the
        # end-of-turn model takes six times as long beside a busy thread as alone, at 1 ms twice (docs/BENCHMARKS.md)
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        if self.microphone is not None and self.options.echo_cancellation:
            from engine.audio.echo import EchoCanceller

            self._echo = EchoCanceller()
            self.dialogue.player.echo = self.microphone.echo = self._echo
        for thread in self._threads:
            thread.start()
        self.update()

    def close(self) -> None:
        """Stops the running turn, drops queued ones and joins the loop's threads. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        self.dialogue.stop()
        self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        if self._echo is not None:
            self.dialogue.player.echo = self.microphone.echo = self._echo = None
        self.update(running=False, hearing=False, phase=None)

    def __enter__(self) -> VoiceLoop:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit_text(self, text: str, speak_only: bool = False) -> None:
        """Queues a typed turn (the LLM answers it aloud), or with speak_only=True text to speak as it is.

        It runs after the turns queued before it; its errors (empty text, ...) come as TurnFailed.
        """
        self._jobs.put(_SpeakOnly(text) if speak_only else _Typed(text))

    def preview(self, speaker: str | None, text: str, voice: ClonedVoice | None = None) -> None:
        """Queues `text` in the voice `speaker`, or in the cloned voice `voice` (Dialogue.preview): after the turns
        queued before it, and no turn of its own (no TurnFinished, nothing saved); stop() cuts it short, and a failure
        is a Notice."""
        self._jobs.put(_Preview(speaker, text, voice))

    def transcribe(self, audio_16k: np.ndarray) -> Transcript:
        """`audio_16k` ((n,) float32 at 16 kHz) transcribed by the dialogue's Whisper, taking turns with the loop's own
        transcriptions (Whisper is not thread-safe): for speech that is no turn, a recording to clone a voice from.

        Raises:
            ParleyError: the dialogue has no Transcriber (speech recognition is off).
        """
        transcriber = self.dialogue.transcriber
        if transcriber is None:
            raise ParleyError("speech recognition is off, so nothing can be transcribed")
        with self._ahead.whisper if self._ahead is not None else contextlib.nullcontext():
            return transcriber.transcribe(audio_16k)

    def stop(self) -> None:
        """Interrupts the running turn at once (playback, TTS and LLM); a BargeIn event if one was running."""
        self.barge_in()

    def press(self) -> None:
        """Push-to-talk key down: what is said from now (and vad.pre_roll_ms before) forms the turn; stops
        Parley's speech. Ignored (with a logged warning) when hands-free or without a microphone."""
        if self._usable_keys("press"):
            self.barge_in()
            self._listener.press()

    def release(self) -> None:
        """Push-to-talk key up: the speech since press() becomes the next turn (nothing if none was heard)."""
        if self._usable_keys("release"):
            self._listener.release(time.perf_counter())

    def _usable_keys(self, what: str) -> bool:
        if self.microphone is None:
            log.warning("%s() ignored: this VoiceLoop has no microphone", what)
            return False
        if self._mode is not Mode.PUSH_TO_TALK:
            log.warning("%s() ignored: the loop is hands-free; set_mode(Mode.PUSH_TO_TALK) first", what)
            return False
        return True

    def set_mode(self, mode: Mode | str) -> None:
        """Switches between hands-free and push-to-talk; an utterance being collected is dropped.

        Raises:
            ValueError: not a Mode (or its value).
        """
        mode = VoiceOptions(mode=mode).mode  # the same check and message as the options
        if self._listener is not None:
            self._listener.set_mode(mode)
        self.update(mode=mode, pressed=False)

    @property
    def muted(self) -> bool:
        """Microphone mute: while True the microphone delivers silence (a turn being spoken ends as on a pause)."""
        return self._muted

    @muted.setter
    def muted(self, value: bool) -> None:
        if self.microphone is not None:
            self.microphone.mute = bool(value)
        self.update(muted=bool(value))

    def barge_in(self) -> None:
        """Stop the running turn (the user spoke or pressed the key over it, or stop()): BargeIn if one ran."""
        with self._lock:
            running = self._phase is not None
            # Dialogue.stop() is a no-op until the Dialogue has begun the turn: the turn's events repeat it
            self._stop_turn = running
        if running:
            self.dialogue.stop()
            self.emit(BargeIn())

    def turn_heard(self, audio: np.ndarray, speech_end: float, turn_end: float, key: tuple[int, int]) -> None:
        """The Listener heard an utterance: the next turn."""
        with self._lock:  # from hearing straight to thinking: the worker takes the turn at once when idle
            self._provisional = None
            self._jobs.put(_Spoken(audio, speech_end, turn_end, key))
            self.update(hearing=False, phase=self._phase or "thinking")

    def provisional(self, key: tuple[int, int] | None) -> None:
        """The Listener saw a pause that may end the turn `key`, or (None) speech again: a reply begun for another
        turn stops generating at once."""
        with self._lock:
            self._provisional = key
            if self._early is not None and self._early.key != key:
                self._early.reply.cancel()

    def _early_transcript(self, key: tuple[int, int], transcript) -> None:
        """TranscribingAhead made the early transcript of `key`: the worker may begin its reply."""
        with self._lock:
            if self.options.early_reply and key == self._provisional and transcript.text.strip():
                self._jobs.put(_Provisional(key, transcript.text))

    # -- the turn worker ----------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._next_job()
            if job is None or self._closing.is_set():
                self._take_early(None)
                return
            if isinstance(job, _Provisional):
                self._begin_early(job)
                continue
            if isinstance(job, _Preview):
                self._preview(job)
                continue
            reply = self._take_early(job)
            self.update(phase="thinking")
            try:
                result = self._run(job, reply)
            except Exception as e:  # a stage failed; the Dialogue has saved what was said and heard
                if not isinstance(e, ParleyError):
                    log.exception("a turn failed")
                self.emit(TurnFailed(user_message(e), e))
            else:
                self.emit(TurnFinished(result))
            finally:
                with self._lock:
                    self._stop_turn = False
                    self.update(phase=None)
            self._check_speakers()  # a turn that lost them announces it at once

    def _preview(self, job: _Preview) -> None:
        self.update(phase="speaking")
        try:
            self.dialogue.preview(job.speaker, job.text, job.voice)
        except ParleyError as e:
            self.emit(Notice(user_message(e), e, "playing the voice's sample"))
        finally:
            self.update(phase=None)

    def _next_job(self):
        """The next job; while none is queued, the early reply's tokens are generated one by one, or else the next
        reply's prompt is read into the LLM's cache a little at a time (ChatModel.read_ahead)."""
        while True:
            early = self._early
            working = self._ahead_one(early.reply) if early is not None else self._read_ahead()
            try:
                job = self._jobs.get(block=not working, timeout=self.options.device_retry_ms / 1000)
            except queue.Empty:
                if not working:
                    self._check_speakers()
                continue
            self._reading = not isinstance(job, _Preview)  # a turn changes the history: its end is read next
            return job

    def _read_ahead(self) -> bool:
        if not self._reading:
            return False
        try:
            self._reading = self.dialogue.chat.read_ahead()
        except Exception:  # the next reply reads what is left, and reports what fails
            log.exception("reading the next prompt ahead failed")
            self._reading = False
        return self._reading

    @staticmethod
    def _ahead_one(reply: Reply) -> bool:
        try:
            return reply.ahead()
        except Exception:  # the turn, if it comes, will ask the LLM again and report what fails
            log.exception("an early reply failed")
            reply.cancel()
            return False

    def _begin_early(self, job: _Provisional) -> None:
        """Begins the reply to a provisional turn's text, unless the user went on or the turn came already."""
        self._take_early(None)
        with self._lock:  # under the lock that provisional() takes: a cancel cannot slip in between
            if job.key != self._provisional:
                return
            try:
                self._early = _EarlyReply(job.key, self.dialogue.early_reply(job.text))
            except InputTextError as e:  # too long for the LLM: the turn itself will say so
                log.info("no early reply: %s", e)

    def _take_early(self, job) -> Reply | None:
        """The early reply that answers `job`, or None; any other is discarded (nothing of it was heard or saved)."""
        with self._lock:
            early, self._early = self._early, None
        if early is None:
            return None
        if isinstance(job, _Spoken) and job.key == early.key and not early.reply.cancel_event.is_set():
            return early.reply
        early.reply.discard()
        log.info("dropped the early reply to %r: the user went on, or another turn came first", early.reply.user_text)
        return None

    def _check_speakers(self) -> None:
        """Announces speakers that were lost (DeviceLost) and, on each later call while they are, opens
        them again (DeviceRestored once that works). On the turn worker, between turns."""
        player = self.dialogue.player
        error = player.lost
        if error is None:
            return
        if not self._speakers_lost:
            self._speakers_lost = True
            self.emit(DeviceLost("output", str(error), error))
            return
        try:
            player.reopen()
        except AudioDeviceError:
            return
        self._speakers_lost = False
        self.emit(DeviceRestored("output", f"the speakers are back: output device {player.device.name!r}"))

    def _run(self, job, reply: Reply | None) -> TurnResult:
        match job:
            case _Typed(text):
                return self.dialogue.text_turn(text, self._turn_event)
            case _SpeakOnly(text):
                return self.dialogue.say(text, self._turn_event)
        # a spoken turn: Whisper is the turn's until it has heard it, unless its text was made early
        transcript = self._ahead.early_transcript(job.key) if self._ahead is not None else None
        whisper = self._ahead.whisper if self._ahead is not None and transcript is None else None
        if whisper is not None:
            whisper.acquire()

        def event(e) -> None:
            nonlocal whisper
            if isinstance(e, Heard) and whisper is not None:
                whisper.release()
                whisper = None
            self._turn_event(e)

        try:
            return self.dialogue.voice_turn(job.audio, job.speech_end, event, turn_end=job.turn_end,
                                            transcript=transcript, reply=reply)
        finally:
            if whisper is not None:
                whisper.release()

    def _turn_event(self, event) -> None:
        """An event of the running turn: the state follows it, and a barge-in that came before the Dialogue had begun
        the turn is repeated once the turn is under way."""
        if isinstance(event, (Heard, ReplyText)) and self._stop_turn:
            self.dialogue.stop()
        if isinstance(event, SpeakingClause) and event.index == 0:
            with self._lock:
                if self._phase is not None:
                    self.update(phase="speaking")
        self.emit(event)
