"""Entry point of the desktop app (`parley-app`, `python -m app`): the window first, then the models
load in the worker while it is on screen."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from ctypes.util import find_library

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.main_window import MainWindow
from app.settings import APPLICATION, ORGANIZATION, Settings
from app.style import apply_style


# System libraries Qt's X11 platform plugin loads that a desktop install may lack, with the Debian/Ubuntu package
# of each; without one, Qt aborts (a core dump) with a hint buried among its plugin messages
X11_LIBRARIES = {"xcb-cursor": "libxcb-cursor0"}


def missing_x11_packages(qt_args: list[str]) -> list[str]:
    """The packages of X11_LIBRARIES not installed, where the window would open on X11 (Linux, no Wayland
    session, no other platform asked for)."""
    platform = os.environ.get("QT_QPA_PLATFORM", "")
    if (not sys.platform.startswith("linux") or "-platform" in qt_args or platform not in ("", "xcb")
            or (not platform and os.environ.get("WAYLAND_DISPLAY"))):
        return []
    return [package for library, package in X11_LIBRARIES.items() if find_library(library) is None]


def main(argv: list[str] | None = None) -> int:
    """Runs the app until its window closes; returns the exit status."""
    argv = sys.argv if argv is None else [sys.argv[0], *argv]
    parser = argparse.ArgumentParser(prog="parley-app", description="Parley's desktop app")
    parser.add_argument("--verbose", action="store_true", help="log the engine's progress to stderr")
    args, qt_args = parser.parse_known_args(argv[1:])  # the rest (-platform, -style, ...) is Qt's
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    missing = missing_x11_packages(qt_args)
    if missing:
        print(f"parley-app: the window needs system libraries that are not installed: {', '.join(missing)}.\n"
              f"On Debian or Ubuntu: sudo apt install {' '.join(missing)}", file=sys.stderr)
        return 1
    app = QApplication([argv[0], *qt_args])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    app.setApplicationDisplayName("Parley")
    settings = Settings()
    apply_style(app, settings.theme)
    window = MainWindow(settings)
    window.show()
    QTimer.singleShot(0, window.start_engine)  # after the first paint: the window is up before loading starts
    return app.exec()
