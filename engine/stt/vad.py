"""Voice activity and end-of-turn: 16 kHz blocks of 512 samples in, speech-start and turn events out.

Speech probability comes from the Silero VAD ONNX model that faster-whisper's wheel ships
(faster_whisper/assets/silero_vad_v6.onnx), run one block at a time with its recurrent state carried,
which equals faster-whisper's own batched pass over the same audio (faster_whisper/vad.py). The
endpointing on top is plain logic with no audio device, so a file fed block by block tests it.
"""

from __future__ import annotations

import collections
import enum
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import ModelFilesError, ModelMissingError
from engine.stt.turn import Meaning, Words

SAMPLE_RATE_HZ = 16000
BLOCK_SAMPLES = 512  # the model's window at 16 kHz: 32 ms
CONTEXT_SAMPLES = 64  # the model sees the previous block's last 64 samples in front of each block
STATE_SHAPE = (1, 1, 128)  # LSTM h and c, read from the model's inputs "h" and "c"


def silero_model_path() -> Path:
    """The Silero VAD model inside the installed faster-whisper package.

    Raises:
        ModelFilesError: faster-whisper is not installed, or its wheel lacks the model.
    """
    from engine.models import package_folder

    folder = package_folder("faster_whisper")
    if folder is None:
        raise ModelMissingError(
            "voice activity needs the Silero VAD model that faster-whisper ships, and faster-whisper "
            "is not installed; install it with: pip install faster-whisper==1.2.1"
        )
    path = folder / "assets" / "silero_vad_v6.onnx"
    if not path.is_file():
        raise ModelFilesError(
            f"{path}: no Silero VAD model in this faster-whisper; reinstall it with: "
            "pip install --force-reinstall faster-whisper==1.2.1"
        )
    return path


