"""A sound card in software for bench/voice_loop.py on machines without a sound server or PortAudio.

It stands in for the `sounddevice` module (install() puts it in sys.modules before engine/audio opens a
stream), so Player and Microphone run unchanged: their own callbacks, queues, resamplers and timestamps.
Each open stream has a clock thread that calls the stream's callback once per period at wall-clock
pace, on absolute deadlines so the clock does not drift, as a driver's period interrupt would:

- the input device ('virtual mic', 16 kHz mono, 10 ms periods) delivers what speak() queued and then
  silence, so the user's voice reaches the VAD at the pace it was spoken, over a quiet room's noise floor:
  a working microphone never delivers exact zeros, and Parley reports a run of them as a lost microphone;
- the output device ('virtual speakers', 48 kHz stereo, the Player's block size) takes whatever the
  callback hands it and drops it, as a null sink does.

What it does not model: a real device's own buffer (a few ms to tens of ms after the callback), which
PulseAudio's null sink does not model either; voice-to-voice ends where the Player hands the first
sample over, in its callback (engine/audio/player.py), on either.
"""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import numpy as np

MIC_RATE_HZ = 16_000
MIC_PERIOD_FRAMES = 160  # 10 ms, what PulseAudio's ALSA plugin delivers here
MIC_NOISE_RMS = 10 ** (-70 / 20)  # -70 dBFS: a quiet room through a good microphone, far below the VAD's speech
SPEAKER_RATE_HZ = 48_000
SPEAKER_CHANNELS = 2

_DEVICES = [
    {"index": 0, "name": "virtual mic", "max_input_channels": 1, "max_output_channels": 0,
     "default_samplerate": float(MIC_RATE_HZ)},
    {"index": 1, "name": "virtual speakers", "max_input_channels": 0, "max_output_channels": SPEAKER_CHANNELS,
     "default_samplerate": float(SPEAKER_RATE_HZ)},
]  # fmt: skip
default = SimpleNamespace(device=(0, 1))


class PortAudioError(Exception):
    """What sounddevice raises for a setting the device does not take."""


def query_devices():
    return [dict(d) for d in _DEVICES]


def _check(index, samplerate, channels, dtype, kind: str) -> None:
    d = _DEVICES[index] if index in (0, 1) else None
    if d is None or d[f"max_{kind}_channels"] < channels or dtype != "float32":
        raise PortAudioError(f"device {index} has no {kind} of {channels} float32 channels")
    if samplerate != d["default_samplerate"]:
        raise PortAudioError(f"Invalid sample rate {samplerate} for {d['name']!r}")


def check_input_settings(device=None, samplerate=None, channels=None, dtype=None):
    _check(device, samplerate, channels, dtype, "input")


def check_output_settings(device=None, samplerate=None, channels=None, dtype=None):
    _check(device, samplerate, channels, dtype, "output")


class _Speech:
    """The user's voice queued on the microphone; wait() returns once its last sample was delivered."""

    def __init__(self, audio: np.ndarray):
        self.audio = np.asarray(audio, np.float32)
        self.done = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


_speech: list[_Speech] = []  # queued voices, oldest first; the open input stream takes from the front
_speech_lock = threading.Lock()
_noise = np.random.default_rng(0)  # the same room each run


def speak(audio: np.ndarray) -> _Speech:
    """Queue (n,) float32 16 kHz audio on the virtual microphone, to follow what is already queued."""
    speech = _Speech(audio)
    with _speech_lock:
        _speech.append(speech)
    return speech


def _next_input(frames: int) -> np.ndarray:
    out = (_noise.standard_normal(frames) * MIC_NOISE_RMS).astype(np.float32)
    filled = 0
    with _speech_lock:
        while _speech and filled < frames:
            speech = _speech[0]
            n = min(frames - filled, len(speech.audio))
            out[filled : filled + n] += speech.audio[:n]
            speech.audio = speech.audio[n:]
            filled += n
            if not len(speech.audio):
                _speech.pop(0)
                speech.done.set()
    return out


class _Stream:
    """One open stream: a clock thread calling `callback` once a period from start() until abort()."""

    kind: str
    latency = 0.0  # seconds between the callback and the sound: none, the period is handed over at once

    def __init__(self, device=None, samplerate=None, dtype="float32", callback=None, finished_callback=None,
                 channels=1, blocksize=0):
        _check(device, samplerate, channels, dtype, self.kind)
        self.samplerate, self.channels = samplerate, channels
        self.blocksize = blocksize or MIC_PERIOD_FRAMES
        self._callback, self._finished_callback = callback, finished_callback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"virtual-{self.kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        period_s = self.blocksize / self.samplerate
        status = SimpleNamespace(input_overflow=False, output_underflow=False)
        deadline = time.perf_counter() + period_s
        while not self._stop.is_set():
            delay = deadline - time.perf_counter()
            if delay > 0 and self._stop.wait(delay):
                break
            now = time.perf_counter()
            self._period(SimpleNamespace(currentTime=now, inputBufferAdcTime=now, outputBufferDacTime=now), status)
            deadline += period_s
        if self._finished_callback is not None:
            self._finished_callback()

    def abort(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def close(self) -> None:
        self.abort()


class InputStream(_Stream):
    kind = "input"

    def _period(self, time_info, status) -> None:
        self._callback(_next_input(self.blocksize)[:, None], self.blocksize, time_info, status)


class OutputStream(_Stream):
    kind = "output"

    def _period(self, time_info, status) -> None:
        self._callback(np.zeros((self.blocksize, self.channels), np.float32), self.blocksize, time_info, status)


def install() -> None:
    """Make `import sounddevice` give this module; call before engine/audio opens a device."""
    sys.modules["sounddevice"] = sys.modules[__name__]
