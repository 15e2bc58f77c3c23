"""The listening side of the voice loop: the microphone's 16 kHz blocks in, on a thread of its own.

Each block goes to the Endpointer (engine/stt/vad.py: Silero VAD, hands-free or push-to-talk), whose events become
speech starts (through the barge-in gate while Parley talks) and finished utterances; beside them, the input level,
and a microphone that is lost, silent or back. The Listener reports to its VoiceLoop (engine/voice_loop.py) through
the calls of `Owner`, and offers the utterance for early and partial transcription (engine/transcribing.py).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.audio.devices import silence_error
from engine.errors import AudioDeviceError, AudioDeviceLostError, user_message
from engine.events import DeviceLost, DeviceRestored, Level, Partial, SpeechStarted, TurnFailed
from engine.stt.turn import Meaning, judge_words
from engine.stt.vad import BLOCK_SAMPLES, SAMPLE_RATE_HZ, Endpointer, Mode, SileroVad, SpeechStart, VadOptions

log = logging.getLogger(__name__)

__all__ = ["SILENT_DBFS", "Listener", "Mode", "Owner", "VadOptions", "VoiceOptions"]

SILENT_DBFS = -100.0  # the level reported for digital silence (a muted microphone), instead of -inf


@dataclass(frozen=True)
class VoiceOptions:
    """How the loop listens.

    mode: Mode.HANDS_FREE (the VAD ends a turn after vad.silence_ms) or Mode.PUSH_TO_TALK
        (press()/release() bound it); a mode's value ("hands-free") is taken too.
    vad: speech detection and end-of-turn (engine/stt/vad.py).
    barge_in: hands-free, speech that starts while a turn runs stops that turn.
    echo_cancellation: take Parley's own voice out of the microphone (engine/audio/echo.py, fed with
        what the dialogue's player plays), so open speakers do not make it interrupt itself. The
        canceller learns the room from Parley's first 3 s of speech: until then the barge-in gate
        measures against the echo before cancelling, as without it. A microphone that does not hear
        the speakers at all (a headset) it finds in Parley's first 4 s of speech, and from then on
        passes it through untouched.
    barge_in_ms: speech over a running turn must also be this long above the level gate below, out
        of any twice that long, before it stops the turn; speech that never is (residual echo) makes
        no turn either.
    barge_in_margin_db: the level gate: this far above the loudest block of the second before those
        (the residual echo while Parley talks, else the room's noise) ...
    barge_in_min_dbfs: ... and never below this level.
    partials: emit Partial transcripts while the user speaks (costs Whisper runs on the CPU).
    early_reply: hands-free, begin the LLM's reply in a pause that may end the turn, once its early transcript is
        ready (dropped if the user goes on); False: only once the turn has ended.
    partial_interval_ms: new audio between two partial transcripts.
    level_interval_ms: audio per Level event.
    device_retry_ms: how often a lost speaker or microphone is opened again (and, while all is well,
        how often the idle loop looks at the speakers); each try is one PortAudio open.
    silent_microphone_s: a microphone that delivers nothing but exact zeros this long is reported
        (DeviceLost with a MicrophoneSilentError): every working one hears some noise, while macOS gives
        an app it denies the microphone zeros, not an error, and so does a muted input.
    """

    mode: Mode = Mode.HANDS_FREE
    vad: VadOptions = VadOptions()
    barge_in: bool = True
    partials: bool = False
    early_reply: bool = True
    partial_interval_ms: int = 800
    level_interval_ms: int = 100
    device_retry_ms: int = 1000
    echo_cancellation: bool = True
    barge_in_ms: int = 250
    barge_in_margin_db: float = 6.0
    barge_in_min_dbfs: float = -50.0
    silent_microphone_s: float = 5.0

    def __post_init__(self):
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            choices = ", ".join(m.value for m in Mode)
            raise ValueError(f"unknown mode {self.mode!r}; choose one of: {choices}") from None
        for name in ("partial_interval_ms", "level_interval_ms", "device_retry_ms", "barge_in_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.silent_microphone_s > 0:
            raise ValueError(f"silent_microphone_s must be > 0, got {self.silent_microphone_s}")
        if not self.barge_in_margin_db >= 0:
            raise ValueError(f"barge_in_margin_db must be >= 0, got {self.barge_in_margin_db}")
        if not SILENT_DBFS <= self.barge_in_min_dbfs <= 0:
            raise ValueError(f"barge_in_min_dbfs must be between {SILENT_DBFS} and 0, got {self.barge_in_min_dbfs}")


class Owner(Protocol):
    """What the Listener asks of its VoiceLoop (each call from the listening thread)."""

    @property
    def turn_running(self) -> bool:
        """Whether a turn is running (so speech that starts may be a barge-in)."""

    def update(self, **changes) -> None:
        """The listening side's state changed: hearing=, pressed=, mic_lost= (the loop announces StateChanged)."""

    def emit(self, event) -> None:
        """Deliver an event to the loop's subscribers."""

    def barge_in(self) -> None:
        """The user started speaking over a running turn: stop it."""

    def turn_heard(self, audio: np.ndarray, speech_end: float, turn_end: float, key: tuple[int, int]) -> None:
        """A finished utterance: 16 kHz audio, when its speech ended and when the turn was decided (perf_counter),
        and its (start_sample, end_sample) in the stream (the key of its early transcript)."""

    def provisional(self, key: tuple[int, int] | None) -> None:
        """Hands-free, the user paused: if the pause lasts, the utterance is the turn `key` (start_sample,
        end_sample). None: they went on speaking, so that turn will not come."""


def blocks(ms: float) -> int:
    """Microphone blocks in `ms` milliseconds, at least one."""
    return max(1, round(ms * SAMPLE_RATE_HZ / 1000 / BLOCK_SAMPLES))


def rms_dbfs(pcm: np.ndarray) -> float:
    power = float(np.mean(np.square(pcm, dtype=np.float64))) if pcm.size else 0.0
    return max(10.0 * math.log10(power), SILENT_DBFS) if power > 0 else SILENT_DBFS


class _BargeInGate:
    """Whether speech the VAD found over a running turn is the user's: of the last 2 x
    options.barge_in_ms of blocks, options.barge_in_ms must be options.barge_in_margin_db above the
    loudest block of the second before them (and at least options.barge_in_min_dbfs). Speech dips between
    syllables; a residual echo rises no higher than it did the second before. While the canceller
    converges (its residual can be as loud as speech) the echo before cancelling sets that floor, as
    it would with no canceller."""

    def __init__(self, options: VoiceOptions):
        self._options = options
        self._needed = blocks(options.barge_in_ms)
        self.history_blocks = 2 * self._needed + blocks(1000)  # the levels check() looks at
        self.threshold_dbfs = options.barge_in_min_dbfs

    def check(self, levels: deque[tuple[float, float]], echo=None) -> bool:
        """levels: (t_captured, dBFS) of the blocks so far, the newest last (history_blocks of them
        suffice); echo: the EchoCanceller, whose echo before cancelling counts while it converges."""
        recent = [dbfs for _, dbfs in list(levels)[-2 * self._needed :]]
        before = list(levels)[-self.history_blocks : -2 * self._needed]
        floor = max((dbfs for _, dbfs in before), default=SILENT_DBFS)
        if echo is not None and before:
            floor = max(floor, echo.echo_dbfs(before[0][0] - BLOCK_SAMPLES / SAMPLE_RATE_HZ, before[-1][0]))
        self.threshold_dbfs = max(self._options.barge_in_min_dbfs, floor + self._options.barge_in_margin_db)
        return sum(dbfs >= self.threshold_dbfs for dbfs in recent) >= self._needed


# The listening thread's commands, from the loop's callers
@dataclass(frozen=True)
class _SetMode:
    mode: Mode


@dataclass(frozen=True)
class _Press:
    pass


@dataclass(frozen=True)
class _Release:
    t_released: float  # perf_counter() when the key went up: the end of the turn


class Listener:
    """The listening thread of one VoiceLoop (see the module docstring): run() until `closing` is set.

    Args:
        microphone: 16 kHz blocks (engine/audio Microphone); its `echo` canceller, while set, informs the gate.
        options: how to listen.
        owner: the loop it reports to.
        closing: set when the loop closes.
        ahead: early and partial transcription (engine/transcribing.py TranscribingAhead), or None (no Whisper).
        vad: the Silero model for the Endpointer; loaded from faster-whisper when None.
        turn_model: the end-of-turn model (engine/stt/turn.py TurnModel) the Endpointer asks after a short pause,
            or None: the pause alone ends a turn. Where the model says the user has finished, the turn ends once the
            pause's early transcript is made and its words do not trail off, and where it says the user goes on, words
            that end a sentence end the turn after VadOptions.sentence_ms (engine/stt/turn.py judge_words): that text
            is the turn's, which it would wait for anyway.
        text_model: reads the pause's words (engine/stt/turn_text.py TextTurnModel) where the end-of-turn model says
            the user goes on: words that end a sentence and read as a whole message end the turn at once, those that
            read as a finished statement after VadOptions.statement_ms, not after sentence_ms. None: only the voice
            and the pause decide.
    Raises:
        ModelFilesError: the Silero VAD model is missing.
    """

    def __init__(self, microphone, options: VoiceOptions, owner: Owner, closing: threading.Event, ahead=None,
                 vad: SileroVad | None = None, turn_model=None, text_model=None):
        self.microphone, self.options, self._owner, self._closing, self._ahead = (microphone, options, owner,
                                                                                  closing, ahead)
        words = self._words if ahead is not None else None
        self._text_model = text_model
        read = self._read if ahead is not None and text_model is not None else None
        self._endpointer = Endpointer(options.vad, options.mode, vad, turn_model, words, read)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # (stream sample where a block starts, its t_captured): places the end of speech in time
        self._captured: deque[tuple[int, float]] = deque(maxlen=blocks(options.vad.max_turn_s * 1000 + 2000))
        self._audio_lost = 0  # the microphone's overflows + dropped blocks at the last turn
        self._lock = threading.Lock()  # guards the two below, which the partials thread reads
        self._hearing = False  # an utterance is being collected
        self._utterance = 0  # counts utterances, so a late partial of an earlier one is dropped
        self._gating = False  # speech over a running turn has not passed the barge-in gate yet
        self._pause_end: int | None = None  # the ending_sample of the pause under way, told to owner and Whisper

    def _words(self, key: tuple[int, int]):
        """The Endpointer's judge of a pause's words: None until the early transcript of the turn `key` is made, then
        what its end says (Words). Its first ask comes before the end-of-turn model's, so the transcription is offered
        then: Whisper and the model work at once."""
        self._pause()
        transcript = self._ahead.made_early(key)
        return None if transcript is None else judge_words(transcript.text, transcript.language)

    def _read(self, key: tuple[int, int]) -> Meaning:
        """The Endpointer's reader of a pause's words, asked once they are judged to end a sentence: what they mean."""
        transcript = self._ahead.made_early(key)
        return Meaning.PART if transcript is None else self._text_model.read(transcript.text, transcript.language)

    def _pause(self) -> None:
        """Where the Endpointer's pause under way would end the turn, once it changes: to Whisper for the early
        transcript and to the owner (provisional); the owner hears None when the user goes on instead."""
        ep = self._endpointer
        end = ep.ending_sample
        if end == self._pause_end or self._gating:
            return
        if end is not None:
            turn = ep.ending_turn()
            if self._ahead is not None:
                self._ahead.offer_early(turn)
            self._owner.provisional((turn.start_sample, turn.end_sample))
        elif ep.in_turn:  # the pause ended in more speech
            self._owner.provisional(None)
        self._pause_end = end

    # -- commands, from any thread ---------------------------------------------------------------------------

    def set_mode(self, mode: Mode) -> None:
        """Hands-free or push-to-talk, from the next block; an utterance being collected is dropped."""
        self._commands.put(_SetMode(mode))

    def press(self) -> None:
        """Push-to-talk key down."""
        self._commands.put(_Press())

    def release(self, t_released: float) -> None:
        """Push-to-talk key up at perf_counter() `t_released`: what was said since press() becomes a turn."""
        self._commands.put(_Release(t_released))

    def partial(self, utterance: int, text: str) -> None:
        """A partial transcript of utterance number `utterance` (TranscribingAhead's callback): Partial, where it
        is of the utterance still being heard."""
        with self._lock:
            current = self._hearing and utterance == self._utterance
        if current:
            self._owner.emit(Partial(text))

    # -- the thread ------------------------------------------------------------------------------------------

    def run(self) -> None:
        ep, opts = self._endpointer, self.options
        level_blocks = blocks(opts.level_interval_ms)
        partial_blocks = blocks(opts.partial_interval_ms)
        recent: deque[tuple[int, np.ndarray]] = deque(maxlen=blocks(opts.vad.pre_roll_ms + opts.vad.min_speech_ms) + 1)
        utterance: list[np.ndarray] = []  # with partials: the utterance so far
        level: list[np.ndarray] = []
        gate = _BargeInGate(opts)
        levels: deque[tuple[float, float]] = deque(maxlen=gate.history_blocks)  # (t_captured, dBFS): what it measures
        silent = False  # the microphone's digital silence was reported (DeviceLost) and has not ended
        pos = 0
        try:
            while not self._closing.is_set():
                try:
                    self._run_commands()
                    block = self.microphone.read(0.1)
                except AudioDeviceLostError as e:
                    if not self._microphone_back(e):
                        return  # closed while it was lost
                    silent = False  # reopened, and DeviceRestored said so
                    continue
                if block is None:
                    continue
                self._captured.append((pos, block.t_captured))
                levels.append((block.t_captured, rms_dbfs(block.pcm)))
                pos += BLOCK_SAMPLES
                level.append(block.pcm)
                if len(level) >= level_blocks:
                    self._owner.emit(Level(rms_dbfs(np.concatenate(level))))
                    level.clear()
                    silent = self._check_silence(silent)
                if self._gating and gate.check(levels, self.microphone.echo):
                    self._gating = False
                    self._speech_started()
                for event in ep.feed(block.pcm):
                    if isinstance(event, SpeechStart):
                        if opts.partials:
                            utterance = [b for start, b in recent if start + BLOCK_SAMPLES > event.start_sample]
                        if self._owner.turn_running and ep.mode is Mode.HANDS_FREE and opts.barge_in:
                            self._gating = not gate.check(levels, self.microphone.echo)
                            if self._gating:
                                continue
                        self._speech_started()
                    elif self._gating:  # it never passed: Parley's own residual echo, or a murmur
                        log.info("speech over Parley's reply stayed below the barge-in gate (%.1f dBFS); ignored",
                                 gate.threshold_dbfs)
                        self._gating = False
                        utterance = []
                    else:  # decided now, the models' time included, not when the deciding block came in
                        self._heard(event, turn_end=time.perf_counter())
                        utterance = []
                self._pause()
                if opts.partials:
                    recent.append((pos - BLOCK_SAMPLES, block.pcm))
                    if self._hearing and ep.in_turn:
                        utterance.append(block.pcm)
                        # in a pause the early transcription runs: a partial then would only delay the turn's
                        paused = ep.ending_sample is not None
                        if len(utterance) % partial_blocks == 0 and self._ahead is not None and not paused:
                            self._ahead.offer_partial(self._utterance, np.concatenate(utterance))
        except AudioDeviceError as e:  # the microphone cannot be used: typed turns still work
            self._set(mic_lost=True, hearing=False)
            self._owner.emit(TurnFailed(str(e), e))
        except Exception as e:
            log.exception("the listening thread failed")
            self._set(mic_lost=True, hearing=False)
            self._owner.emit(TurnFailed(user_message(e), e))

    def _set(self, **changes) -> None:
        """Tell the owner of state changes, keeping the one the partials read."""
        if "hearing" in changes:
            with self._lock:
                self._hearing = changes["hearing"]
        self._owner.update(**changes)

    def _run_commands(self) -> None:
        ep = self._endpointer
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            match command:
                case _SetMode(mode):
                    ep.flush()  # a half-collected utterance of the old mode is dropped
                    ep.mode = mode
                    self._set(hearing=False, pressed=False)
                case _ if ep.mode is not Mode.PUSH_TO_TALK:
                    continue  # a key queued before the mode changed
                case _Press():
                    ep.press()
                    self._set(pressed=True)
                case _Release(t_released):
                    turn = ep.release()
                    if turn is not None:
                        self._heard(turn, turn_end=t_released)
                    self._set(pressed=False, hearing=False)

    def _speech_started(self) -> None:
        with self._lock:
            self._utterance += 1
        self._set(hearing=True)
        self._owner.emit(SpeechStarted())
        if self._endpointer.mode is Mode.HANDS_FREE and self.options.barge_in:
            self._owner.barge_in()

    def _heard(self, turn, turn_end: float) -> None:
        """An Endpointer Turn, to the owner with when its speech ended."""
        self._check_audio_lost()
        # the last speech sample: the turn's end less its tail (a max-length turn was cut mid-speech)
        tail = round(self.options.vad.tail_ms * SAMPLE_RATE_HZ / 1000)
        last = turn.end_sample if turn.reason == "max-length" else max(turn.start_sample, turn.end_sample - tail)
        speech_end = next((t for start, t in reversed(self._captured) if start <= last), turn_end)
        with self._lock:
            self._hearing = False
        self._owner.turn_heard(turn.audio, min(speech_end, turn_end), turn_end, (turn.start_sample, turn.end_sample))

    def _microphone_back(self, error: AudioDeviceLostError) -> bool:
        """The microphone was lost: what was being said becomes a turn, and the microphone is opened again
        every options.device_retry_ms. True once it works again, False when the loop closes first."""
        turn = self._endpointer.flush(reason="device-lost")
        if turn is not None:
            self._heard(turn, turn_end=time.perf_counter())
        self._set(mic_lost=True, hearing=False, pressed=False)
        self._owner.emit(DeviceLost("input", str(error), error))
        while not self._closing.wait(self.options.device_retry_ms / 1000):
            try:
                self.microphone.reopen()
            except AudioDeviceError:
                continue
            self._set(mic_lost=False)
            self._owner.emit(DeviceRestored("input", "the microphone is back: input device "
                                                     f"{self.microphone.device.name!r}"))
            return True
        return False

    def _check_silence(self, reported: bool) -> bool:
        """DeviceLost once the microphone has delivered only exact zeros for options.silent_microphone_s,
        DeviceRestored once it has delivered sound again; returns whether the silence stands reported."""
        silent_s = self.microphone.stats().silent_s
        if not reported and silent_s >= self.options.silent_microphone_s:
            error = silence_error(self.microphone.device, silent_s)
            log.warning("%s", error)
            self._set(mic_lost=True)
            self._owner.emit(DeviceLost("input", str(error), error))
            return True
        if reported and silent_s < self.options.silent_microphone_s:  # the run of zeros ended: it sounded
            self._set(mic_lost=False)
            self._owner.emit(DeviceRestored("input", "the microphone hears sound again: input device "
                                                     f"{self.microphone.device.name!r}"))
            return False
        return reported

    def _check_audio_lost(self) -> None:
        """Logs a warning when the microphone lost audio since the last turn: a gap in the recording
        garbles the transcript, and the log is where the user (or a failing test) can see why."""
        stats = self.microphone.stats()
        lost = stats.device_overflows + stats.dropped_blocks
        if lost > self._audio_lost:
            log.warning("the microphone lost audio before this turn (%d input overflows, %d blocks dropped so far): "
                        "the machine was too busy to keep up; the transcript may be wrong",
                        stats.device_overflows, stats.dropped_blocks)
        self._audio_lost = lost
