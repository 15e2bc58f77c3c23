"""Audio out: 24 kHz float32 PCM chunks in, a PortAudio output stream (sounddevice) fed by its callback.

Chunks come from the TTS stream as they are made (engine/tts/stream.py, 80 ms each), are resampled to
the device's rate where it cannot run at 24 kHz (python-soxr's streaming resampler, which keeps its
filter state across chunks, so chunk borders leave no clicks), and wait in a ring buffer that the
callback drains. flush() is the barge-in path; `events` carries the first-sample time that ends the
voice-to-voice figure (engine/metrics.py). With `echo` set, every block handed to the device goes to
the echo canceller too (engine/audio/echo.py), as the far end it takes out of the microphone.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.audio.devices import Device, DeviceStream, describe, find_device, sounddevice
from engine.errors import AudioDeviceError

TTS_RATE_HZ = 24_000  # Qwen3-TTS's codec decodes to 24 kHz (1920 samples = one 80 ms frame)


@dataclass(frozen=True)
class PlayerOptions:
    """How the Player buffers and talks to the device.

    jitter_ms: audio buffered before an utterance starts playing (unless end_of_utterance() comes
        first); 120 ms is one and a half 80 ms TTS frames, so one late frame does not cut the speech.
    block_ms: the callback period; flush() silences the output within one of these (plus whatever
        the device itself already holds). 20 ms keeps Python's callback well clear of the GIL's
        5 ms switch interval while a model runs on the CPU.
    device_rate_hz: the rate the stream runs at; None is 24 kHz where the device takes it, else
        the device's default rate (then chunks are resampled).
    stall_timeout_s: a waiting call gives up with AudioDeviceError when the callback has not run
        for this long; PulseAudio takes up to ~2 s to start a stream, so keep it well above that.
    buffer_s: the ring buffer's first size; it grows when the TTS runs that far ahead of playback.
    """

    jitter_ms: float = 120.0
    block_ms: float = 20.0
    device_rate_hz: int | None = None
    stall_timeout_s: float = 5.0
    buffer_s: float = 30.0

    def __post_init__(self):
        for name in ("block_ms", "stall_timeout_s", "buffer_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.jitter_ms >= 0:
            raise ValueError(f"jitter_ms must be >= 0 (0 = play at once), got {self.jitter_ms}")
        if self.device_rate_hz is not None and not 8_000 <= self.device_rate_hz <= 384_000:
            raise ValueError(f"device_rate_hz must be None or 8000..384000, got {self.device_rate_hz}")


@dataclass(frozen=True)
class PlaybackStats:
    """A snapshot of the player's counters since it opened. Frames are at the device's rate."""

    callbacks: int  # times PortAudio called for audio
    data_callbacks: int  # of those, the ones that handed at least one written sample to the device
    frames_written: int  # frames queued by write(), after resampling
    frames_played: int  # written frames handed to the device (silence padding not counted)
    frames_flushed: int  # written frames flush() dropped unplayed
    underruns: int  # callbacks that ran out of audio mid-utterance: an audible gap
    utterances: int  # utterances whose first sample reached the device
    device_underflows: int  # callbacks PortAudio flagged 'output underflow' (its buffer ran dry)


@dataclass(frozen=True)
class UtteranceStarted:
    """An utterance's first sample was handed to the device: where voice-to-voice latency ends."""

    utterance: int  # 0, 1, 2, ... in the order they were written
    t_first_sample: float  # time.perf_counter() in the callback that handed it over


class _Ring:
    """A growable FIFO of float32 samples; the caller holds the lock."""

    def __init__(self, capacity: int):
        self._data = np.zeros(capacity, np.float32)
        self._head = 0  # index of the oldest sample
        self.size = 0

    def push(self, x: np.ndarray) -> None:
        cap = len(self._data)
        if self.size + len(x) > cap:
            grown = np.zeros(max(2 * cap, self.size + len(x)), np.float32)
            self.pop_into(grown[: self.size], keep=True)
            self._data, self._head = grown, 0
            cap = len(grown)
        tail = (self._head + self.size) % cap
        first = min(len(x), cap - tail)
        self._data[tail : tail + first] = x[:first]
        self._data[: len(x) - first] = x[first:]
        self.size += len(x)

    def pop_into(self, out: np.ndarray, keep: bool = False) -> int:
        """Copies up to len(out) oldest samples into out; returns how many. keep=True leaves them queued."""
        n = min(len(out), self.size)
        cap = len(self._data)
        first = min(n, cap - self._head)
        out[:first] = self._data[self._head : self._head + first]
        out[first:n] = self._data[: n - first]
        if not keep:
            self._head = (self._head + n) % cap
            self.size -= n
        return n

    def clear(self) -> None:
        self._head = self.size = 0


