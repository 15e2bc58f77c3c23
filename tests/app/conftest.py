"""Fixtures for the app's tests: Qt offscreen (no display needed) and settings in a temporary file.

QT_QPA_PLATFORM is set here, before pytest-qt creates the QApplication, so the tests drive real
widgets without a screen; the user's own QSettings are never read or written.
"""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402


@pytest.fixture
def settings(tmp_path):
    """A Settings over an INI file in tmp_path."""
    from PySide6.QtCore import QSettings

    from app.settings import Settings

    return Settings(QSettings(str(tmp_path / "parley.ini"), QSettings.Format.IniFormat))
