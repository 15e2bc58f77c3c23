"""Parley's settings: a typed view over QSettings on the engine's settings file (engine/settings.py).

The engine defines the assistant's settings (their keys, defaults and valid values) and reads the same file for
the command line; this view adds the window's own (the theme, which notices were shown). The keys are shared
with app/models_page.py, which reads and writes the model paths through the same QSettings.
`assistant_config()` turns the stored values into the AssistantConfig the worker loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings

from app.global_key import DEFAULT_KEY
from engine.settings import SETTINGS, AssistantConfig, Setting, settings_path

ORGANIZATION = "Parley"
APPLICATION = "Parley"
THEMES = ("system", "light", "dark")

if TYPE_CHECKING:
    from engine.llm.chat import ChatOptions


class _Value:
    """One setting on its QSettings key: a stored value of the wrong type or outside the choices (a hand-edited
    file) reads as the default; assigning one raises ValueError, so the dialog's mistakes never reach the file."""

    def __init__(self, setting: Setting):
        self.setting = setting

    def __get__(self, settings, owner=None):
        if settings is None:
            return self
        return self.setting.parse(settings.store.value(self.setting.key, self.setting.default))

    def __set__(self, settings, value):
        self.setting.check(value)
        settings.store.setValue(self.setting.key, value)


class Settings:
    """Parley's settings, typed; each property reads and writes its QSettings key at once: the assistant's
    (engine.settings.SETTINGS: tts_model, speaker, listen_mode, ...), and the window's own below.

        settings = Settings()                  # the user's settings file
        settings.listen_mode = "push-to-talk"
        config = settings.assistant_config()   # what the worker loads

    Args:
        store: the QSettings to use; None is the engine's settings file (engine.settings.settings_path()) in INI
            format. Tests pass one on a file in a temporary folder.
    """

    theme = _Value(Setting("ui/theme", "theme", "system", THEMES))
    # closing the window leaves Parley running in the tray (where the desktop has one)
    close_to_tray = _Value(Setting("ui/close_to_tray", "close_to_tray", False))
    # push-to-talk from any app (app/global_key.py), as Qt writes a shortcut; "" for none
    global_talk_key = _Value(Setting("ui/global_talk_key", "global_talk_key", DEFAULT_KEY))
    # the last reason shown for speech running without the megakernel: a lasting one is told once, not every start
    megakernel_notice = _Value(Setting("notices/megakernel", "megakernel_notice", ""))

    def __init__(self, store: QSettings | None = None):
        self.store = store if store is not None else QSettings(str(settings_path()), QSettings.Format.IniFormat)

    @property
    def window_geometry(self) -> QByteArray:
        """The main window's size and place when it last closed (QWidget.saveGeometry()); empty before."""
        value = self.store.value("ui/window_geometry")
        return value if isinstance(value, QByteArray) else QByteArray()

    @window_geometry.setter
    def window_geometry(self, geometry: QByteArray) -> None:
        self.store.setValue("ui/window_geometry", geometry)

    def sync(self) -> None:
        """Write pending changes to disk now (QSettings otherwise writes them a little later). A file that holds a
        speech server's token is made readable by this user alone, as the history's and saved voices' folders are."""
        self.store.sync()
        if self.speech_token:
            os.chmod(self.store.fileName(), 0o600)

    def assistant_config(self, history_file: Path | None = None,
                         chat_options: ChatOptions | None = None) -> AssistantConfig:
        """The stored settings as the worker's AssistantConfig; history_file None is the default profile's,
        chat_options None is ChatOptions()."""
        return AssistantConfig(history_file=history_file, chat_options=chat_options,
                               **{setting.name: getattr(self, setting.name) for setting in SETTINGS})


for _setting in SETTINGS:  # the assistant's settings, as attributes named as AssistantConfig's fields
    setattr(Settings, _setting.name, _Value(_setting))
del _setting