class Player(DeviceStream):
    """Plays 24 kHz PCM chunks on one output device as they arrive; one per app, shared by all turns.

    write() may be called from one thread (the TTS consumer) while flush() comes from another
    (barge-in). Use it as a context manager, or call close().

    echo: an EchoCanceller (engine/audio/echo.py) that gets the exact samples of each callback block,
        silence included, with the time they sound; None (the default) for none.
    """

    kind = "output"

    def __init__(self, device: str | int | None = None, options: PlayerOptions | None = None):
        """Opens and starts the output stream.

        Args:
            device: a name or part of one ('pulse', 'USB'), a PortAudio index, or None for the default.
            options: buffering and device settings; PlayerOptions() when None.

        Raises:
            AudioDeviceError: no such device (the message lists them) or it cannot be opened.
        """
        sd = sounddevice()
        self.options = opts = options or PlayerOptions()
        self.device: Device = find_device(device, "output")
        self.rate_hz, self.channels = self._pick_format(sd, self.device, opts.device_rate_hz)
        self.events: queue.SimpleQueue[UtteranceStarted] = queue.SimpleQueue()
        self.echo = None  # read once per callback

        self._lock = threading.Lock()  # guards everything the callback touches
        self._changed = threading.Condition(self._lock)  # notified by every callback
        self._write_lock = threading.Lock()  # the resampler's state is shared by write() and flush()
        self._ring = _Ring(int(opts.buffer_s * self.rate_hz))
        self._jitter_frames = int(opts.jitter_ms * self.rate_hz / 1000)
        self._resampler = None
        if self.rate_hz != TTS_RATE_HZ:
            import soxr

            self._resampler = soxr.ResampleStream(TTS_RATE_HZ, self.rate_hz, 1, dtype="float32", quality="HQ")
        self._ends: deque[int] = deque()  # frames_written positions where utterances end
        self._playing = False  # the jitter gate is open
        self._started = False  # the current utterance's first sample has been handed over
        self._init_state()
        self._counts = dict.fromkeys(PlaybackStats.__dataclass_fields__, 0)

        block_frames = max(1, int(opts.block_ms * self.rate_hz / 1000))
        self._start(sd.OutputStream, channels=self.channels, blocksize=block_frames)

    @staticmethod
    def _pick_format(sd, device: Device, wanted_hz: int | None) -> tuple[int, int]:
        """(rate, channels): 24 kHz mono where the device takes it, else its default rate and/or stereo."""
        rates = [wanted_hz] if wanted_hz else [TTS_RATE_HZ, int(device.default_rate_hz)]
        for rate in rates:
            for channels in (1, min(2, device.channels)):
                try:
                    sd.check_output_settings(device=device.index, samplerate=rate, channels=channels, dtype="float32")
                    return rate, channels
                except sd.PortAudioError:
                    continue
        raise AudioDeviceError(
            f"output device {describe(device)} takes none of {rates} Hz as float32 mono or stereo; "
            "pick another device or another device_rate_hz"
        )

    # -- the audio thread ------------------------------------------------------------------------

    def _callback(self, outdata, frames, time_info, status) -> None:
        c = self._counts
        mono = outdata[:, 0]
        with self._lock:
            c["callbacks"] += 1
            if status.output_underflow:
                c["device_underflows"] += 1
            n = 0
            if not self._playing and self._ring.size and (self._ring.size >= self._jitter_frames or self._ends):
                self._playing = True
            if self._playing:
                n = self._ring.pop_into(mono)
                if n:
                    c["data_callbacks"] += 1
                    if not self._started:
                        self._utterance_started()
                c["frames_played"] += n
                played = c["frames_played"] + c["frames_flushed"]
                while self._ends and self._ends[0] <= played:
                    if self._ends.popleft() < played:  # the next utterance began inside this block
                        self._utterance_started()
                    else:
                        self._started = self._playing = False  # back behind the jitter gate
                if n < frames and self._playing:
                    c["underruns"] += 1
            mono[n:] = 0
            if self.channels > 1:
                outdata[:, 1:] = mono[:, None]
            self._changed.notify_all()
        if (echo := self.echo) is not None:
            # PortAudio's stream clock says how far ahead of now this block reaches the device's output
            ahead = time_info.outputBufferDacTime - time_info.currentTime
            echo.far_end(mono, self.rate_hz, time.perf_counter() + (ahead if 0 < ahead < 1 else 0.0))

    def _utterance_started(self) -> None:
        self._started = True
        self.events.put(UtteranceStarted(self._counts["utterances"], time.perf_counter()))
        self._counts["utterances"] += 1

    def _stream_ended(self) -> None:
        self._changed.notify_all()

    def _forget(self) -> None:
        self.flush()  # what the lost stream had not played counts as flushed, so waits still add up

    # -- the caller's side -----------------------------------------------------------------------

    def write(self, pcm: np.ndarray) -> None:
        """Queues a chunk of speech and returns at once; it plays after what is already queued.

        Args:
            pcm: mono float32 samples at 24 kHz, shape (n,), values in [-1, 1].

        Raises:
            ValueError: pcm is not one-dimensional.
            AudioDeviceError: the device was lost (AudioDeviceLostError); reopen() when it is back.
        """
        pcm = np.asarray(pcm, dtype=np.float32)
        if pcm.ndim != 1:
            raise ValueError(f"pcm must be mono, shape (n,), got shape {pcm.shape}; pass pcm[:, 0] or a mix")
        self._check()
        with self._write_lock:
            if self._resampler is not None:
                pcm = self._resampler.resample_chunk(pcm)
            self._push(pcm)

    def end_of_utterance(self) -> None:
        """Marks what was written so far as one whole utterance: it plays out without waiting for the jitter buffer.

        The next write() starts a new utterance (a new UtteranceStarted event).

        Raises:
            AudioDeviceError: the device was lost.
        """
        self._check()
        with self._write_lock:
            if self._resampler is not None:
                self._push(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True))  # the filter's tail
                self._resampler.clear()
            with self._lock:
                written = self._counts["frames_written"]
                consumed = self._counts["frames_played"] + self._counts["frames_flushed"]
                last_end = self._ends[-1] if self._ends else consumed
                if written > last_end:
                    self._ends.append(written)

    def _push(self, x: np.ndarray) -> None:
        if len(x):
            with self._lock:
                self._ring.push(x)
                self._counts["frames_written"] += len(x)

    def flush(self) -> None:
        """Drops everything queued (barge-in): the next callback plays silence, the stream keeps running.

        Audio the device has already taken (its own buffer, ~40 ms on PulseAudio) still plays.
        """
        with self._write_lock, self._lock:
            self._counts["frames_flushed"] += self._ring.size
            self._ring.clear()
            self._ends.clear()
            self._playing = self._started = False
            if self._resampler is not None:
                self._resampler.clear()

    def stats(self) -> PlaybackStats:
        """The counters now."""
        with self._lock:
            return PlaybackStats(**self._counts)

    def wait_until(self, predicate, timeout_s: float) -> bool:
        """Waits until predicate(stats()) holds, woken by each callback; False when timeout_s passes first.

        Raises:
            AudioDeviceError: the device was lost, or its callback stopped for options.stall_timeout_s.
        """
        deadline = time.perf_counter() + timeout_s
        with self._lock:
            seen, seen_at = self._counts["callbacks"], time.perf_counter()
            while True:
                self._check_locked()
                if predicate(PlaybackStats(**self._counts)):
                    return True
                now = time.perf_counter()
                if self._counts["callbacks"] != seen:
                    seen, seen_at = self._counts["callbacks"], now
                elif now - seen_at > self.options.stall_timeout_s:
                    self._lost = f"its callback has not run for {now - seen_at:.1f} s"
                    self._check_locked()
                if now >= deadline:
                    return False
                self._changed.wait(min(deadline - now, 0.25))

    def wait_done(self, timeout_s: float) -> bool:
        """Ends the utterance and waits until everything written has been handed to the device.

        Returns:
            True when all of it was played, False when timeout_s passed first.

        Raises:
            AudioDeviceError: the device was lost (see wait_until).
        """
        self.end_of_utterance()
        return self.wait_until(lambda s: s.frames_played + s.frames_flushed == s.frames_written, timeout_s)

    def _check(self) -> None:
        with self._lock:
            self._check_locked()
