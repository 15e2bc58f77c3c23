"""Sound devices as PortAudio (through sounddevice) reports them: listing, and picking one by name or index.

Player and Microphone resolve their `device` argument here, so a bad name fails the same way for both:
an AudioDeviceError that lists what this machine has.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import re
import sys
from dataclasses import dataclass
from typing import Literal

from engine.errors import AudioDeviceError, AudioDeviceLostError, MicrophoneAccessError, MicrophoneSilentError

Kind = Literal["output", "input"]


def sounddevice():
    """The sounddevice module, or an AudioDeviceError saying how to get PortAudio.

    Imported on first use, not at module import: sounddevice loads the PortAudio library when it is
    imported, and `import engine.audio` should not fail on a machine without it.
    """
    try:
        import sounddevice as sd
    except ImportError as e:
        raise AudioDeviceError("sounddevice is not installed; pip install sounddevice==0.5.6") from e
    except OSError as e:  # sounddevice brings no PortAudio on Linux: it raises OSError without one
        raise AudioDeviceError(
            f"the PortAudio library is missing ({e}); install it with: apt-get install libportaudio2"
        ) from e
    return sd


@dataclass(frozen=True)
class Device:
    """One PortAudio device that can play (output) or record (input)."""

    index: int  # PortAudio's device index, stable while this process runs
    name: str  # e.g. 'default', 'pulse', 'HDA Intel PCH: ALC887 Analog (hw:0,0)'
    channels: int  # the most channels it takes in this direction
    default_rate_hz: float  # the rate it runs at when asked for none


def list_devices(kind: Kind) -> list[Device]:
    """The devices that can play (kind='output') or record (kind='input'), in PortAudio's order.

    Raises:
        ValueError: kind is neither 'output' nor 'input'.
        AudioDeviceError: PortAudio is missing.
    """
    if kind not in ("output", "input"):
        raise ValueError(f"kind must be 'output' or 'input', got {kind!r}")
    key = f"max_{kind}_channels"
    return [
        Device(index=d["index"], name=d["name"], channels=d[key], default_rate_hz=d["default_samplerate"])
        for d in sounddevice().query_devices()
        if d[key] > 0
    ]


def find_device(device: str | int | None, kind: Kind) -> Device:
    """The device a user asked for: None is the system default, an int an index, a str a name or part of one.

    A name matches case-insensitively; an exact name wins over names that merely contain it.

    Raises:
        AudioDeviceError: no such device, the name matches several, or there is no device of this kind;
            the message lists the devices of this kind.
    """
    sd = sounddevice()
    devices = list_devices(kind)
    available = ", ".join(f"{d.index}: {d.name!r}" for d in devices) or "none"
    if device is None:
        index = sd.default.device[0 if kind == "input" else 1]
        if index is None or index < 0:
            if not devices:
                raise AudioDeviceError(
                    f"this machine has no {kind} device; connect one (or start PulseAudio) and try again"
                )
            index = devices[0].index  # PortAudio names no default but has devices: take the first
        device = int(index)
    if isinstance(device, int):
        for d in devices:
            if d.index == device:
                return d
        raise AudioDeviceError(f"no {kind} device has index {device}; {kind} devices: {available}")
    wanted = str(device).lower()
    exact = [d for d in devices if d.name.lower() == wanted]
    if exact:
        return exact[0]
    partial = [d for d in devices if wanted in d.name.lower()]
    if len(partial) == 1:
        return partial[0]
    if not partial:
        raise AudioDeviceError(f"no {kind} device is named like {device!r}; {kind} devices: {available}")
    names = ", ".join(f"{d.index}: {d.name!r}" for d in partial)
    raise AudioDeviceError(f"{device!r} matches several {kind} devices ({names}); give more of the name or an index")


def _alsa_open_errno(device: Device, kind: Kind) -> int | None:
    """The errno ALSA gives when it opens this device itself; None when it opens, or without ALSA (not Linux).

    PortAudio keeps no errno: a device this user may not open is 'Illegal combination of I/O devices'
    to it, so the cause is asked of libasound directly (the same library PortAudio opened it with).
    """
    path = ctypes.util.find_library("asound") if sys.platform.startswith("linux") else None
    if path is None:
        return None
    alsa = ctypes.CDLL(path)
    hw = re.search(r"\((hw:\d+,\d+)\)$", device.name)  # PortAudio names a card's device 'Card: Name (hw:0,0)'
    pcm = ctypes.c_void_p()
    nonblock = 1  # SND_PCM_NONBLOCK: a device busy elsewhere answers at once
    err = alsa.snd_pcm_open(ctypes.byref(pcm), (hw.group(1) if hw else device.name).encode(),
                            0 if kind == "output" else 1, nonblock)  # SND_PCM_STREAM_PLAYBACK, _CAPTURE
    if err == 0:
        alsa.snd_pcm_close(pcm)
        return None
    return -err


def _how_to_allow_recording() -> str:
    if sys.platform == "darwin":
        return "allow microphone access in System Settings > Privacy & Security > Microphone, then start Parley again"
    if sys.platform == "win32":
        return ("allow microphone access in Settings > Privacy & security > Microphone (and 'Let desktop apps "
                "access your microphone'), then start Parley again")
    return ("allow microphone access in your system settings (Privacy > Microphone; for a Flatpak or Snap, the "
            "app's microphone permission), or add your user to the 'audio' group (sudo usermod -aG audio $USER) "
            "and log in again")


def access_error(device: Device, error: Exception) -> MicrophoneAccessError | None:
    """A MicrophoneAccessError when opening input `device` failed (with `error`) because this user may not
    record from it; None when it failed for another reason."""
    denied = re.search(r"permission denied|access is denied|E_ACCESSDENIED|0x80070005", str(error), re.IGNORECASE)
    if not denied and _alsa_open_errno(device, "input") not in (errno.EACCES, errno.EPERM):
        return None
    return MicrophoneAccessError(
        f"this user may not record from input device {describe(device)}: the system denies access to it; "
        f"{_how_to_allow_recording()}"
    )


def silence_error(device: Device, silent_s: float) -> MicrophoneSilentError:
    """The MicrophoneSilentError for input `device` after silent_s seconds of nothing but exact zeros."""
    return MicrophoneSilentError(
        f"input device {describe(device)} has delivered nothing but digital silence for {silent_s:.0f} s, as no "
        "working microphone does. Either the system denies Parley the microphone without saying so: "
        f"{_how_to_allow_recording()}. Or the input is muted, in the system's sound settings or by a switch on "
        "the device. Parley listens on and hears again as soon as sound comes; typing still works"
    )


def describe(device: Device) -> str:
    """A device as error messages name it: 'default' (index 1)."""
    return f"{device.name!r} (index {device.index})"


class DeviceStream:
    """What Player and Microphone share: one PortAudio stream, its lost-device state, reopening, closing once.

    A subclass sets `device`, `rate_hz` and `_lock` (a Lock or Condition), gives `kind`, `_callback` and
    `_forget` (drop what was buffered for a lost stream), and opens its stream with `_start`.
    """

    kind: Kind

    def _init_state(self) -> None:
        self._lost: str | None = None  # why the stream died, once it has
        self._closing = False
        self._generation = 0  # counts streams opened: the end of a replaced stream is not the new one's
        self._stream = None

    def _start(self, stream_class, **settings) -> None:
        """Open and start a float32 PortAudio stream on self.device at self.rate_hz, calling self._callback."""
        self._settings = (stream_class, settings)  # reopen() opens the same again
        generation = self._generation
        stream = None
        try:
            stream = stream_class(device=self.device.index, samplerate=self.rate_hz, dtype="float32",
                                  callback=self._callback, finished_callback=lambda: self._finished(generation),
                                  **settings)
            stream.start()
        except sounddevice().PortAudioError as e:
            if stream is not None:
                stream.close()
            if self.kind == "input" and (denied := access_error(self.device, e)) is not None:
                raise denied from e
            raise AudioDeviceError(
                f"cannot open {self.kind} device {describe(self.device)} at {self.rate_hz} Hz: {e}; "
                "check that no other program holds it and that this user may use audio devices (group 'audio')"
            ) from e
        self._stream = stream

    def _finished(self, generation: int) -> None:
        # PortAudio calls this when the stream ends; unless close() or reopen() asked for that, the device is gone
        with self._lock:
            if generation == self._generation and not self._closing:
                self._lost = "the stream stopped by itself: unplugged, or the sound server quit"
            self._stream_ended()

    def _stream_ended(self) -> None:
        """Hook for waiters to wake up (called under the lock)."""

    def _forget(self) -> None:
        """Hook: drop what was buffered for the lost stream (called by reopen, without the lock)."""

    @property
    def lost(self) -> AudioDeviceLostError | None:
        """The error calls raise since the device was lost; None while it works (or once closed)."""
        with self._lock:
            return self._lost_error() if self._lost and not self._closing else None

    def _lost_error(self) -> AudioDeviceLostError:
        what, were, they_are = ("the speakers", "were", "they are") if self.kind == "output" else \
            ("the microphone", "was", "it is")
        lost = f"{self.kind} device {describe(self.device)} was lost ({self._lost})"
        return AudioDeviceLostError(f"{what} {were} disconnected: {lost}; Parley carries on by itself once {they_are} "
                                    "back", self.kind, lost)

    def reopen(self) -> None:
        """After the device was lost: open the same device again (plugged back in, the sound server back).

        What was queued for the lost stream is dropped; the counters go on. A no-op while the stream works.
        Not to be called while another thread closes this object.

        Raises:
            RuntimeError: closed.
            AudioDeviceError: it still cannot be opened; try again later (it stays lost).
        """
        with self._lock:
            if self._closing:
                raise RuntimeError(f"this {type(self).__name__} is closed; open a new one")
            if self._lost is None:
                return
            self._generation += 1
            reason = self._lost
        self._close_stream()
        self._forget()
        with self._lock:
            self._lost = None
        try:
            stream_class, settings = self._settings
            self._start(stream_class, **settings)
        except AudioDeviceError:
            with self._lock:
                self._lost = reason
            raise

    def _check_locked(self) -> None:
        """Raise if the stream is closed or lost; the caller holds the lock."""
        name = type(self).__name__
        if self._closing:
            raise RuntimeError(f"this {name} is closed; open a new one")
        if self._lost:
            raise self._lost_error()

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            stream.abort()  # abort, not stop: stop() would wait for the device to drain its buffer
            stream.close()
        except sounddevice().PortAudioError:
            pass  # a lost device cannot be stopped twice; the stream is gone either way

    def close(self) -> None:
        """Stops and closes the stream. Safe to call twice."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._close_stream()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
