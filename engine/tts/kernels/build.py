"""Builds csrc/ once per source version and GPU (torch's extension builder; cached on disk) and imports it.

Where CUDA, the compiler or a supported GPU is missing, `MegakernelUnavailable` says why and the caller keeps the
PyTorch path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

from engine.errors import ParleyError

# inside engine/ in a wheel (pyproject.toml), beside it in a checkout
_ENGINE = Path(__file__).resolve().parent.parent.parent
CSRC = _ENGINE / "csrc" if (_ENGINE / "csrc").is_dir() else _ENGINE.parent / "csrc"
# the extension's sources; the build's hash covers CSRC's headers too
SOURCES = ("binding.cpp", "megakernel/megakernel.cu", "fused/attention_prologue.cu", "fused/snake.cu",
           "fused/rms_norm.cu", "fused/swiglu.cu")

_module = None
log = logging.getLogger(__name__)


class MegakernelUnavailable(ParleyError):
    """The megakernel cannot run here; the message says why (the PyTorch engine is used instead)."""


def _build_target() -> tuple[str, Path]:
    """(the extension's name, its build folder) for these sources under this torch."""
    # every source and header in the name: a changed kernel builds anew instead of loading a stale one
    files = sorted(CSRC.rglob("*.[ch]*"))
    digest = hashlib.sha256(b"".join(p.relative_to(CSRC).as_posix().encode() + p.read_bytes() for p in files))
    digest = digest.hexdigest()[:12]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return f"parley_megakernel_{digest}", base / "parley" / "megakernel" / f"torch-{torch.__version__}" / digest


def _check_gpu() -> tuple[int, int]:
    """The GPU's compute capability, where the megakernel can run on it."""
    if not torch.cuda.is_available():
        raise MegakernelUnavailable("the megakernel needs a CUDA GPU; none is available")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        name = torch.cuda.get_device_name()
        raise MegakernelUnavailable(f"the megakernel needs compute capability 8.0+, found {major}.{minor} ({name})")
    return major, minor


def _put_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH. The ninja package's copy sits beside the interpreter, a folder an app
    started as .venv/bin/parley-app, without activating the environment, does not have on PATH."""
    if shutil.which("ninja") is None:
        import ninja

        if ninja.BIN_DIR:  # "" where the package's copy is not found; an empty entry would mean the working folder
            os.environ["PATH"] = os.pathsep.join((ninja.BIN_DIR, os.environ.get("PATH", "")))


def needs_build() -> bool:
    """Whether build() would compile first (about a minute, once per kernel version): this GPU can run the
    kernel and its sources and a CUDA toolkit are found, but no built extension is cached yet."""
    if _module is not None or _missing_sources():
        return False
    try:
        _check_gpu()
    except MegakernelUnavailable:
        return False
    from torch.utils.cpp_extension import CUDA_HOME

    name, directory = _build_target()
    built = any((directory / (name + suffix)).is_file() for suffix in (".so", ".pyd"))
    return CUDA_HOME is not None and not built


def _missing_sources() -> list[str]:
    """The extension's sources not found where CSRC points (a copy of engine/ without csrc/: a checkout and a wheel
    built from one both have them)."""
    return [source for source in SOURCES if not (CSRC / source).is_file()]


def build():
    """Compile (first use only; cached on disk) and import the kernel extension."""
    global _module
    if _module is not None:
        return _module
    major, minor = _check_gpu()
    missing = _missing_sources()
    if missing:
        raise MegakernelUnavailable(f"the megakernel's sources are not installed ({CSRC} lacks {', '.join(missing)}); "
                                    f"install Parley again from its source folder")
    from torch.utils.cpp_extension import load

    _put_ninja_on_path()
    arch = "-gencode=arch=compute_90a,code=sm_90a" if (major, minor) == (9, 0) else f"-arch=sm_{major}{minor}"
    name, directory = _build_target()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        _module = load(
            name=name,
            sources=[str(CSRC / source) for source in SOURCES],
            extra_cuda_cflags=["-O3", "-std=c++17", arch],
            extra_include_paths=[str(CSRC)],
            build_directory=str(directory),
        )
    except (RuntimeError, OSError) as e:  # no CUDA toolkit or ninja, or the compiler failed
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if reason.startswith("Error building extension"):  # its message is the compiler's whole output
            log.warning("the megakernel's build failed:\n%s", e)
            reason = "the CUDA compiler failed; the log holds its output"
        raise MegakernelUnavailable(f"the megakernel could not be built ({reason})") from None
    return _module


def require_bf16_cuda(weight: torch.Tensor) -> None:
    """The kernels read the engine's own bf16 weights on the GPU; anything else is refused by name."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cuda":
        raise MegakernelUnavailable(f"the megakernel runs bf16 weights on CUDA, got {weight.dtype} on {weight.device}")
