"""Desktop app start-up: a fresh process -> the main window shown, beside a bare Qt window in the same run.

Method: each run is a new Python process on the offscreen Qt platform (no display needed; a real one
adds the compositor's time). It imports PySide6 and the app, builds the Settings (a temporary INI
file), applies the style and shows the MainWindow, then prints the seconds from the process's start
(its creation time, read from /proc) to the first processEvents() after show(). The baseline is the
same for a bare QMainWindow with no app imports: what any PySide6 program pays. The models load in
the worker afterwards and are not part of this figure (the window must be up in under 2 s).

    python bench/app_startup.py --runs 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# the process's age when the window is up: /proc/self/stat field 22 is its start in clock ticks since boot
_SHOW = """
import os, sys, time
def age():
    start = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start
from PySide6.QtWidgets import QApplication
app = QApplication([])
if sys.argv[1] == "app":
    from PySide6.QtCore import QSettings
    from app.main_window import MainWindow
    from app.settings import Settings
    from app.style import apply_style
    settings = Settings(QSettings(sys.argv[2], QSettings.Format.IniFormat))
    apply_style(app, settings.theme)
    window = MainWindow(settings)
else:
    from PySide6.QtWidgets import QMainWindow
    window = QMainWindow()
window.show()
app.processEvents()
print(age())
"""


def time_show(kind: str, settings_file: str) -> float:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-c", _SHOW, kind, settings_file], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=True, timeout=120)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        settings_file = str(Path(tmp) / "parley.ini")
        time_show("app", settings_file)  # warm-up: the page cache holds the libraries afterwards
        times = {kind: [time_show(kind, settings_file) for _ in range(args.runs)] for kind in ("app", "bare")}

    def p(values, q):
        return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]

    print("| window | p50 s | p95 s | runs |\n|---|---|---|---|")
    for kind, label in (("app", "Parley MainWindow (style, settings, worker thread made)"),
                        ("bare", "bare QMainWindow")):
        print(f"| {label} | {p(times[kind], 50):.2f} | {p(times[kind], 95):.2f} | {args.runs} |")
    print(f"\nratio app / bare at p50: {p(times['app'], 50) / p(times['bare'], 50):.2f}x")


if __name__ == "__main__":
    main()
