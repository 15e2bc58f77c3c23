"""The Player on a real PortAudio stream into PulseAudio's null sink: callbacks, buffering, flush, resampling, loss."""

import time

import numpy as np
import pytest

from engine.audio import Microphone, Player, PlayerOptions, list_devices
from engine.audio.player import _Ring
from engine.errors import AudioDeviceError

WAIT_S = 20  # generous: PulseAudio's null sink runs slow and takes up to ~2 s to start a stream


def tone(hz: float, seconds: float, rate_hz: int = 24_000, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_ring_buffer_keeps_order_across_wraparound_and_growth():
    """Samples come out of the ring in the order they went in, across its end and while it grows."""
    ring, expected, got = _Ring(7), [], []
    rng = np.random.default_rng(0)
    counter = 0
    for step in range(200):
        n = int(rng.integers(0, 12))
        chunk = np.arange(counter, counter + n, dtype=np.float32)
        counter += n
        ring.push(chunk)
        expected.extend(chunk)
        out = np.zeros(int(rng.integers(0, 12)), np.float32)
        got.extend(out[: ring.pop_into(out)])
    out = np.zeros(ring.size, np.float32)
    got.extend(out[: ring.pop_into(out)])
    assert got == expected and ring.size == 0


def test_written_audio_is_all_played_through_the_callback(sound_server):
    """Everything written reaches the device through the callback, with no underrun when written whole."""
    with Player() as player:
        assert player.rate_hz == 24_000  # PulseAudio takes 24 kHz itself: nothing to resample
        pcm = tone(440, 0.5)
        for chunk in np.array_split(pcm, 6):
            player.write(chunk)
        assert player.wait_done(WAIT_S)
        stats = player.stats()
    assert stats.frames_written == stats.frames_played == len(pcm)
    assert stats.callbacks >= stats.data_callbacks >= len(pcm) // 480  # 480 frames = one 20 ms callback
    assert stats.underruns == 0 and stats.utterances == 1


def test_each_utterance_reports_when_its_first_sample_reached_the_device(sound_server):
    """Two utterances give two UtteranceStarted events, in order, each after its write."""
    with Player() as player:
        t_write = time.perf_counter()
        player.write(tone(440, 0.1))
        assert player.wait_done(WAIT_S)
        player.write(tone(660, 0.1))
        assert player.wait_done(WAIT_S)
        first, second = player.events.get_nowait(), player.events.get_nowait()
    assert (first.utterance, second.utterance) == (0, 1)
    assert t_write < first.t_first_sample < second.t_first_sample


def test_starved_callback_counts_an_underrun(sound_server):
    """A callback that finds the buffer empty mid-utterance counts an underrun; a marked end does not."""
    with Player(options=PlayerOptions(jitter_ms=0)) as player:
        player.write(tone(440, 0.05))  # no end_of_utterance: the player expects more
        assert player.wait_until(lambda s: s.underruns >= 1, WAIT_S)
        assert player.stats().frames_played == player.stats().frames_written
        player.write(tone(440, 0.05))
        before = player.stats().underruns
        assert player.wait_done(WAIT_S)
        # the new chunk ran out before the end was marked at most once; after the end, none
        callbacks = player.stats().callbacks
        assert player.wait_until(lambda s: s.callbacks >= callbacks + 5, WAIT_S)
        assert player.stats().underruns <= before + 1


def test_jitter_buffer_holds_playback_until_enough_is_buffered_or_the_utterance_ends(sound_server):
    """Less than jitter_ms buffered stays silent; end_of_utterance() lets it play."""
    with Player(options=PlayerOptions(jitter_ms=500)) as player:
        player.write(tone(440, 0.2))
        callbacks = player.stats().callbacks
        assert player.wait_until(lambda s: s.callbacks >= callbacks + 10, WAIT_S)
        assert player.stats().frames_played == 0
        player.end_of_utterance()
        assert player.wait_until(lambda s: s.frames_played == s.frames_written, WAIT_S)


def test_flush_silences_output_within_one_callback(sound_server):
    """After flush() at most one more callback carries written audio, and later writes play again."""
    with Player() as player:
        player.write(tone(440, 5.0))
        assert player.wait_until(lambda s: s.frames_played > 0, WAIT_S)
        player.flush()
        at_flush = player.stats()
        assert player.wait_until(lambda s: s.callbacks >= at_flush.callbacks + 5, WAIT_S)
        after = player.stats()
        assert after.data_callbacks - at_flush.data_callbacks <= 1
        assert after.frames_flushed > 0
        assert after.frames_played + after.frames_flushed == after.frames_written
        player.write(tone(440, 0.1))
        assert player.wait_done(WAIT_S)
        assert player.stats().utterances == 2


def test_resampling_to_48k_doubles_the_length_exactly(sound_server):
    """At a 48 kHz device rate, 24 kHz chunks of any size come out at exactly twice the samples."""
    with Player(options=PlayerOptions(device_rate_hz=48_000)) as player:
        assert player.rate_hz == 48_000
        pcm = tone(440, 0.5)
        for chunk in np.split(pcm, [1, 1921, 3000, 7000]):
            player.write(chunk)
        assert player.wait_done(WAIT_S)
        assert player.stats().frames_played == 2 * len(pcm)


def test_played_tone_comes_back_through_the_monitor_at_its_frequency(sound_server):
    """A 440 Hz tone played at 24 kHz records from the null sink's monitor with its energy at 440 Hz."""
    with Microphone() as mic, Player() as player:
        player.write(tone(440, 3.0))
        player.end_of_utterance()
        loud = []
        for _ in range(500):  # ~16 s of blocks at most
            block = mic.read(WAIT_S)
            assert block is not None
            if loud or np.sqrt(np.mean(block.pcm**2)) > 0.1:
                loud.append(block.pcm)
            if len(loud) == 16:
                break
        assert len(loud) == 16, "the tone never came back through the monitor"
    recorded = np.concatenate(loud)  # 8192 samples at 16 kHz: 1.95 Hz bins
    spectrum = np.abs(np.fft.rfft(recorded * np.hanning(len(recorded))))
    peak_hz = np.argmax(spectrum) * 16_000 / len(recorded)
    assert abs(peak_hz - 440) < 4


def test_unknown_device_name_lists_the_devices(sound_server):
    """A name no device has raises AudioDeviceError naming it and every output device."""
    with pytest.raises(AudioDeviceError) as e:
        Player("no-such-card")
    assert "'no-such-card'" in str(e.value)
    for device in list_devices("output"):
        assert device.name in str(e.value)
    with pytest.raises(AudioDeviceError, match="no output device has index 999"):
        Player(999)


def test_device_picked_by_name_or_index_plays(sound_server):
    """A name substring and an index both open that device."""
    pulse = next(d for d in list_devices("output") if d.name == "pulse")
    for choice in ("PULS", pulse.index):
        with Player(choice) as player:
            assert player.device == pulse
            player.write(tone(440, 0.05))
            assert player.wait_done(WAIT_S)


def test_lost_sound_server_raises_on_the_next_call_instead_of_hanging(sound_server):
    """Killing the sound server mid-utterance makes wait_done and write raise AudioDeviceError."""
    player = Player()
    try:
        player.write(tone(440, 10.0))
        assert player.wait_until(lambda s: s.frames_played > 0, WAIT_S)
        sound_server.kill()
        with pytest.raises(AudioDeviceError, match="was lost"):
            player.wait_done(WAIT_S)  # raises, does not time out: the stream's end is noticed
        with pytest.raises(AudioDeviceError, match="'default'"):
            player.write(tone(440, 0.1))
    finally:
        player.close()
