"""A recording of the user's voice for cloning it: the microphone at its own rate, whole band, kept in memory.

The Microphone hands the VAD and Whisper 16 kHz blocks, which keep nothing above 8 kHz; a voice cloned from that
would sound muffled, since the speech model hears up to 12 kHz. So a voice sample is recorded apart, at the device's
own rate (44.1 or 48 kHz as a rule), for at most max_s seconds, with its level for a meter as it comes.
"""

from __future__ import annotations

import threading

import numpy as np

from engine.audio.devices import DeviceStream, find_device, sounddevice

__all__ = ["Recorder"]

LEVEL_WINDOW_S = 0.1  # the level is that of the newest this-many seconds: a meter's pace
SILENCE_DBFS = -100.0  # the level of digital silence (and of nothing recorded yet)


class Recorder(DeviceStream):
    """Records one input device, mono float32 at its default rate, from open until stop() or max_s seconds.

    Another stream on the same device (the conversation's Microphone) may stay open meanwhile: sound servers
    (PulseAudio, PipeWire, WASAPI's shared mode, Core Audio) give each its own copy.
    """

    kind = "input"

    def __init__(self, device: str | int | None = None, max_s: float = 20.0):
        """Opens the device and starts recording.

        Args:
            device: a name or part of one, a PortAudio index, or None for the default input.
            max_s: the recording stops by itself at this length.

        Raises:
            MicrophoneAccessError: this user may not record (the message says how to allow it).
            AudioDeviceError: no input device, no such device, or it cannot be opened.
        """
        if not max_s > 0:
            raise ValueError(f"max_s must be > 0, got {max_s}")
        self.device = find_device(device, "input")
        self.rate_hz = int(self.device.default_rate_hz)
        self._limit = round(max_s * self.rate_hz)
        self._lock = threading.Lock()
        self._parts: list[np.ndarray] = []
        self._samples = 0
        self._recent = np.zeros(0, np.float32)  # the newest LEVEL_WINDOW_S of audio
        self._done = threading.Event()  # max_s is recorded, or the device went away
        self._init_state()
        self._start(sounddevice().InputStream, channels=1)

    def _callback(self, indata, frames, time_info, status) -> None:
        with self._lock:
            room = self._limit - self._samples
            if room <= 0:
                return
            x = indata[:room, 0].copy()
            self._parts.append(x)
            self._samples += len(x)
            self._recent = np.concatenate([self._recent, x])[-round(LEVEL_WINDOW_S * self.rate_hz):]
            if self._samples >= self._limit:
                self._done.set()

    @property
    def seconds(self) -> float:
        """How much has been recorded."""
        with self._lock:
            return self._samples / self.rate_hz

    @property
    def full(self) -> bool:
        """Whether max_s is recorded (and nothing more will be)."""
        with self._lock:
            return self._samples >= self._limit

    def level_dbfs(self) -> float:
        """The RMS level of the newest LEVEL_WINDOW_S, in dB below full scale (SILENCE_DBFS for none).

        Raises:
            AudioDeviceLostError: the microphone went away while recording.
        """
        with self._lock:
            self._check_locked()
            window = self._recent
        rms = float(np.sqrt(np.mean(np.square(window, dtype=np.float64)))) if len(window) else 0.0
        return max(20 * np.log10(rms), SILENCE_DBFS) if rms > 0 else SILENCE_DBFS

    def wait(self, timeout_s: float) -> bool:
        """Waits until max_s is recorded (or the device is lost), or timeout_s passes; whether either happened."""
        return self._done.wait(timeout_s)

    def stop(self) -> tuple[np.ndarray, int]:
        """Stops recording and closes the device.

        Returns:
            The recording as (n,) float32 and its rate in Hz.
        Raises:
            AudioDeviceLostError: the microphone went away while recording (what came before it is lost with it:
                a voice sample cut short is no sample).
        """
        with self._lock:
            lost = self._lost_error() if self._lost and not self._closing else None
        self.close()
        if lost is not None:
            raise lost
        with self._lock:
            audio = np.concatenate(self._parts) if self._parts else np.zeros(0, np.float32)
        return audio, self.rate_hz

    def _stream_ended(self) -> None:
        self._done.set()  # wake a waiter: the recording cannot grow any more
