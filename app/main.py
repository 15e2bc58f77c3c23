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


# The libraries Qt's X11 platform plugin links (ldd on PySide6's libqxcb.so and libQt6XcbQpa.so), with the
# Debian/Ubuntu package of each. Without one Qt aborts with a core dump, and its hint names libxcb-cursor0 whichever
# is missing: on a machine lacking libxcb-icccm4 and libxcb-keysyms1 it still asked for xcb-cursor0.
X11_LIBRARIES = {
    "xcb-cursor": "libxcb-cursor0", "xcb-icccm": "libxcb-icccm4", "xcb-keysyms": "libxcb-keysyms1",
    "xcb-image": "libxcb-image0", "xcb-render-util": "libxcb-render-util0", "xcb-randr": "libxcb-randr0",
    "xcb-shape": "libxcb-shape0", "xcb-shm": "libxcb-shm0", "xcb-sync": "libxcb-sync1", "xcb-util": "libxcb-util1",
    "xcb-xfixes": "libxcb-xfixes0", "xcb-xkb": "libxcb-xkb1", "xkbcommon-x11": "libxkbcommon-x11-0",
    "X11-xcb": "libx11-xcb1",
}


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
