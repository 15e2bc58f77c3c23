"""Building the megakernel and saying why speech runs without it: ninja found without an activated environment,
needs_build() before a first compile, and the engine's megakernel_problem where the build cannot run. The GPU tests
skip without CUDA."""

import shutil
import subprocess

import numpy as np
import pytest
import torch

from engine.tts import load_tts
from engine.tts.kernels import build as kernel_build

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_ninja_is_found_where_the_environment_is_not_activated(monkeypatch):
    """An app started as .venv/bin/parley-app has no .venv/bin on PATH: the build puts the ninja package's copy there,
    and torch's own check then finds it."""
    from torch.utils.cpp_extension import is_ninja_available

    monkeypatch.setenv("PATH", "/usr/sbin-not-here")  # nothing to run, as in a bare desktop session's PATH
    assert shutil.which("ninja") is None and not is_ninja_available()
    kernel_build._put_ninja_on_path()
    assert is_ninja_available()
    assert subprocess.run(["ninja", "--version"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only machine's case")
def test_without_a_gpu_no_build_is_announced_and_the_engine_names_no_problem(short_checkpoint):
    """No CUDA device: nothing will compile, and a CPU engine (asked for CUDA) has no megakernel problem to tell,
    as the GPU's absence is its own notice."""
    assert not kernel_build.needs_build()
    assert load_tts(short_checkpoint, device="cuda").megakernel_problem is None


@cuda
@pytest.mark.gpu
def test_a_cached_build_needs_no_compile(short_checkpoint, monkeypatch):
    """Once the extension is built, needs_build() is False, also for a fresh process (no module imported yet), which
    finds the library torch wrote in the cache folder."""
    tts = load_tts(short_checkpoint, device="cuda")
    assert tts.megakernel_problem is None and tts.model.frame_kernel is not None
    assert not kernel_build.needs_build()
    monkeypatch.setattr(kernel_build, "_module", None)
    assert not kernel_build.needs_build()


@cuda
@pytest.mark.gpu
def test_without_a_cuda_toolkit_speech_runs_on_pytorch_and_the_engine_says_why(short_checkpoint, tmp_path,
                                                                                 monkeypatch):
    """As on a desktop with an NVIDIA GPU and no CUDA toolkit, where torch's builder finds no CUDA home: load_tts
    speaks on the PyTorch steps and the engine holds a short reason. needs_build() said a compile would run while a
    toolkit was there and nothing was cached, and not once the toolkit is gone."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no extension cached for this user yet
    monkeypatch.setattr(kernel_build, "_module", None)
    assert kernel_build.needs_build()
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    assert not kernel_build.needs_build()
    tts = load_tts(short_checkpoint, device="cuda")
    assert tts.megakernel_problem.startswith("the megakernel could not be built (CUDA_HOME")
    assert "\n" not in tts.megakernel_problem and len(tts.megakernel_problem) < 200
    assert tts.model.frame_kernel is None and tts.model.talker.model.kernel_step is None
    pcm = np.concatenate([c.pcm for c in tts.stream("No kernel here.", "ryan", seed=3)])
    assert np.isfinite(pcm).all() and np.abs(pcm).max() > 0


@cuda
@pytest.mark.gpu
def test_an_install_without_the_kernels_sources_says_so(tmp_path, monkeypatch):
    """engine/ installed without csrc/ beside it: no compile is announced, and the build refuses at once and names
    what is missing."""
    monkeypatch.setattr(kernel_build, "_module", None)
    monkeypatch.setattr(kernel_build, "CSRC", tmp_path / "csrc")
    assert not kernel_build.needs_build()
    with pytest.raises(kernel_build.MegakernelUnavailable, match="sources are not installed .*lacks binding.cpp"):
        kernel_build.build()
