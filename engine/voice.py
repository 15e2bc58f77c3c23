"""The live conversation: microphone blocks in, turns run one at a time through a Dialogue, events out.

A listening thread reads 16 kHz blocks from the Microphone (engine/audio/microphone.py) into the
Endpointer (engine/stt/vad.py, hands-free or push-to-talk) and reports the input level and the start of
speech; each finished utterance is queued, beside typed and speak-only text, for one turn worker that
runs them through the Dialogue (engine/pipeline.py). Speech that starts while Parley talks stops it at
once (barge-in) and becomes the next turn. Subscribers get the events of engine/events.py, on the loop's
own threads; the figures still come from `dialogue.metrics` (engine/metrics.py).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.audio.devices import silence_error
from engine.errors import AudioDeviceError, AudioDeviceLostError, ParleyError
from engine.events import (BargeIn, DeviceLost, DeviceRestored, Heard, Level, Notice, Partial, ReplyText,
                           SpeakingClause, SpeechStarted, StateChanged, TurnFailed, TurnFinished)
from engine.pipeline import Dialogue, TurnHooks, TurnResult
from engine.stt.vad import BLOCK_SAMPLES, SAMPLE_RATE_HZ, Endpointer, Mode, SileroVad, SpeechStart, VadOptions
from engine.subscribers import Subscribers

log = logging.getLogger(__name__)

__all__ = ["SILENT_DBFS", "Mode", "VadOptions", "VoiceLoop", "VoiceOptions"]

SILENT_DBFS = -100.0  # the level reported for digital silence (a muted microphone), instead of -inf


# -- options --------------------------------------------------------------------------------------

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


def _blocks(ms: float) -> int:
    return max(1, round(ms * SAMPLE_RATE_HZ / 1000 / BLOCK_SAMPLES))


def _rms_dbfs(pcm: np.ndarray) -> float:
    power = float(np.mean(np.square(pcm, dtype=np.float64))) if pcm.size else 0.0
    return max(10.0 * math.log10(power), SILENT_DBFS) if power > 0 else SILENT_DBFS


def _message(error: Exception) -> str:
    if isinstance(error, ParleyError):
        return str(error)
    return f"something went wrong inside Parley ({type(error).__name__}: {error}); the conversation goes on"


class _BargeInGate:
    """Whether speech the VAD found over a running turn is the user's: of the last 2 x
    options.barge_in_ms of blocks, options.barge_in_ms must be options.barge_in_margin_db above the
    loudest block of the second before them (and at least options.barge_in_min_dbfs). Speech dips between
    syllables; a residual echo rises no higher than it did the second before. While the canceller
    converges (its residual can be as loud as speech) the echo before cancelling sets that floor, as
    it would with no canceller."""

    def __init__(self, options: VoiceOptions):
        self._options = options
        self._needed = _blocks(options.barge_in_ms)
        self.history_blocks = 2 * self._needed + _blocks(1000)  # the levels check() looks at
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


@dataclass(frozen=True)
class _Job:
    """One turn for the worker: kind "voice" (audio), "text" or "say" (text)."""

    kind: str
    text: str = ""
    audio: np.ndarray | None = None
    speech_end: float | None = None  # voice: perf_counter() of the block holding the last speech
    turn_end: float | None = None  # voice: perf_counter() when the end of the turn was decided
    key: tuple[int, int] | None = None  # voice: the turn's (start_sample, end_sample) in the stream


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
    Raises:
        ModelFilesError: the Silero VAD model is missing (only with a microphone).
    """

    def __init__(self, dialogue: Dialogue, microphone=None, options: VoiceOptions | None = None, *,
                 vad: SileroVad | None = None):
        self.dialogue, self.microphone = dialogue, microphone
        self.options = opts = options or VoiceOptions()
        self._endpointer = Endpointer(opts.vad, opts.mode, vad) if microphone is not None else None
        self._mode = opts.mode
        self._subscribers: Subscribers[object] = Subscribers("voice-loop")
        self._lock = threading.RLock()  # guards the state below; StateChanged is emitted under it, in order
        self._state = "idle"
        self._running = False  # between start() and close()
        self._closed = False
        self._hearing = False  # an utterance is being collected
        self._phase: str | None = None  # "thinking" or "speaking" while the worker runs a turn
        self._pressed = False
        self._muted = False
        self._mic_lost = False
        self._speakers_lost = False  # DeviceLost("output") was emitted; only the turn worker touches it
        self._stop_turn = False  # a barge-in came for the turn now running (or about to)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None ends the worker
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()  # for the listening thread
        self._closing = threading.Event()
        # Whisper is not thread-safe: the worker holds this while it transcribes, partials try it
        self._whisper = threading.Lock()
        self._partial_audio: queue.Queue[tuple[int, np.ndarray]] = queue.Queue(maxsize=1)
        # early transcription of the turn whose silence is running out, keyed by (start_sample, end_sample):
        # the newest offer not yet taken, the one being transcribed, the last one done (key, Transcript)
        self._early = threading.Condition()
        self._early_offer: tuple[tuple[int, int], np.ndarray] | None = None
        self._early_running: tuple[int, int] | None = None
        self._early_done: tuple[tuple[int, int], object] | None = None
        self._utterance = 0  # counts utterances, so a late partial of an earlier one is dropped
        self._threads: list[threading.Thread] = []
        self._echo = None  # the EchoCanceller between the player and the microphone while the loop runs
        self._audio_lost = 0  # the microphone's overflows + dropped blocks at the last turn

    # -- events -----------------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[object], None]) -> Callable[[], None]:
        """Call `callback(event)` for each event from now on (on the loop's threads); returns the unsubscriber.

        A callback that raises is logged; the others still run.
        """
        return self._subscribers.subscribe(callback)

    def _emit(self, event) -> None:
        self._subscribers.emit(event)

    @property
    def state(self) -> str:
        """The last state announced by StateChanged (one of engine.events.STATES)."""
        return self._state

    def _update(self, **changes) -> None:
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
                self._emit(StateChanged(state))

    # -- control, from any thread -----------------------------------------------------------------

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
        if self.microphone is not None:
            self._threads.append(threading.Thread(target=self._listen, name="parley-listen", daemon=True))
            if self.dialogue.transcriber is not None:
                self._threads.append(threading.Thread(target=self._transcribe_early, name="parley-early-stt",
                                                      daemon=True))
            if self.options.partials:
                self._threads.append(threading.Thread(target=self._partials, name="parley-partials", daemon=True))
        if self.microphone is not None and self.options.echo_cancellation:
            from engine.audio.echo import EchoCanceller

            self._echo = EchoCanceller()
            self.dialogue.player.echo = self.microphone.echo = self._echo
        for thread in self._threads:
            thread.start()
        self._update()

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
        self._update(running=False, hearing=False, phase=None)

    def __enter__(self) -> VoiceLoop:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit_text(self, text: str, speak_only: bool = False) -> None:
        """Queues a typed turn (the LLM answers it aloud), or with speak_only=True text to speak as it is.

        It runs after the turns queued before it; its errors (empty text, ...) come as TurnFailed.
        """
        self._jobs.put(_Job("say" if speak_only else "text", text=text))

    def stop(self) -> None:
        """Interrupts the running turn at once (playback, TTS and LLM); a BargeIn event if one was running."""
        self._barge_in()

    def press(self) -> None:
        """Push-to-talk key down: what is said from now (and vad.pre_roll_ms before) forms the turn; stops
        Parley's speech. Ignored (with a logged warning) when hands-free or without a microphone."""
        if self._usable_keys("press"):
            self._barge_in()
            self._commands.put(("press",))

    def release(self) -> None:
        """Push-to-talk key up: the speech since press() becomes the next turn (nothing if none was heard)."""
        if self._usable_keys("release"):
            self._commands.put(("release", time.perf_counter()))

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
        self._commands.put(("mode", mode))
        self._update(mode=mode, pressed=False)

    @property
    def muted(self) -> bool:
        """Microphone mute: while True the microphone delivers silence (a turn being spoken ends as on a pause)."""
        return self._muted

    @muted.setter
    def muted(self, value: bool) -> None:
        if self.microphone is not None:
            self.microphone.mute = bool(value)
        self._update(muted=bool(value))

    def _barge_in(self) -> None:
        with self._lock:
            running = self._phase is not None
            # Dialogue.stop() is a no-op until the Dialogue has begun the turn: the hooks repeat it
            self._stop_turn = running
        if running:
            self.dialogue.stop()
            self._emit(BargeIn())

    # -- the listening thread ---------------------------------------------------------------------

    def _listen(self) -> None:
        ep, opts = self._endpointer, self.options
        level_blocks = _blocks(opts.level_interval_ms)
        partial_blocks = _blocks(opts.partial_interval_ms)
        # (stream sample where a block starts, its t_captured): places the end of speech in time
        captured: deque[tuple[int, float]] = deque(maxlen=_blocks(opts.vad.max_turn_s * 1000 + 2000))
        recent: deque[tuple[int, np.ndarray]] = deque(maxlen=_blocks(opts.vad.pre_roll_ms + opts.vad.min_speech_ms) + 1)
        utterance: list[np.ndarray] = []  # with partials: the utterance so far
        level: list[np.ndarray] = []
        gate = _BargeInGate(opts)
        levels: deque[tuple[float, float]] = deque(maxlen=gate.history_blocks)  # (t_captured, dBFS): what the gate measures
        gating = False  # speech over a running turn has not passed the gate yet
        silent = False  # the microphone's digital silence was reported (DeviceLost) and has not ended
        early_end = None  # the ending_sample last offered for early transcription
        pos = 0
        try:
            while not self._closing.is_set():
                try:
                    self._run_commands(ep, captured)
                    block = self.microphone.read(0.1)
                except AudioDeviceLostError as e:
                    if not self._microphone_back(e, ep, captured):
                        return  # closed while it was lost
                    silent = False  # reopened, and DeviceRestored said so
                    continue
                if block is None:
                    continue
                captured.append((pos, block.t_captured))
                levels.append((block.t_captured, _rms_dbfs(block.pcm)))
                pos += BLOCK_SAMPLES
                level.append(block.pcm)
                if len(level) >= level_blocks:
                    self._emit(Level(_rms_dbfs(np.concatenate(level))))
                    level.clear()
                    silent = self._check_silence(silent)
                if gating and gate.check(levels, self._echo):
                    gating = False
                    self._speech_started()
                for event in ep.feed(block.pcm):
                    if isinstance(event, SpeechStart):
                        if opts.partials:
                            utterance = [b for start, b in recent if start + BLOCK_SAMPLES > event.start_sample]
                        if self._phase is not None and self._mode is Mode.HANDS_FREE and opts.barge_in:
                            gating = not gate.check(levels, self._echo)
                            if gating:
                                continue
                        self._speech_started()
                    elif gating:  # it never passed: Parley's own residual echo, or a murmur
                        log.info("speech over Parley's reply stayed below the barge-in gate (%.1f dBFS); ignored",
                                 gate.threshold_dbfs)
                        gating = False
                        utterance = []
                    else:
                        self._utterance_ended(event, captured, block.t_captured)
                        utterance = []
                end = ep.ending_sample
                if end is not None and end != early_end and not gating:
                    early_end = end
                    self._offer_early(ep.ending_turn())
                if opts.partials:
                    recent.append((pos - BLOCK_SAMPLES, block.pcm))
                    if self._hearing and ep.in_turn:
                        utterance.append(block.pcm)
                        if len(utterance) % partial_blocks == 0:
                            self._offer_partial(np.concatenate(utterance))
        except AudioDeviceError as e:  # the microphone cannot be used: typed turns still work
            self._update(mic_lost=True, hearing=False)
            self._emit(TurnFailed(str(e), e))
        except Exception as e:
            log.exception("the listening thread failed")
            self._update(mic_lost=True, hearing=False)
            self._emit(TurnFailed(_message(e), e))

    def _microphone_back(self, error: AudioDeviceLostError, ep: Endpointer, captured) -> bool:
        """The microphone was lost: what was being said becomes a turn, and the microphone is opened again
        every options.device_retry_ms. True once it works again, False when the loop closes first."""
        turn = ep.flush(reason="device-lost")
        if turn is not None:
            self._queue_voice(turn, captured, turn_end=time.perf_counter())
        self._update(mic_lost=True, hearing=False, pressed=False)
        self._emit(DeviceLost("input", str(error), error))
        while not self._closing.wait(self.options.device_retry_ms / 1000):
            try:
                self.microphone.reopen()
            except AudioDeviceError:
                continue
            self._update(mic_lost=False)
            self._emit(DeviceRestored("input", f"the microphone is back: input device {self.microphone.device.name!r}"))
            return True
        return False

    def _check_silence(self, reported: bool) -> bool:
        """DeviceLost once the microphone has delivered only exact zeros for options.silent_microphone_s,
        DeviceRestored once it has delivered sound again; returns whether the silence stands reported."""
        silent_s = self.microphone.stats().silent_s
        if not reported and silent_s >= self.options.silent_microphone_s:
            error = silence_error(self.microphone.device, silent_s)
            log.warning("%s", error)
            self._update(mic_lost=True)
            self._emit(DeviceLost("input", str(error), error))
            return True
        if reported and silent_s < self.options.silent_microphone_s:  # the run of zeros ended: it sounded
            self._update(mic_lost=False)
            self._emit(DeviceRestored("input", f"the microphone hears sound again: input device "
                                               f"{self.microphone.device.name!r}"))
            return False
        return reported

    def _run_commands(self, ep: Endpointer, captured) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "mode":
                ep.flush()  # a half-collected utterance of the old mode is dropped
                ep.mode = command[1]
                self._update(hearing=False, pressed=False)
            elif ep.mode is not Mode.PUSH_TO_TALK:
                continue  # a key queued before the mode changed
            elif command[0] == "press":
                ep.press()
                self._update(pressed=True)
            else:
                turn = ep.release()
                if turn is not None:
                    self._queue_voice(turn, captured, turn_end=command[1])
                self._update(pressed=False, hearing=False)

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

    def _speech_started(self) -> None:
        with self._lock:
            self._utterance += 1
        self._update(hearing=True)
        self._emit(SpeechStarted())
        if self._mode is Mode.HANDS_FREE and self.options.barge_in:
            self._barge_in()

    def _utterance_ended(self, turn, captured, t_block: float) -> None:
        self._queue_voice(turn, captured, turn_end=t_block)

    def _queue_voice(self, turn, captured, turn_end: float) -> None:
        self._check_audio_lost()
        # the last speech sample: the turn's end less its tail (a max-length turn was cut mid-speech)
        tail = round(self.options.vad.tail_ms * SAMPLE_RATE_HZ / 1000)
        last = turn.end_sample if turn.reason == "max-length" else max(turn.start_sample, turn.end_sample - tail)
        speech_end = next((t for start, t in reversed(captured) if start <= last), turn_end)
        with self._lock:  # from hearing straight to thinking: the worker takes the turn at once when idle
            self._jobs.put(_Job("voice", audio=turn.audio, speech_end=min(speech_end, turn_end), turn_end=turn_end,
                                key=(turn.start_sample, turn.end_sample)))
            self._update(hearing=False, phase=self._phase or "thinking")

    # -- partial transcripts ----------------------------------------------------------------------

    def _offer_partial(self, audio: np.ndarray) -> None:
        try:  # only the newest audio matters: replace what the partials thread has not taken yet
            self._partial_audio.get_nowait()
        except queue.Empty:
            pass
        self._partial_audio.put_nowait((self._utterance, audio))

    def _partials(self) -> None:
        while not self._closing.is_set():
            try:
                utterance, audio = self._partial_audio.get(timeout=0.1)
            except queue.Empty:
                continue
            transcriber = self.dialogue.transcriber
            if transcriber is None or not self._whisper.acquire(blocking=False):
                continue  # a turn is being transcribed: its final text comes soon anyway
            try:
                text = transcriber.transcribe(audio).text
            except Exception:
                log.exception("a partial transcript failed")
                continue
            finally:
                self._whisper.release()
            with self._lock:
                current = self._hearing and utterance == self._utterance
            if current and text:
                self._emit(Partial(text))

    # -- early transcription ----------------------------------------------------------------------
    # Hands-free, a turn's audio is complete some silence_ms - tail_ms before the silence window ends it:
    # transcribed in that time, its text is ready when the turn is, and the window costs no STT time.

    def _offer_early(self, turn) -> None:
        with self._early:  # only the newest waits: a resumed voice makes the one before it stale
            self._early_offer = ((turn.start_sample, turn.end_sample), turn.audio)
            self._early.notify_all()

    def _transcribe_early(self) -> None:
        transcriber = self.dialogue.transcriber
        while not self._closing.is_set():
            with self._early:
                if not self._early.wait_for(lambda: self._early_offer is not None, timeout=0.1):
                    continue
                (key, audio), self._early_offer = self._early_offer, None
                self._early_running = key
            transcript = None
            try:
                with self._whisper:
                    with self._early:  # not stale: no newer offer, and the worker has not given up on it
                        wanted = self._early_running == key and self._early_offer is None
                    if wanted:
                        transcript = transcriber.transcribe(audio)
            except Exception:
                log.exception("an early transcription failed; the turn is transcribed when it ends")
            finally:
                with self._early:
                    if transcript is not None:
                        self._early_done = (key, transcript)
                    self._early_running = None
                    self._early.notify_all()

    def _early_transcript(self, key: tuple[int, int] | None):
        """The early Transcript of the turn `key`, waited for while it is being made; None when there is none
        (an offer not started yet is withdrawn: the worker transcribes it at once itself)."""
        with self._early:
            if self._early_offer is not None and self._early_offer[0] == key:
                self._early_offer = None
            if self._early_running not in (None, key):
                self._early_running = None  # a stale one, still waiting for Whisper: it is skipped
            self._early.wait_for(lambda: self._early_running != key)
            done, self._early_done = self._early_done, None
        return done[1] if done is not None and done[0] == key else None

    # -- the turn worker --------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.options.device_retry_ms / 1000)
            except queue.Empty:
                self._check_speakers()
                continue
            if job is None or self._closing.is_set():
                return
            self._update(phase="thinking")
            try:
                result = self._run(job)
            except Exception as e:  # a stage failed; the Dialogue has saved what was said and heard
                if not isinstance(e, ParleyError):
                    log.exception("a turn failed")
                self._emit(TurnFailed(_message(e), e))
            else:
                self._emit(TurnFinished(result))
            finally:
                with self._lock:
                    self._stop_turn = False
                    self._update(phase=None)
            self._check_speakers()  # a turn that lost them announces it at once

    def _check_speakers(self) -> None:
        """Announces speakers that were lost (DeviceLost) and, on each later call while they are, opens
        them again (DeviceRestored once that works). On the turn worker, between turns."""
        player = self.dialogue.player
        error = player.lost
        if error is None:
            return
        if not self._speakers_lost:
            self._speakers_lost = True
            self._emit(DeviceLost("output", str(error), error))
            return
        try:
            player.reopen()
        except AudioDeviceError:
            return
        self._speakers_lost = False
        self._emit(DeviceRestored("output", f"the speakers are back: output device {player.device.name!r}"))

    def _run(self, job: _Job) -> TurnResult:
        def clause(text: str, index: int) -> None:
            if index == 0:
                with self._lock:
                    if self._phase is not None:
                        self._update(phase="speaking")
            self._emit(SpeakingClause(text, index))

        def reply(text: str) -> None:
            self._repeat_stop()
            self._emit(ReplyText(text))

        def notice(error: ParleyError) -> None:
            self._emit(Notice(str(error), error))

        hooks = TurnHooks(reply=reply, clause=clause, notice=notice)
        if job.kind == "text":
            return self.dialogue.text_turn(job.text, hooks)
        if job.kind == "say":
            return self.dialogue.say(job.text, hooks)
        transcript = self._early_transcript(job.key)
        held = transcript is None  # Whisper is this turn's until it has heard it
        if held:
            self._whisper.acquire()

        def heard(text: str) -> None:
            nonlocal held
            if held:
                self._whisper.release()
                held = False
            self._repeat_stop()
            self._emit(Heard(text))

        try:
            return self.dialogue.voice_turn(job.audio, job.speech_end, TurnHooks(heard, hooks.reply, clause, notice),
                                            turn_end=job.turn_end, transcript=transcript)
        finally:
            if held:
                self._whisper.release()

    def _repeat_stop(self) -> None:
        if self._stop_turn:
            self.dialogue.stop()
