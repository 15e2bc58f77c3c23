"""The Microphone on a real PortAudio stream from PulseAudio's null-sink monitor: block size, rate, mute, loss."""

import numpy as np
import pytest

from engine.audio import Microphone, MicrophoneOptions, Player, list_devices
from engine.errors import AudioDeviceError

WAIT_S = 20  # generous: PulseAudio's null sink runs slow and takes up to ~2 s to start a stream


def tone(hz: float, seconds: float, rate_hz: int = 24_000) -> np.ndarray:
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm**2)))


def read_until(mic: Microphone, predicate, max_blocks: int = 500):
    """Blocks read until one satisfies predicate (that one last); fails after max_blocks (~16 s)."""
    blocks = []
    for _ in range(max_blocks):
        block = mic.read(WAIT_S)
        assert block is not None, "no block came within the timeout"
        blocks.append(block)
        if predicate(block):
            return blocks
    pytest.fail(f"no block matched in {max_blocks} blocks")


@pytest.mark.parametrize("device_rate_hz", [None, 48_000])
def test_blocks_are_512_samples_of_16k_mono_float32(sound_server, device_rate_hz):
    """Blocks are 512 float32 samples at 16 kHz, whether the device records at 16 kHz or is resampled from 48 kHz."""
    with Microphone(options=MicrophoneOptions(device_rate_hz=device_rate_hz)) as mic:
        assert mic.rate_hz == (device_rate_hz or 16_000)
        blocks = [mic.read(WAIT_S) for _ in range(20)]
        stats = mic.stats()
    assert all(b.pcm.shape == (512,) and b.pcm.dtype == np.float32 for b in blocks)
    assert all(a.t_captured <= b.t_captured for a, b in zip(blocks, blocks[1:]))
    assert stats.blocks >= 20 and stats.dropped_blocks == 0


def test_resampled_capture_keeps_a_tone_at_its_frequency(sound_server):
    """Recording at 48 kHz and resampling to 16 kHz keeps a 1 kHz tone at 1 kHz."""
    with Microphone(options=MicrophoneOptions(device_rate_hz=48_000)) as mic, Player() as player:
        player.write(tone(1000, 3.0))
        player.end_of_utterance()
        read_until(mic, lambda b: rms(b.pcm) > 0.1)
        recorded = np.concatenate([mic.read(WAIT_S).pcm for _ in range(16)])
    spectrum = np.abs(np.fft.rfft(recorded * np.hanning(len(recorded))))
    assert abs(np.argmax(spectrum) * 16_000 / len(recorded) - 1000) < 4


def test_mute_delivers_silent_blocks_at_the_same_pace(sound_server):
    """While muted, blocks keep coming, all zeros and marked muted; unmuting brings the sound back."""
    with Microphone() as mic, Player() as player:
        player.write(tone(440, 8.0))
        player.end_of_utterance()
        read_until(mic, lambda b: rms(b.pcm) > 0.1)
        mic.mute = True
        read_until(mic, lambda b: b.muted)  # blocks completed before the flag was set still carry sound
        muted = [mic.read(WAIT_S) for _ in range(10)]
        assert all(b.muted and not b.pcm.any() for b in muted)
        mic.mute = False
        back = read_until(mic, lambda b: not b.muted)[-1]
        assert rms(back.pcm) > 0.1


def test_silent_s_is_how_long_the_device_gave_exact_zeros_and_sound_ends_it(user_mic):
    """A humming microphone is never digitally silent; hushed, silent_s grows with the zeros it records, muted
    or not (mute is Parley's, not the device's); the first sound sets it back to under a callback's worth."""
    def dbfs(blocks):
        return 20 * np.log10(rms(np.concatenate([b.pcm for b in blocks])))

    with Microphone() as mic:
        humming = [mic.read(WAIT_S) for _ in range(30)]
        assert -80 < dbfs(humming[10:]) < -60 and mic.stats().silent_s == 0  # the fixture's faint hum
        user_mic.hush()
        mic.mute = True
        read_until(mic, lambda b: mic.stats().silent_s >= 1.0)
        mic.mute = False
        playing = user_mic(tone(440, 3.0, 16_000))
        read_until(mic, lambda b: rms(b.pcm) > 0.1)  # read as it comes: the tone is still playing
        assert mic.stats().silent_s < 0.1
        playing.wait()


def test_unknown_input_device_lists_the_devices(sound_server):
    """A name no input device has raises AudioDeviceError naming every input device."""
    with pytest.raises(AudioDeviceError) as e:
        Microphone("no-such-mic")
    for device in list_devices("input"):
        assert device.name in str(e.value)
    with pytest.raises(AudioDeviceError, match="no input device has index 999"):
        Microphone(999)


def test_lost_sound_server_makes_read_raise(sound_server):
    """Killing the sound server while recording makes read() raise AudioDeviceError rather than wait."""
    with Microphone() as mic:
        assert mic.read(WAIT_S) is not None
        sound_server.kill()
        with pytest.raises(AudioDeviceError, match="input device 'default'.*was lost"):
            read_until(mic, lambda b: False, max_blocks=10_000)  # drains what was queued, then raises
