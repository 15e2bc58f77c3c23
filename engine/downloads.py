"""Model downloads from the Hugging Face hub, with progress in bytes, cancel and resume.

huggingface_hub does the fetching (`hf_hub_download` into a local folder, which resumes from its own
`.incomplete` files), in a child process: cancel then stops a download at once, whichever transfer
backend the hub picked (plain HTTP or hf_xet), and the parent reports progress from the bytes on disk.
Files land in `<target>.partial/`, renamed to `target` once every file is in, so a model folder under
its final name is always complete, each file checked against the size and SHA-256 the hub lists for it; a
cancelled or failed download resumes from there next time (one that fetched
nothing, as without a network, leaves no folder behind). A damaged model is downloaded again beside itself and
replaced only once the new copy is complete.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import queue
import shlex
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.errors import ParleyError

__all__ = ["DownloadCancelled", "DownloadError", "NoNetworkError", "download_command", "download_model"]

# how long a cancelled child gets to exit before it is killed
_STOP_TIMEOUT_S = 5.0


class DownloadError(ParleyError):
    """A download failed: the hub refused it, the disk is full, or the transfer broke off."""


class NoNetworkError(DownloadError):
    """The hub cannot be reached (no network, or HF_HUB_OFFLINE is set); the message has the command to run
    elsewhere."""


class DownloadCancelled(DownloadError):
    """The download was cancelled; what was fetched is kept and the next download resumes from it."""


def download_command(repo_id: str, target: Path | str, files: Sequence[str] | None = None) -> str:
    """The shell command that downloads the same files into `target` on a machine with a network."""
    args = ["hf", "download", repo_id, *(files or ()), "--local-dir", str(target)]
    return shlex.join(args)


def download_model(repo_id: str, target: Path | str, *, files: Sequence[str] | None = None,
                   revision: str | None = None, endpoint: str | None = None,
                   progress: Callable[[int, int], None] | None = None,
                   cancel: threading.Event | None = None, poll_s: float = 0.2, replace: bool = False) -> Path:
    """Download a hub repository (or some of its files) into the folder `target`.

    Blocks until done; call it from a worker thread. Files already fetched (by a download that was
    cancelled or broke off) are kept and the rest resumed.

    Args:
        repo_id: "owner/name" of a model repository.
        target: the folder to create; it must not exist yet, unless `replace`.
        files: paths inside the repository to fetch; None fetches all of them.
        revision: a branch, tag or commit; None is the repository's default branch.
        endpoint: the hub's address; None is huggingface_hub's default ($HF_ENDPOINT or huggingface.co).
        progress: called from this thread as progress(done_bytes, total_bytes) every poll_s
            seconds; total_bytes is 0 until the hub has said how much there is.
        cancel: set it (from any thread) to stop the download within poll_s seconds.
        poll_s: how often progress and cancel are checked.
        replace: download again over an existing `target` (a damaged model), which stays as it is until the new
            copy is complete.

    Returns:
        target, complete.

    Raises:
        NoNetworkError: the hub cannot be reached; the message says what to run on another machine.
        DownloadCancelled: cancel was set.
        DownloadError: the repository or a file does not exist, `target` exists (without `replace`), the disk
            is full, or the download stopped for another reason; the message names it.
    """
    target = Path(target).expanduser()
    if target.exists() and not replace:
        raise DownloadError(f"{target} already exists; choose it as the model folder, "
                            "or move it aside to download again")
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    cancel = cancel or threading.Event()
    # spawn, not fork: the app's process has Qt and torch threads whose locks a fork would copy held
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    child = ctx.Process(target=_fetch, args=(repo_id, str(partial), list(files) if files else None, revision,
                                             endpoint, messages), daemon=True, name=f"download {repo_id}")
    child.start()
    sizes: dict[str, int] = {}
    try:
        while True:
            if cancel.is_set():
                raise DownloadCancelled(f"download of {repo_id} cancelled; {_done_bytes(partial, sizes)} bytes "
                                        f"kept in {partial}, the next download resumes from there")
            try:
                kind, value = messages.get(timeout=poll_s)
            except queue.Empty:
                if not child.is_alive() and messages.empty():
                    raise DownloadError(f"the download of {repo_id} stopped unexpectedly (exit code "
                                        f"{child.exitcode}); try again: what was fetched is kept in {partial}")
                kind, value = None, None
            if kind == "sizes":
                sizes = value
            elif kind == "error":
                raise _error(value[0], value[1], repo_id, target, files, partial)
            if progress is not None:
                progress(_done_bytes(partial, sizes), sum(sizes.values()))
            if kind == "done":
                break
    except DownloadError:
        _stop(child)
        if _done_bytes(partial, sizes) == 0:  # nothing to resume from
            shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        _stop(child)
        messages.close()
    # the hub's bookkeeping (etags, locks) is only needed to resume; the model folder stays clean
    shutil.rmtree(partial / ".cache", ignore_errors=True)
    if target.exists():  # replace: the damaged copy goes once the new one is complete
        old = target.with_name(target.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
        os.replace(partial, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, target)
    return target


def _done_bytes(partial: Path, sizes: dict[str, int]) -> int:
    """Bytes on disk: finished files plus huggingface_hub's `.incomplete` files (renamed when complete)."""
    done = sum(min((partial / name).stat().st_size, size) for name, size in sizes.items() if (partial / name).is_file())
    downloading = partial / ".cache" / "huggingface" / "download"
    if downloading.is_dir():
        done += sum(p.stat().st_size for p in downloading.rglob("*.incomplete") if p.is_file())
    return min(done, sum(sizes.values())) if sizes else done


