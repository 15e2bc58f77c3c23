"""engine.downloads against a local fake hub: real huggingface_hub transfers, progress, cancel, resume, errors."""

import os
import socket
import threading

import pytest

from engine.downloads import DownloadCancelled, DownloadError, NoNetworkError, download_command, download_model
from tests.app.fake_hub import FakeHub

REPO = "parley-test/tiny-model"
# huggingface_hub writes in 10 MiB chunks (constants.DOWNLOAD_CHUNK_SIZE): a file held after 12 MiB
# has exactly one chunk on disk when the test cancels
CHUNK = 10 * 1024 * 1024


def _repo(big_bytes: int = 64 * 1024) -> dict[str, bytes]:
    return {"config.json": b'{"model": "tiny"}', "weights/model.bin": os.urandom(big_bytes)}


def test_download_fetches_every_file_and_reports_progress_up_to_the_total(tmp_path):
    """Every file arrives byte for byte under the target; progress grows to (total, total); no hub bookkeeping
    remains."""
    files = _repo()
    seen = []
    with FakeHub({REPO: files}) as hub:
        out = download_model(REPO, tmp_path / "tiny", endpoint=hub.url, progress=lambda d, t: seen.append((d, t)))
    assert out == tmp_path / "tiny"
    for name, content in files.items():
        assert (out / name).read_bytes() == content
    assert not (out / ".cache").exists() and not (tmp_path / "tiny.partial").exists()
    total = sum(len(b) for b in files.values())
    assert seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_files_limits_the_download_to_the_named_ones(tmp_path):
    """With files=[...] only those are fetched (a single GGUF out of a repository of many)."""
    with FakeHub({REPO: _repo()}) as hub:
        out = download_model(REPO, tmp_path / "one", files=["config.json"], endpoint=hub.url)
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


def test_cancel_stops_a_transfer_in_flight_and_the_next_download_resumes_it(tmp_path):
    """Cancel mid-file leaves no target but keeps the bytes; the retry asks the hub for the rest only (Range)."""
    files = _repo(big_bytes=2 * CHUNK + 123)
    cancel = threading.Event()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done >= CHUNK:
            cancel.set()

    with FakeHub({REPO: files}, hold_after=CHUNK + 2 * 1024 * 1024) as hub:
        with pytest.raises(DownloadCancelled, match="resumes"):
            download_model(REPO, tmp_path / "big", endpoint=hub.url, progress=progress, cancel=cancel, poll_s=0.05)
        assert not (tmp_path / "big").exists()
        assert max(seen) >= CHUNK
        hub.hold_after = None
        hub.release.set()
        out = download_model(REPO, tmp_path / "big", endpoint=hub.url)
    assert (out / "weights/model.bin").read_bytes() == files["weights/model.bin"]
    ranges = [r for method, path, r in hub.requests if method == "GET" and path.endswith("model.bin")]
    assert ranges[0] is None and ranges[-1] is not None and int(ranges[-1].split("=")[1].rstrip("-")) >= CHUNK


def test_no_network_says_which_command_to_run_elsewhere(tmp_path):
    """A hub that cannot be reached is NoNetworkError, whose message holds the hf command."""
    with socket.socket() as s:  # a port nothing listens on: connection refused, as with no network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = tmp_path / "m"
    with pytest.raises(NoNetworkError) as err:
        download_model(REPO, target, endpoint=f"http://127.0.0.1:{port}")
    assert "no network" in str(err.value)
    assert download_command(REPO, target) in str(err.value)
    assert not target.exists() and not (tmp_path / "m.partial").exists()  # nothing fetched, nothing left behind
    assert download_command(REPO, target) == f"hf download {REPO} --local-dir {target}"


def test_unknown_repository_and_file_are_named_in_the_error(tmp_path):
    """A repository the hub lacks, or a file the repository lacks, is a DownloadError naming it."""
    with FakeHub({REPO: _repo()}) as hub:
        with pytest.raises(DownloadError, match="no model parley-test/nothing-here"):
            download_model("parley-test/nothing-here", tmp_path / "a", endpoint=hub.url)
        with pytest.raises(DownloadError, match="model.gguf not in parley-test/tiny-model; it has: config.json"):
            download_model(REPO, tmp_path / "b", files=["model.gguf"], endpoint=hub.url)
    assert not [p.name for p in tmp_path.iterdir()]  # no target, no empty .partial


def test_an_existing_target_is_never_overwritten(tmp_path):
    """A folder already at the target is refused, its files untouched."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "mine.txt").write_text("keep")
    with pytest.raises(DownloadError, match="already exists"):
        download_model(REPO, tmp_path / "m", endpoint="http://127.0.0.1:9")
    assert (tmp_path / "m" / "mine.txt").read_text() == "keep"


def test_replace_downloads_a_damaged_model_again_and_swaps_it_in_once_complete(tmp_path):
    """replace=True fetches beside the existing folder, which keeps its files until the new copy is whole; then
    the folder holds exactly the hub's files, and no .partial or .old copy is left."""
    files = _repo()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{ damaged")
    (tmp_path / "m" / "stray.bin").write_bytes(b"x")
    seen = []

    def progress(done, total):
        seen.append((tmp_path / "m" / "stray.bin").exists())

    with FakeHub({REPO: files}) as hub:
        out = download_model(REPO, tmp_path / "m", endpoint=hub.url, replace=True, progress=progress)
    assert seen and all(seen)  # the old copy stayed while the new one came in
    assert {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} == set(files)
    assert (out / "config.json").read_bytes() == files["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_file_damaged_on_the_way_is_refused_removed_and_fetched_afresh(tmp_path):
    """Each weights file is checked against the SHA-256 the hub lists: one that arrives with other bytes is a
    DownloadError naming it, no model folder appears, the damaged file is gone, and the next download fetches it
    again (the others kept) and succeeds."""
    files = _repo()
    with FakeHub({REPO: files}, garble={"weights/model.bin"}) as hub:
        with pytest.raises(DownloadError, match=r"arrived damaged \(weights/model.bin: its SHA-256 differs"):
            download_model(REPO, tmp_path / "m", endpoint=hub.url)
        assert not (tmp_path / "m").exists() and not (tmp_path / "m.partial" / "weights" / "model.bin").exists()
        assert (tmp_path / "m.partial" / "config.json").is_file()  # kept: it matched
        hub.garble.clear()
        out = download_model(REPO, tmp_path / "m", endpoint=hub.url)
    assert (out / "weights/model.bin").read_bytes() == files["weights/model.bin"]
