"""Acoustic echo cancellation: Parley's own voice taken out of the microphone, so open speakers do not
make it interrupt itself.

WebRTC's audio processing module (AEC3 and its high-pass filter) does the work, through the LiveKit
binding (`livekit.rtc.AudioProcessingModule`; bench/aec.py and docs/lab/BENCHMARKS-LOG.md say why this
one).
The Player hands over every block it gives its device, silence included, with the time its first
sample will sound; the Microphone runs each capture chunk through near_end() with the time its first
sample was recorded. The two meet on one clock (time.perf_counter()): each near-end frame is paired
with the far-end samples that sounded at the same moment, so AEC3 only has to find the short acoustic
delay, which its own delay estimator does. A microphone that turns out not to hear the speakers at all
(a headset) passes through uncancelled: see PATH_WINDOW_S.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque

import numpy as np

log = logging.getLogger(__name__)

RATE_HZ = 16_000  # the Microphone's rate; the far end is resampled to it
FRAME_SAMPLES = 160  # AEC3 takes 10 ms frames
# The far end is read this far ahead of the near end's clock: AEC3 can only cancel an echo that comes
# after its reference, and the two streams' timestamps are only as good as the devices' latency reports.
LEAD_S = 0.1
# A near-end frame waits up to this long for its far end: through PulseAudio the echo comes back
# sooner than the devices' reported latencies say, so the far end paired with it may not be there yet.
HOLD_S = 0.06
# The two callbacks' timestamps jitter by tens of ms (PulseAudio delivers unevenly), so the far-end
# sample they point at is averaged (SMOOTHING per call); only when that average is RESYNC_S away from
# where reading has got to (a stream restarted, or the clocks drifted) does the reference jump there
# while Parley speaks; while it is silent, one frame away is enough. Otherwise reading stays
# sample-contiguous, as AEC3 wants.
SMOOTHING = 0.02
RESYNC_S = 0.02
# With no far-end sound for this long the near end passes through untouched (AEC3's echo tail is far
# shorter), so a silent Parley costs nothing and changes nothing.
IDLE_S = 1.0
# AEC3's filter needs about this much of Parley's voice before its residual echo drops (bench/aec.py:
# peaks near the speech's own level in the first 2-3 s, 60 dB below it after).
CONVERGE_S = 3.0
# Whether the microphone hears the speakers at all. A headset's does not, and AEC3 then takes the user's
# voice over Parley's for echo, in patches, and removes it (docs/lab/BENCHMARKS-LOG.md: the soak with the
# canceller on lost a talked-over line so). Where there is an echo path, the microphone's level follows the far
# end's a little later; so the two levels of the last PATH_WINDOW_S of frames with far-end sound are correlated
# at each delay within +-PATH_DELAY_S, and the best correlation decides: at or above PATH_HEARD the speakers
# are heard, below PATH_UNHEARD they are not, and the near end passes through as it is (AEC3 is still fed,
# so that it is ready if they become heard: a headset unplugged). Until a first window is full, AEC3 cancels.
PATH_WINDOW_S = 4.0
PATH_DELAY_S = 0.3
PATH_HEARD = 0.5
PATH_UNHEARD = 0.3
PATH_FLOOR_DBFS = -90.0  # levels below it count as it: digital silence must not outweigh everything else
PATH_EVERY = 50  # frames between two decisions (0.5 s)


class EchoCanceller:
    """Far-end reference in (far_end, from the Player's callback), near-end audio in and cleaned audio
    out (near_end, from the Microphone's callback); both may run on different threads.

    Args:
        history_s: far-end audio kept; it must cover the output's latency plus the microphone's.
    """

    def __init__(self, history_s: float = 2.0):
        from livekit import rtc

        self._rtc = rtc
        self._apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
        self._lock = threading.Lock()
        self._far = np.zeros(int(history_s * RATE_HZ), np.float32)  # a ring, indexed by far-end sample % size
        self._far_written = 0  # far-end samples received so far (at 16 kHz)
        self._anchor: tuple[int, float] | None = None  # (far-end sample, when it sounds): the newest block's
        self._last_sound = -1  # the last far-end sample that was not silence
        self._resampler = None  # (device rate, soxr stream) of the far end
        self._near = np.zeros(0, np.float32)  # near-end samples not yet a whole frame
        self._read: int | None = None  # the far-end sample paired with the first of self._near
        self._drift = 0.0  # the average of (where the clocks point - self._read), in samples
        self._cancelled = 0  # frames run through AEC3 with far-end sound
        # (when a frame was recorded, its level before cancelling), kept while AEC3 converges
        self._raw: deque[tuple[float, float]] = deque(maxlen=int(3 * RATE_HZ / FRAME_SAMPLES))
        # (far-end level, near-end level) dBFS of the latest frames with far-end sound, oldest first
        self._levels: deque[tuple[float, float]] = deque(
            maxlen=int((PATH_WINDOW_S + 2 * PATH_DELAY_S) * RATE_HZ) // FRAME_SAMPLES)
        self._heard: bool | None = None  # whether the microphone hears the speakers; None: not known yet

    def far_end(self, pcm: np.ndarray, rate_hz: int, t_sound: float) -> None:
        """Takes the exact mono samples handed to the speakers (silence included) at their rate, and the
        perf_counter() time the first of them sounds."""
        if rate_hz != RATE_HZ:
            if self._resampler is None or self._resampler[0] != rate_hz:
                import soxr

                self._resampler = (rate_hz, soxr.ResampleStream(rate_hz, RATE_HZ, 1, dtype="float32", quality="HQ"))
            pcm = self._resampler[1].resample_chunk(np.asarray(pcm, np.float32))
        pcm = np.asarray(pcm, np.float32)
        with self._lock:
            start, size = self._far_written, len(self._far)
            for offset in range(0, len(pcm), size):  # a block longer than the ring keeps its end
                part = pcm[offset : offset + size]
                at = (start + offset) % size
                first = min(len(part), size - at)
                self._far[at : at + first] = part[:first]
                self._far[: len(part) - first] = part[first:]
            loud = np.flatnonzero(pcm)
            if loud.size:
                self._last_sound = start + int(loud[-1])
            self._far_written = start + len(pcm)
            self._anchor = (start, t_sound)

    def near_end(self, pcm: np.ndarray, t_recorded: float) -> np.ndarray:
        """Cleans 16 kHz mono microphone samples whose first was recorded at perf_counter() time t_recorded.

        Returns the cleaned samples of the whole 10 ms frames so far (up to 159 samples wait for the next
        call), or the input as it is, also in whole frames, while the far end has been silent.
        """
        with self._lock:
            if self._anchor is not None:
                index, t = self._anchor
                wanted = index + round((t_recorded + LEAD_S - t) * RATE_HZ) - len(self._near)
                if self._read is None:
                    self._read = wanted
                self._drift += SMOOTHING * (wanted - self._read - self._drift)
                # while Parley is silent a jump costs nothing, so the pairing settles before it speaks
                idle = self._read - self._last_sound > IDLE_S * RATE_HZ
                if abs(self._drift) > (FRAME_SAMPLES if idle else RESYNC_S * RATE_HZ):
                    log.debug("echo reference moved by %d samples", round(self._drift))
                    self._read += round(self._drift)
                    self._drift = 0.0
            near = np.concatenate([self._near, np.asarray(pcm, np.float32)])
            whole = len(near) // FRAME_SAMPLES * FRAME_SAMPLES
            if self._read is not None:
                # frames whose far end the Player has not handed over yet wait for it, up to HOLD_S of them
                waiting = whole - max(self._far_written - self._read, 0)
                if waiting > 0:
                    whole -= min(-(-min(waiting, int(HOLD_S * RATE_HZ)) // FRAME_SAMPLES) * FRAME_SAMPLES, whole)
            out, self._near = near[:whole].copy(), near[whole:].copy()
            t_first = t_recorded - (len(near) - len(pcm)) / RATE_HZ  # when out[0] was recorded
            for start in range(0, whole, FRAME_SAMPLES):
                if self._read is None:
                    continue
                far = self._far_block(self._read, FRAME_SAMPLES)
                self._read += FRAME_SAMPLES
                if self._read - self._last_sound > IDLE_S * RATE_HZ:
                    continue
                near_db = _dbfs(out[start : start + FRAME_SAMPLES])
                if not self.converged:
                    self._raw.append((t_first + start / RATE_HZ, near_db))
                self._levels.append((_dbfs(far), near_db))
                cleaned = self._cancel(out[start : start + FRAME_SAMPLES], far)
                if self._heard is not False:
                    out[start : start + FRAME_SAMPLES] = cleaned
                self._cancelled += 1
                if self._cancelled % PATH_EVERY == 0:
                    self._decide_path()
            return out

    @property
    def speakers_heard(self) -> bool | None:
        """Whether the microphone hears the speakers (an echo path), from Parley's latest PATH_WINDOW_S of
        speech; None until that much has been heard. While False the near end passes through uncancelled."""
        return self._heard

    def _decide_path(self) -> None:
        """Sets _heard from the correlation of the near end's levels with the far end's, at the best delay."""
        if len(self._levels) < self._levels.maxlen:
            return
        levels = np.maximum(np.array(self._levels), PATH_FLOOR_DBFS)
        far, near = levels[:, 0], levels[:, 1]
        # the echo comes after its paired far end (LEAD_S's purpose), but devices misreport their latencies:
        # delays of either sign count, as the path exists either way
        lags = int(PATH_DELAY_S * RATE_HZ) // FRAME_SAMPLES
        window = len(levels) - 2 * lags
        best = max(_correlation(far[shift : shift + window], near[lags : lags + window])
                   for shift in range(2 * lags + 1))
        heard = True if best >= PATH_HEARD else False if best < PATH_UNHEARD else self._heard
        if heard != self._heard:
            log.info("the microphone %s the speakers (level correlation %.2f): echo cancellation %s",
                     "hears" if heard else "does not hear", best, "on" if heard else "passes the microphone through")
            self._heard = heard

    @property
    def converged(self) -> bool:
        """AEC3 has had CONVERGE_S of Parley's voice; before that its residual echo can be as loud as speech."""
        return self._cancelled * FRAME_SAMPLES >= CONVERGE_S * RATE_HZ

    def echo_dbfs(self, start: float, end: float) -> float:
        """While AEC3 converges, the loudest level the microphone had before cancelling in the frames
        recorded between perf_counter() times start and end while Parley spoke (its echo, if the
        speakers are heard at all); -100 once it has converged, once the speakers are known not to be
        heard, or for none."""
        with self._lock:
            if self.converged or self._heard is False:
                return -100.0
            return max((dbfs for t, dbfs in self._raw if start <= t < end), default=-100.0)

    def reference(self, n: int) -> np.ndarray:
        """The far-end samples paired with the last n near-end samples near_end() returned (zeros where
        there were none): what AEC3 was given to cancel them with, for measuring it (bench/aec.py)."""
        with self._lock:
            if self._read is None:
                return np.zeros(n, np.float32)
            return self._far_block(self._read - n, n)

    def _far_block(self, index: int, n: int) -> np.ndarray:
        """Far-end samples index .. index+n; zeros where none were received or the ring no longer has them."""
        out = np.zeros(n, np.float32)
        lo, hi = max(index, self._far_written - len(self._far), 0), min(index + n, self._far_written)
        if lo < hi:
            positions = np.arange(lo, hi) % len(self._far)
            out[lo - index : hi - index] = self._far[positions]
        return out

    def _cancel(self, near: np.ndarray, far: np.ndarray) -> np.ndarray:
        render, capture = self._frame(far), self._frame(near)
        self._apm.process_reverse_stream(render)
        self._apm.set_stream_delay_ms(round(LEAD_S * 1000))  # AEC3 treats it as a hint; its estimator decides
        self._apm.process_stream(capture)
        return np.frombuffer(capture.data, np.int16).astype(np.float32) / 32768.0

    def _frame(self, pcm: np.ndarray):
        data = (np.clip(pcm, -1.0, 32767 / 32768) * 32768.0).astype(np.int16)
        return self._rtc.AudioFrame(data=data.tobytes(), sample_rate=RATE_HZ, num_channels=1,
                                    samples_per_channel=FRAME_SAMPLES)


def _dbfs(pcm: np.ndarray) -> float:
    return 10 * math.log10(max(float(np.mean(np.square(pcm, dtype=np.float64))), 1e-10))


def _correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's correlation of two equally long series; 0 where either is constant (a silent microphone)."""
    a, b = a - a.mean(), b - b.mean()
    scale = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b) / scale if scale > 1e-9 else 0.0
