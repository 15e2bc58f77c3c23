"""The echo canceller (engine/audio/echo.py) on its own and on a real loopback: the Player plays espeak
speech into the 'vsink' null sink whose monitor the Microphone records (tests/conftest.py), so what the
microphone hears is Parley's own voice, as it would from open speakers."""

import numpy as np
import pytest

pytest.importorskip("livekit", reason="livekit (WebRTC's audio processing) is not installed")

from engine.audio.echo import FRAME_SAMPLES, EchoCanceller

SPEECH = "Sure. The train to Lyon leaves at ten past nine from platform four, and it takes about two hours."


class Tap:
    """Sits between the devices and the canceller, keeping the raw near end and what came out of it."""

    def __init__(self, canceller):
        self.canceller, self.raw, self.cleaned = canceller, [], []

    def far_end(self, pcm, rate_hz, t_sound):
        self.canceller.far_end(pcm, rate_hz, t_sound)

    def near_end(self, pcm, t_recorded):
        out = self.canceller.near_end(pcm, t_recorded)
        self.raw.append(np.array(pcm, np.float32))
        self.cleaned.append(out)
        return out


def test_with_no_far_end_the_audio_passes_through_unchanged():
    canceller = EchoCanceller()
    audio = np.random.default_rng(0).uniform(-0.5, 0.5, 16_000).astype(np.float32)
    out = [canceller.near_end(audio[i : i + 333], t_recorded=i / 16_000) for i in range(0, len(audio), 333)]
    out = np.concatenate(out)
    assert len(out) == len(audio) // FRAME_SAMPLES * FRAME_SAMPLES  # whole frames; the rest waits
    np.testing.assert_array_equal(out, audio[: len(out)])


def test_parleys_own_voice_played_and_recorded_back_is_cancelled(sound_server, speak):
    """On the null-sink loopback, the echo of espeak speech comes out of the canceller at least 10 dB
    quieter over the frames where it is loud (after the first second, AEC3's convergence)."""
    import soxr

    from engine.audio import Microphone, Player

    speech = soxr.resample(np.concatenate([speak(SPEECH)] * 2), 16_000, 24_000).astype(np.float32)
    tap = Tap(EchoCanceller())
    with Player() as player, Microphone() as mic:
        player.echo, mic.echo = tap, tap
        player.write(np.zeros(12_000, np.float32))  # half a second of silence: the pairing settles first
        player.write(speech)
        assert player.wait_done(60)
        # the echo's tail: the microphone has recorded as much as the player played, plus 0.3 s
        wanted = sum(map(len, tap.raw)) + 8_000
        while sum(map(len, tap.raw)) < wanted:
            assert mic.read(5) is not None
        player.echo = mic.echo = None
    cleaned = np.concatenate(tap.cleaned)
    raw = np.concatenate(tap.raw)[: len(cleaned)]
    frames = len(cleaned) // FRAME_SAMPLES
    raw_f = raw[: frames * FRAME_SAMPLES].reshape(frames, FRAME_SAMPLES).astype(np.float64)
    out_f = cleaned[: frames * FRAME_SAMPLES].reshape(frames, FRAME_SAMPLES).astype(np.float64)
    loud = np.sqrt(np.mean(raw_f**2, axis=1)) > 10 ** (-40 / 20)
    assert loud.sum() > 300  # the echo was recorded: over 3 s of loud frames
    first = int(np.argmax(loud))
    keep = loud & (np.arange(frames) >= first + 100)
    erle_db = 10 * np.log10(np.sum(raw_f[keep] ** 2) / np.sum(out_f[keep] ** 2))
    assert erle_db > 10, f"ERLE {erle_db:.1f} dB"
