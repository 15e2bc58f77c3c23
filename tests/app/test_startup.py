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
