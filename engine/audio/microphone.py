"""Audio in: a PortAudio input stream (sounddevice) cut into 16 kHz mono float32 blocks for the VAD and Whisper.

The callback mixes the device's channels to mono, resamples to 16 kHz with python-soxr where the device
runs at another rate, and queues fixed-size blocks (512 samples = 32 ms, the window Silero VAD takes at
16 kHz) that the listening stage reads with read() or by iterating. With `echo` set, the 16 kHz audio
goes through the echo canceller (engine/audio/echo.py) before it is cut into blocks.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from engine.audio.devices import Device, DeviceStream, access_error, describe, find_device, sounddevice
from engine.errors import AudioDeviceError

MIC_RATE_HZ = 16_000  # what faster-whisper and Silero VAD take


@dataclass(frozen=True)
class MicrophoneOptions:
    """How the Microphone records.

    block_samples: samples per delivered block at 16 kHz; Silero VAD takes 512 (32 ms) at 16 kHz.
    device_rate_hz: the rate the stream runs at; None is 16 kHz where the device takes it, else the
        device's default rate (then the audio is resampled).
    queue_blocks: blocks kept for a slow reader (250 = 8 s); past that the oldest are dropped.
    stall_timeout_s: read() gives up with AudioDeviceError when no callback came for this long;
        PulseAudio takes up to ~2 s to start a stream, so keep it well above that.
    """

    block_samples: int = 512
    device_rate_hz: int | None = None
    queue_blocks: int = 250
    stall_timeout_s: float = 5.0

    def __post_init__(self):
        for name in ("block_samples", "queue_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.stall_timeout_s > 0:
            raise ValueError(f"stall_timeout_s must be > 0, got {self.stall_timeout_s}")
        if self.device_rate_hz is not None and not 8_000 <= self.device_rate_hz <= 384_000:
            raise ValueError(f"device_rate_hz must be None or 8000..384000, got {self.device_rate_hz}")


@dataclass(frozen=True)
class MicBlock:
    """One block of recorded audio."""

    pcm: np.ndarray  # (block_samples,) float32 at 16 kHz; all zeros while muted
    t_captured: float  # time.perf_counter() in the callback that completed it (its newest sample arrived)
    muted: bool  # the microphone was muted when the block was completed


@dataclass(frozen=True)
class CaptureStats:
    """A snapshot of the microphone's counters since it opened, and how long it has been digitally silent."""

    callbacks: int  # times PortAudio delivered audio
    blocks: int  # blocks queued (muted ones included)
    dropped_blocks: int  # oldest blocks thrown away because the reader fell queue_blocks behind
    device_overflows: int  # callbacks PortAudio flagged 'input overflow' (it lost samples)
    silent_s: float = 0.0  # how long the device has delivered exact zeros and nothing else (mute aside)