class SileroVad:
    """Silero VAD over a stream: `probability(block)` for each 512-sample block, in order.

    The model is an LSTM: its state (h, c) and the last 64 samples of the previous block carry from
    one call to the next, so blocks must be fed in stream order; `reset()` starts a new stream.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        import onnxruntime

        path = Path(path) if path is not None else silero_model_path()
        if not path.is_file():
            raise ModelMissingError(f"{path}: no such Silero VAD model file")
        opts = onnxruntime.SessionOptions()
        # one block is ~0.1 ms of work: more threads only add hand-off cost
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 4
        self._session = onnxruntime.InferenceSession(
            str(path), providers=["CPUExecutionProvider"], sess_options=opts
        )
        self.reset()

    def reset(self) -> None:
        """Forget the stream: zero state and context, as at the start of a file."""
        self._h = np.zeros(STATE_SHAPE, np.float32)
        self._c = np.zeros(STATE_SHAPE, np.float32)
        self._context = np.zeros((1, CONTEXT_SAMPLES), np.float32)

    def probability(self, block: np.ndarray) -> float:
        """Speech probability (0..1) of one (512,) float32 block at 16 kHz, the next in the stream."""
        x = np.concatenate([self._context, block[None, :]], axis=1)  # (1, 576) float32
        prob, self._h, self._c = self._session.run(None, {"input": x, "h": self._h, "c": self._c})
        self._context = x[:, -CONTEXT_SAMPLES:]
        return float(prob.reshape(-1)[0])


class Mode(enum.Enum):
    """How a turn ends: after enough silence (hands-free), or when the caller releases the key."""

    HANDS_FREE = "hands-free"
    PUSH_TO_TALK = "push-to-talk"


@dataclass(frozen=True)
class VadOptions:
    """How speech is found and when a turn ends.

    threshold: a block with probability >= threshold is speech (Silero's usual 0.5).
    neg_threshold: below this a block is silence; in between keeps the current state (hysteresis,
        as faster-whisper's threshold - 0.15). None means threshold - 0.15.
    min_speech_ms: speech shorter than this is a click or a cough, not a turn.
    silence_ms: hands-free: this much silence after speech ends the turn (with an end-of-turn model: the longest
        pause, when the model says the user has not finished).
    turn_check_ms: hands-free, with an end-of-turn model: the pause after which it is asked whether the user has
        finished; yes ends the turn there, no waits for more speech or silence_ms.
    sentence_ms: hands-free, with an end-of-turn model and the words of the pause: the pause after which words that
        end a sentence end the turn though the model said the user goes on (a voice may sound unfinished after a
        finished sentence: synthetic ones often do, and many people's).
    statement_ms: as sentence_ms, for words that end a sentence and read as a finished statement (engine/stt/
        turn_text.py): sooner, as the words themselves call for the full stop Whisper heard.
    turn_threshold: the model's probability of a complete turn at or above which it ends (its own cut, 0.5).
    pre_roll_ms: audio kept before the first speech block (the model notices onsets a little late).
    tail_ms: audio kept after the last speech block (word endings fade below the threshold). A pause's words are
        transcribed once it is in, so it also sets when they are known; 100 ms had them ready by the check on a GPU,
        and changed the words of 5 of 36 pauses of people speaking (docs/BENCHMARKS.md, "Turn-taking").
    max_turn_s: hands-free: a turn this long ends even without a pause (30 s is Whisper's window).
    """

    threshold: float = 0.5
    neg_threshold: float | None = None
    min_speech_ms: int = 150
    silence_ms: int = 700
    turn_check_ms: int = 200
    sentence_ms: int = 600
    statement_ms: int = 400
    turn_threshold: float = 0.5
    pre_roll_ms: int = 300
    tail_ms: int = 200
    max_turn_s: float = 30.0

    def __post_init__(self):
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 <= self.neg_threshold <= self.threshold:
            raise ValueError(
                f"neg_threshold must be between 0 and threshold ({self.threshold}), got {self.neg_threshold}"
            )
        if not 0.0 < self.turn_threshold < 1.0:
            raise ValueError(f"turn_threshold must be between 0 and 1, got {self.turn_threshold}")
        for name in ("min_speech_ms", "silence_ms", "turn_check_ms", "sentence_ms", "statement_ms", "pre_roll_ms",
                     "tail_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_turn_s <= 0:
            raise ValueError(f"max_turn_s must be > 0, got {self.max_turn_s}")

    @property
    def silence_threshold(self) -> float:
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


@dataclass(frozen=True)
class SpeechStart:
    """Speech began. start_sample: where the turn's audio will begin (pre-roll included), counted
    in samples from the first block fed since the last reset."""

    start_sample: int

    @property
    def start_s(self) -> float:
        return self.start_sample / SAMPLE_RATE_HZ


@dataclass(frozen=True, eq=False)
class Turn:
    """One utterance. audio: (n,) float32 at 16 kHz, pre-roll and tail included; start_sample and
    end_sample place it in the stream; reason: "silence", "complete" (the end-of-turn model said so after
    turn_check_ms of silence), "max-length", "released" or "flushed"."""

    audio: np.ndarray
    start_sample: int
    end_sample: int
    reason: str

    @property
    def start_s(self) -> float:
        return self.start_sample / SAMPLE_RATE_HZ

    @property
    def end_s(self) -> float:
        return self.end_sample / SAMPLE_RATE_HZ


def split_blocks(audio: np.ndarray) -> Iterator[np.ndarray]:
    """(512,) float32 blocks of a 16 kHz mono array, the last one padded with zeros."""
    audio = np.asarray(audio, np.float32).reshape(-1)
    for start in range(0, len(audio), BLOCK_SAMPLES):
        block = audio[start : start + BLOCK_SAMPLES]
        if len(block) < BLOCK_SAMPLES:
            block = np.pad(block, (0, BLOCK_SAMPLES - len(block)))
        yield block


class Endpointer:
    """Finds turns in a stream of 16 kHz blocks: `feed(block)` returns the events it completes.

    Hands-free: a turn starts when speech lasts min_speech_ms and ends after silence_ms of silence, or sooner with
    an end-of-turn model (engine/stt/turn.py TurnModel), asked after turn_check_ms of it. Where the model says the
    user has finished, that ends the turn; with `words(key)` given, which judges the words of the turn that would end
    (key: its start and end samples, as ending_turn() gives them; None while they are not transcribed), only once
    words that do not trail off agree. Where the model says the user goes on, words that end a sentence end the turn
    after sentence_ms, or as `read(key)` says what they mean (engine/stt/turn_text.py; asked once a pause): at once
    where they read as a whole message, after statement_ms where they read as a finished statement. A whole message
    ends the turn whatever the model says: where the words are judged by the check, they are read first, and the model
    is asked only if they do not read as a whole message. The words are asked for first at the check, before the model
    and again after it, then at each block until judged: a caller that starts transcribing at the first ask (it may
    call ending_turn() then) has Whisper at work while the model runs. Push-to-talk: `press()` and `release()` bound
    the turn; silence never ends it, and the audio handed back is trimmed to the speech inside (plus pre-roll and
    tail). Not thread-safe: one capture loop feeds it.
    """

    def __init__(self, options: VadOptions | None = None, mode: Mode | str = Mode.HANDS_FREE,
                 vad: SileroVad | None = None, turn_model=None,
                 words: Callable[[tuple[int, int]], Words | None] | None = None,
                 read: Callable[[tuple[int, int]], Meaning] | None = None):
        self.options = options or VadOptions()
        self.turn_model, self.words, self.read = turn_model, words, read
        try:
            self.mode = Mode(mode)
        except ValueError:
            choices = ", ".join(m.value for m in Mode)
            raise ValueError(f"unknown mode {mode!r}; choose one of: {choices}") from None
        self._vad = vad or SileroVad()
        o = self.options
        self._pre_roll = round(o.pre_roll_ms * SAMPLE_RATE_HZ / 1000)
        self._tail = round(o.tail_ms * SAMPLE_RATE_HZ / 1000)
        self._silence = round(o.silence_ms * SAMPLE_RATE_HZ / 1000)
        self._turn_check = round(o.turn_check_ms * SAMPLE_RATE_HZ / 1000)
        self._sentence = round(o.sentence_ms * SAMPLE_RATE_HZ / 1000)
        self._statement = round(o.statement_ms * SAMPLE_RATE_HZ / 1000)
        self._min_speech = round(o.min_speech_ms * SAMPLE_RATE_HZ / 1000)
        self._max_turn = round(o.max_turn_s * SAMPLE_RATE_HZ)
        # enough past blocks to reach back pre_roll_ms before a speech run of min_speech_ms
        self._history_blocks = math.ceil((self._pre_roll + self._min_speech) / BLOCK_SAMPLES) + 1
        self.reset()

    def reset(self) -> None:
        """Drop any turn in progress and start a new stream at sample 0."""
        self._vad.reset()
        self._pos = 0  # samples fed so far
        self._history: collections.deque[tuple[int, np.ndarray]] = collections.deque(maxlen=self._history_blocks)
        self._run_start: int | None = None  # hands-free, idle: start of the current speech run
        self._pressed = False
        self._clear_turn()

    def _clear_turn(self) -> None:
        self._collecting = False
        self._blocks: list[np.ndarray] = []
        self._origin = 0  # stream sample of self._blocks[0]
        self._first_speech: int | None = None
        self._last_speech_end = 0
        self._speech_samples = 0
        self._silence_start: int | None = None
        self._asked = False  # the end-of-turn model was asked about the pause under way
        self._model_done = False  # ... and said the user has finished
        self._verdict: Words | None = None  # the pause's words, once judged
        self._meant: Meaning | None = None  # ... and what they mean, once read

    @property
    def in_turn(self) -> bool:
        """True while a turn is being collected (hands-free: speech started; push-to-talk: pressed)."""
        return self._collecting

    @property
    def ending_sample(self) -> int | None:
        """Hands-free: where the turn being collected ends if no more speech comes, once its audio is all in
        (silence has begun and the tail after the last speech has been heard); else None."""
        if self.mode is not Mode.HANDS_FREE or not self._collecting or self._silence_start is None:
            return None
        end = self._last_speech_end + self._tail
        return end if self._pos >= end else None

    def ending_turn(self) -> Turn | None:
        """The turn that silence ends at ending_sample, as feed() will return it if no more speech comes
        (the same samples): a caller may transcribe it while the silence runs out. None as ending_sample."""
        end = self.ending_sample
        return None if end is None else self._turn("silence", end)

    def feed(self, block: np.ndarray) -> list[SpeechStart | Turn]:
        """Runs one (512,) block at 16 kHz through the VAD; returns the events it completes, in order.

        Raises:
            ValueError: the block is not 512 mono samples.
        """
        block = np.asarray(block, np.float32)
        if block.shape != (BLOCK_SAMPLES,):
            raise ValueError(
                f"feed() takes one block of {BLOCK_SAMPLES} mono samples at {SAMPLE_RATE_HZ} Hz, got shape "
                f"{block.shape}; cut longer audio with split_blocks()"
            )
        start = self._pos
        self._pos += BLOCK_SAMPLES
        prob = self._vad.probability(block)
        speech = prob >= self.options.threshold
        silent = prob < self.options.silence_threshold
        events: list[SpeechStart | Turn] = []
        if self._collecting:
            self._blocks.append(block)
            self._track(start, speech, silent, events)
            if self.mode is Mode.HANDS_FREE and self._collecting:
                paused = None if self._silence_start is None else self._pos - self._silence_start
                if paused is not None and paused >= self._silence:
                    events.append(self._finish("silence"))
                elif paused is not None and paused >= self._turn_check and self._finished(paused):
                    events.append(self._finish("complete"))
                elif self._pos - self._origin >= self._max_turn:
                    events.append(self._finish("max-length", trim_end=False))
        elif self.mode is Mode.HANDS_FREE:
            self._history.append((start, block))
            if speech and self._run_start is None:
                self._run_start = start
            elif silent:
                self._run_start = None
            if self._run_start is not None and self._pos - self._run_start >= self._min_speech:
                self._begin(self._run_start - self._pre_roll)
                self._first_speech = self._run_start
                self._last_speech_end = self._pos
                self._speech_samples = self._pos - self._run_start
                self._run_start = None
                events.append(SpeechStart(max(self._first_speech - self._pre_roll, self._origin)))
        else:
            self._history.append((start, block))
        return events

    def press(self) -> None:
        """Push-to-talk: the key went down; blocks from now (and pre_roll_ms before) form the turn.

        Raises:
            RuntimeError: the endpointer is hands-free.
        """
        if self.mode is not Mode.PUSH_TO_TALK:
            raise RuntimeError("press() is for push-to-talk; this endpointer is hands-free (use flush() to end a turn)")
        if not self._collecting:
            # pre-roll blocks are audio only: push-to-talk trims with what the VAD hears after press()
            self._begin(self._pos - self._pre_roll)

    def release(self) -> Turn | None:
        """Push-to-talk: the key went up; returns the turn trimmed to its speech, or None if none was heard."""
        if self.mode is not Mode.PUSH_TO_TALK:
            raise RuntimeError("release() is for push-to-talk; "
                               "this endpointer is hands-free (use flush() to end a turn)")
        return self.flush(reason="released")

    def flush(self, reason: str = "flushed") -> Turn | None:
        """Ends the turn in progress now (e.g. the user stopped listening); None if no speech was heard."""
        if not self._collecting:
            return None
        if self._first_speech is None or self._speech_samples < self._min_speech:
            self._clear_turn()
            return None
        return self._finish(reason)

    def _begin(self, origin: int) -> None:
        """Starts collecting a turn whose audio may reach back to stream sample `origin`."""
        self._clear_turn()
        self._collecting = True
        kept = [(s, b) for s, b in self._history if s + BLOCK_SAMPLES > origin]
        self._history.clear()
        self._blocks = [b for _, b in kept]
        self._origin = kept[0][0] if kept else self._pos

    def _track(self, start: int, speech: bool, silent: bool, events: list) -> None:
        if speech:
            if self._first_speech is None:
                self._first_speech = start
                if self.mode is Mode.PUSH_TO_TALK:
                    events.append(SpeechStart(max(start - self._pre_roll, self._origin)))
            self._last_speech_end = start + BLOCK_SAMPLES
            self._speech_samples += BLOCK_SAMPLES
            self._silence_start = None
            self._asked, self._verdict, self._meant = False, None, None
        elif silent and self._silence_start is None and self._first_speech is not None:
            self._silence_start = start

    def _finished(self, paused: int) -> bool:
        """Whether the pause under way (`paused` samples of it) ends the turn, as the class docstring says; the model is
        asked once a pause, the words until they are transcribed."""
        if self.turn_model is None:
            return False
        if not self._asked:
            self._judge_words()
            # words that end a sentence and read as a whole message end the turn whatever the voice says, and a
            # reading takes a fraction of the model's time: where they are judged already, they are read first
            if self._verdict is Words.SENTENCE and self._meaning() is Meaning.WHOLE:
                return True
            self._asked = True
            self._model_done = self.turn_model.probability(np.concatenate(self._blocks)) >= self.options.turn_threshold
        if self.words is None:
            return self._model_done
        self._judge_words()
        if self._verdict is Words.SENTENCE:
            return self._model_done or paused >= self._sentence or self._meaning_ends(paused)
        return self._model_done and self._verdict is Words.OPEN

    def _meaning_ends(self, paused: int) -> bool:
        meaning = self._meaning()
        return meaning is Meaning.WHOLE or (meaning is Meaning.STATEMENT and paused >= self._statement)

    def _meaning(self) -> Meaning:
        if self._meant is None:
            self._meant = Meaning.PART if self.read is None else self.read((self._begin_sample(), self.ending_sample))
        return self._meant

    def _judge_words(self) -> None:
        if self.words is not None and self._verdict is None and self.ending_sample is not None:
            self._verdict = self.words((self._begin_sample(), self.ending_sample))

    def _finish(self, reason: str, trim_end: bool = True) -> Turn:
        turn = self._turn(reason, min(self._last_speech_end + self._tail, self._pos) if trim_end else self._pos)
        self._clear_turn()
        return turn

    def _begin_sample(self) -> int:
        return max(self._first_speech - self._pre_roll, self._origin)

    def _turn(self, reason: str, end: int) -> Turn:
        audio = np.concatenate(self._blocks) if self._blocks else np.zeros(0, np.float32)
        begin = self._begin_sample()
        return Turn(audio[begin - self._origin : end - self._origin].copy(), begin, end, reason)
