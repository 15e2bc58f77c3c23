"""Entry point of the desktop app (`parley-app`, `python -m app`): the window first, then the models
load in the worker while it is on screen."""

from __future__ import annotations

import argparse
import logging
import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.main_window import MainWindow
from app.settings import APPLICATION, ORGANIZATION, Settings
from app.style import apply_style


def main(argv: list[str] | None = None) -> int:
    """Runs the app until its window closes; returns the exit status."""
    argv = sys.argv if argv is None else [sys.argv[0], *argv]
    parser = argparse.ArgumentParser(prog="parley-app", description="Parley's desktop app")
    parser.add_argument("--verbose", action="store_true", help="log the engine's progress to stderr")
    args, qt_args = parser.parse_known_args(argv[1:])  # the rest (-platform, -style, ...) is Qt's
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
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
