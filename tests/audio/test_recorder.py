"""The Recorder (a voice sample for cloning) on a real PortAudio stream from PulseAudio's null-sink monitor."""

import numpy as np
import pytest

from engine.audio import Microphone, Player
from engine.audio import Recorder
from tests.audio.test_microphone import WAIT_S, read_until, rms, tone


def test_records_the_whole_band_at_the_devices_rate_beside_the_conversations_microphone(sound_server):
    """A 10 kHz tone, which the Microphone's 16 kHz blocks cannot hold, comes back at 10 kHz from the Recorder, while
    a Microphone on the same device goes on delivering; the level shows the tone; the recording stops by itself at
    max_s."""
    with Microphone() as mic, Player() as player:
        player.write(tone(10_000, 8.0))
        player.end_of_utterance()
        read_until(mic, lambda b: rms(b.pcm) > 0.0)  # the tone is in the microphone by now
        recorder = Recorder(max_s=2.0)
        assert recorder.rate_hz >= 24_000
        assert recorder.wait(WAIT_S) and recorder.full
        level = recorder.level_dbfs()
        audio, rate = recorder.stop()
        assert mic.read(WAIT_S) is not None
    assert rate == recorder.rate_hz and len(audio) == 2 * rate and audio.dtype == np.float32
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    assert abs(np.argmax(spectrum) * rate / len(audio) - 10_000) < 5
    assert -20 < level < 0  # a 0.5 sine is -9 dBFS; the sound server may turn it down a little


def test_stopping_early_keeps_what_was_recorded_and_silence_reads_as_silence(sound_server):
    """stop() before max_s hands over what came so far; with nothing played the level is far below speech's."""
    with Recorder(max_s=20.0) as recorder:
        read_until_seconds(recorder, 0.5)
        assert recorder.level_dbfs() < -50 and not recorder.full
        audio, rate = recorder.stop()
    assert 0.5 * rate <= len(audio) < 20 * rate and rms(audio) < 0.01


def test_a_recorder_refuses_a_length_that_is_no_length():
    with pytest.raises(ValueError, match="max_s must be > 0"):
        Recorder(max_s=0)


def read_until_seconds(recorder: Recorder, seconds: float) -> None:
    import time

    deadline = time.monotonic() + WAIT_S
    while recorder.seconds < seconds:
        assert time.monotonic() < deadline, "the recording did not grow"
        time.sleep(0.02)
