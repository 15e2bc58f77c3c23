"""The desktop bundle's start script (.ci/bundle_start.py, the first script of build_app.spec), run from
the checkout: its self-test passes here, and its spawned-process path never opens the app.

The PyInstaller build itself takes about 6 minutes, so it is the documented script .ci/build_app,
which runs the same self-test inside dist/parley/ (README, "Building the desktop app").
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, timeout=300):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / ".ci" / "bundle_start.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_bundle_self_test_passes_with_this_checkouts_libraries_models_and_window():
    """Every check of --self-test (libraries, audio, models, window, processes) reports ok and it exits 0."""
    done = _run("--self-test")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith(("ok", "FAIL"))]
    assert [line.split()[1] for line in lines] == ["libraries:", "audio:", "models:", "window:", "processes:"]
    assert all(line.startswith("ok") for line in lines)
    assert done.stdout.rstrip().endswith("self-test passed")


def test_the_spec_names_files_that_exist():
    """The icon, the assets folder and both scripts build_app.spec names are in the checkout."""
    spec = (ROOT / "build_app.spec").read_text()
    for path in ("assets/icon.ico", ".ci/bundle_start.py", "app/__main__.py"):
        assert f'"{path}"' in spec and (ROOT / path).is_file()
    assert '("assets", "assets")' in spec and (ROOT / "assets" / "style.qss").is_file()
