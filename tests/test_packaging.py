"""The wheel that `pip install .` (or pipx) builds from this checkout: real pip, offline (no build isolation).

A checkout keeps assets/ and csrc/ beside the packages; the wheel must carry them, or the installed app fails at
its first style lookup and the GPU kernel cannot build.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel of a copy of this checkout's packaged files: setuptools builds in the source folder, and a build/
    left there by an earlier build would lend the wheel files its configuration no longer gives."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    for name in ("engine", "app", "assets", "csrc"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", "-q",
                    "-w", str(out), str(source)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("parley-*.whl")
    return path


def test_the_wheel_holds_every_module_the_assets_and_the_kernel_sources(wheel):
    """Every .py of engine/ and app/, every file of assets/ the app reads and all of csrc/, at their
    installed places (a package missing from pyproject's list would leave its modules out)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for d in ("engine", "app") for p in (ROOT / d).rglob("*.py")}
    assets = {f"app/assets/{p.name}" for p in (ROOT / "assets").iterdir() if p.suffix in (".json", ".qss", ".png",
                                                                                         ".svg", ".ico")}
    kernel = {f"engine/{p.relative_to(ROOT).as_posix()}" for p in (ROOT / "csrc").rglob("*") if p.is_file()}
    assert "app/assets/style.qss" in assets and "engine/csrc/megakernel/megakernel.cu" in kernel
    assert {"engine/csrc/binding.cpp", "engine/csrc/fused/swiglu.cu"} < kernel
    assert not (modules | assets | kernel) - names


def test_an_installed_wheel_finds_its_assets_and_kernel_sources(wheel, tmp_path):
    """Installed into a folder of its own and imported from elsewhere (not this checkout), the app's style sheet
    renders and the megakernel finds all its sources."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "-q", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    probe = ("import app.style as s, engine.tts.kernels.build as m\n"
             "print(s.ASSETS, len(s.style_sheet('dark')), m.CSRC, m._missing_sources(), sep='\\n')")
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assets, sheet_length, csrc, missing = done.stdout.splitlines()
    assert Path(assets) == site / "app" / "assets" and int(sheet_length) > 1000
    assert Path(csrc) == site / "engine" / "csrc" and missing == "[]"
