"""engine.audio.wav: a reply's speech as a 16-bit WAV file, read back by libsndfile."""

import numpy as np
import pytest
import soundfile

from engine.audio.wav import write_wav


def test_a_wav_file_reads_back_as_the_samples_written(tmp_path):
    """16-bit PCM at the rate given, each sample within one step of the float written; beyond [-1, 1] clipped."""
    rate = 24_000
    samples = np.sin(np.linspace(0, 200 * np.pi, rate)).astype(np.float32) * 0.8
    samples[:3] = [1.5, -2.0, 0.0]
    out = write_wav(tmp_path / "reply.wav", samples, rate)
    read, read_rate = soundfile.read(out, dtype="float32")
    info = soundfile.info(out)
    assert (read_rate, info.channels, info.subtype) == (rate, 1, "PCM_16")
    assert read.size == samples.size and np.abs(read[3:] - samples[3:]).max() < 1e-4  # 16 bits' steps
    assert read[0] == pytest.approx(32767 / 32768) and read[1] == pytest.approx(-32767 / 32768)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reply.wav"]  # no temporary file left


def test_a_missing_folder_is_named_and_nothing_is_written(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-folder: no such folder; choose another place for a.wav"):
        write_wav(tmp_path / "no-folder" / "a.wav", np.zeros(10, np.float32), 24_000)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_no_half_file(tmp_path):
    """The samples go to a temporary file renamed once complete: where the rename fails (a folder has the name),
    the error says so and no file is left behind."""
    (tmp_path / "a.wav").mkdir()
    with pytest.raises(IsADirectoryError):
        write_wav(tmp_path / "a.wav", np.zeros(10, np.float32), 24_000)
    assert [p.name for p in tmp_path.iterdir()] == ["a.wav"] and not list((tmp_path / "a.wav").iterdir())