class Microphone(DeviceStream):
    """Records from one input device into a queue of 16 kHz blocks, from open until close().

    Muting delivers silence rather than nothing: blocks keep coming at the same pace, all zeros, so
    the VAD's clock and the endpointing timers keep running (muting mid-word ends the speech as a
    pause would), and unmuting needs no resynchronisation.

    echo: an EchoCanceller (engine/audio/echo.py) that cleans the audio before it is cut into blocks
        (the speakers' Player feeds it its far end); None (the default) for none.
    """

    kind = "input"

    def __init__(self, device: str | int | None = None, options: MicrophoneOptions | None = None):
        """Opens and starts the input stream.

        Args:
            device: a name or part of one ('pulse', 'USB'), a PortAudio index, or None for the default.
            options: block size and device settings; MicrophoneOptions() when None.

        Raises:
            MicrophoneAccessError: this user may not record from it (the message says how to allow it).
            AudioDeviceError: no input device, no such device (the message lists them), or it cannot
                be opened (busy).
        """
        sd = sounddevice()
        self.options = opts = options or MicrophoneOptions()
        self.device: Device = find_device(device, "input")
        self.rate_hz = self._pick_rate(sd, self.device, opts.device_rate_hz)
        self.mute = False  # read by the callback each block; a plain bool is atomic under the GIL
        self.echo = None  # read once per callback

        self._blocks: queue.Queue[MicBlock] = queue.Queue(maxsize=opts.queue_blocks)
        self._lock = threading.Lock()
        self._pending = np.zeros(0, np.float32)  # 16 kHz samples not yet a whole block
        self._resampler = None
        if self.rate_hz != MIC_RATE_HZ:
            import soxr

            self._resampler = soxr.ResampleStream(self.rate_hz, MIC_RATE_HZ, 1, dtype="float32", quality="HQ")
        self._counts = dict.fromkeys(("callbacks", "blocks", "dropped_blocks", "device_overflows"), 0)
        self._zeros = 0  # device samples in a row that were exactly 0.0, up to the last callback
        self._last_callback = time.perf_counter()
        self._init_state()
        self._start(sd.InputStream, channels=1)

    @staticmethod
    def _pick_rate(sd, device: Device, wanted_hz: int | None) -> int:
        rates = [wanted_hz] if wanted_hz else [MIC_RATE_HZ, int(device.default_rate_hz)]
        for rate in rates:
            try:
                sd.check_input_settings(device=device.index, samplerate=rate, channels=1, dtype="float32")
                return rate
            except sd.PortAudioError as e:
                if (denied := access_error(device, e)) is not None:  # no rate would do
                    raise denied from e
        raise AudioDeviceError(
            f"input device {describe(device)} records at none of {rates} Hz as float32 mono; "
            "pick another device or another device_rate_hz"
        )

    def _callback(self, indata, frames, time_info, status) -> None:
        x = indata[:, 0]
        sounded = x.any()  # before the canceller, whose output of silence may not be exact zeros
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x)
        now = time.perf_counter()
        if (echo := self.echo) is not None:
            # the chunk ends now, less the input latency PortAudio reports; its own adc time is unusable
            # through PulseAudio's ALSA plugin (0 to 0.3 s off), and the canceller averages the jitter
            latency = self._stream.latency if self._stream is not None else 0.0
            x = echo.near_end(x, now - len(indata) / self.rate_hz - latency)
        bs = self.options.block_samples
        with self._lock:
            c = self._counts
            c["callbacks"] += 1
            self._last_callback = now
            if status.input_overflow:
                c["device_overflows"] += 1
            self._zeros = 0 if sounded else self._zeros + frames
            pending = np.concatenate([self._pending, x])
            whole = len(pending) // bs * bs
            self._pending = pending[whole:].copy()
            for start in range(0, whole, bs):
                muted = bool(self.mute)
                pcm = np.zeros(bs, np.float32) if muted else pending[start : start + bs].copy()
                if self._blocks.full():
                    self._blocks.get_nowait()  # the reader is behind: the oldest audio matters least
                    c["dropped_blocks"] += 1
                self._blocks.put_nowait(MicBlock(pcm, now, muted))
                c["blocks"] += 1

    def _forget(self) -> None:
        with self._lock:
            self._pending = np.zeros(0, np.float32)  # blocks already queued are whole and kept
            self._last_callback = time.perf_counter()  # the new stream gets its stall_timeout_s
            self._zeros = 0
            if self._resampler is not None:
                self._resampler.clear()

    def read(self, timeout_s: float) -> MicBlock | None:
        """The oldest block not yet read, waiting up to timeout_s for one; None when none came in time.

        Raises:
            AudioDeviceError: the device was lost, or no audio came for options.stall_timeout_s.
        """
        deadline = time.perf_counter() + timeout_s
        while True:
            try:
                return self._blocks.get_nowait()
            except queue.Empty:
                pass
            self._check()
            now = time.perf_counter()
            if now >= deadline:
                return None
            try:
                return self._blocks.get(timeout=min(deadline - now, 0.25))
            except queue.Empty:
                continue

    def __iter__(self):
        """Blocks as they come, until close(); raises AudioDeviceError as read() does."""
        while not self._closing:
            block = self.read(0.25)
            if block is not None:
                yield block

    def stats(self) -> CaptureStats:
        """The counters now."""
        with self._lock:
            return CaptureStats(**self._counts, silent_s=self._zeros / self.rate_hz)

    def _check(self) -> None:
        with self._lock:
            idle_s = time.perf_counter() - self._last_callback
            if not self._closing and not self._lost and idle_s > self.options.stall_timeout_s:
                self._lost = f"no audio came for {idle_s:.1f} s"
            self._check_locked()