def _stop(child: multiprocessing.Process):
    if child.is_alive():
        child.terminate()  # huggingface_hub appends to .incomplete files, so a cut-off file resumes
        child.join(_STOP_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()


def _fetch(repo_id: str, partial: str, files: list[str] | None, revision: str | None, endpoint: str | None,
           messages: multiprocessing.Queue):
    """The child process: ("sizes", {path: bytes}), then ("done", None) or ("error", (kind, text))."""
    try:
        from huggingface_hub import HfApi, hf_hub_download

        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
        listed = {s.rfilename: s for s in info.siblings or ()}
        available = {name: s.size or 0 for name, s in listed.items()}
        names = files or sorted(available)
        unknown = [name for name in names if name not in available]
        if unknown:
            messages.put(("error", ("missing-file", f"{', '.join(unknown)} not in {repo_id}; it has: "
                                                    f"{', '.join(sorted(available)[:20]) or 'no files'}")))
            return
        messages.put(("sizes", {name: available[name] for name in names}))
        for name in names:
            # pinned to the commit the sizes came from, so a push mid-download cannot mix versions
            path = Path(hf_hub_download(repo_id, name, revision=info.sha, local_dir=partial, endpoint=endpoint))
            problem = _damage(path, listed[name])
            if problem:
                path.unlink()  # the next download fetches it afresh
                messages.put(("error", ("damaged", f"{name}: {problem}")))
                return
        messages.put(("done", None))
    except Exception as e:  # reported to the parent, which raises the matching DownloadError
        messages.put(("error", (_kind(e), f"{type(e).__name__}: {e}")))


def _damage(path: Path, listed) -> str:
    """How a downloaded file differs from the hub's listing of it (a RepoSibling): "" where it does not."""
    size = path.stat().st_size
    if listed.size is not None and size != listed.size:
        return f"{size:,} bytes where the hub lists {listed.size:,}"
    if listed.lfs is not None:  # the hub lists a SHA-256 for the files it keeps in LFS: the weights
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        if digest.hexdigest() != listed.lfs.sha256:
            return "its SHA-256 differs from the hub's"
    return ""


def _kind(e: Exception) -> str:
    """What went wrong, in the parent's terms; checked in this order because requests' errors are OSErrors."""
    import requests
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(e, (ConnectionError, requests.ConnectionError, requests.Timeout, LocalEntryNotFoundError)):
        return "offline"
    if isinstance(e, (RepositoryNotFoundError, RevisionNotFoundError)):
        return "missing-repo"
    if isinstance(e, OSError) and e.errno == 28:  # ENOSPC
        return "disk-full"
    return "other"


def _error(kind: str, text: str, repo_id: str, target: Path, files, partial: Path) -> DownloadError:
    if kind == "offline":
        return NoNetworkError(
            f"no network: the hub cannot be reached from this computer ({text}). Run this command on a "
            f"machine that has one:\n  {download_command(repo_id, target, files)}\n"
            f"then copy the folder to {target} here, or choose it with 'Choose…'."
        )
    if kind == "missing-repo":
        return DownloadError(f"the hub has no model {repo_id} ({text}); check the name, or log in with "
                             "`hf auth login` if it is gated")
    if kind == "missing-file":
        return DownloadError(text)
    if kind == "damaged":
        return DownloadError(f"the download of {repo_id} arrived damaged ({text}); download again: the damaged file "
                             "was removed, the rest is kept")
    if kind == "disk-full":
        return DownloadError(f"the disk is full while downloading {repo_id} into {partial}; free some space and "
                             "download again: what was fetched is kept")
    return DownloadError(f"the download of {repo_id} failed: {text}; try again: what was fetched is kept in {partial}")
