"""The window opens before anything heavy loads: building and showing it imports no engine library."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("torch", "llama_cpp", "faster_whisper", "ctranslate2", "sounddevice", "transformers", "onnxruntime")

SCRIPT = """
import json, sys
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
app = QApplication([])
from app.main_window import MainWindow
from app.settings import Settings
from app.style import apply_style
settings = Settings(QSettings(sys.argv[1], QSettings.Format.IniFormat))
apply_style(app, settings.theme)
window = MainWindow(settings)
window.show()
app.processEvents()
print(json.dumps({"shown": window.isVisible(), "modules": sorted(sys.modules)}))
"""


def test_showing_the_window_imports_no_engine_library(tmp_path):
    """torch, llama.cpp, Whisper and PortAudio load in the worker, after the window is up (it opens in
    well under 2 s)."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "parley.ini")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["shown"]
    loaded = {name.split(".")[0] for name in report["modules"]}
    assert "PySide6" in loaded and "app" in loaded
    assert loaded.isdisjoint(HEAVY), sorted(loaded & set(HEAVY))


def test_a_missing_x11_library_is_named_with_its_package_before_qt_aborts(monkeypatch, capsys):
    """On X11 without a library Qt's xcb plugin needs (libxcb-cursor0 on a fresh Debian), Qt aborts with a core
    dump; parley-app says which package to install and exits 1 instead. The lookup is the real one (ldconfig's
    cache), of a library no machine has."""
    from app import main as entry

    monkeypatch.setattr(entry, "X11_LIBRARIES", {"c": "libc6", "xcb-nothing-9": "libxcb-nothing9"})
    monkeypatch.delenv("QT_QPA_PLATFORM", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert entry.main([]) == 1
    err = capsys.readouterr().err
    assert "needs system libraries that are not installed: libxcb-nothing9." in err
    assert "sudo apt install libxcb-nothing9" in err and "libc6" not in err  # found: not named
    # another platform asked for: Qt loads no xcb library, so nothing is checked
    assert entry.missing_x11_packages(["-platform", "offscreen"]) == []
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert entry.missing_x11_packages([]) == []
