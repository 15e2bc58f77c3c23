"""About Parley and your privacy: the version, what Parley keeps where on this computer (the history file
of each profile, the saved voices, the settings, the models and caches), that nothing leaves it, and the licences.

The places are the engine's own (engine/history.py history_path, engine/models.py models_dir, the
Hugging Face cache, engine/stt/whisper.py cache_dir; engine/models.py locate_model) and QSettings' file,
so the page shows this machine's real paths. "Delete all history…" asks first, then emits
delete_history(); the window has the file erased in place, through the engine's own store
(HistoryStore.erase_all) or, with no engine loaded, engine.history.erase_history(). The saved voices are the engine's
VoiceLibrary's (engine/voice_library.py); "Erase all saved voices…" asks first, then emits erase_voices().
Object names for the style sheet: QWidget#aboutPage, QLabel#headline, QLabel#aboutWhere, QLabel#hint.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QFormLayout, QHBoxLayout, QLabel, QMessageBox, QPushButton, QScrollArea, QVBoxLayout,
                               QWidget)

from app.confirm import ask_to_confirm
from engine.voice_library import VoiceLibrary

# the model or library, its licence; shown one a line, in this order
LICENSES = (
    ("Qwen3-TTS (speech model)", "Apache-2.0"),
    ("Whisper base, faster-whisper conversion (speech recognition)", "MIT"),
    ("SmolLM2-135M-Instruct (bundled language model)", "Apache-2.0"),
    ("Silero VAD (voice activity, shipped with faster-whisper)", "MIT"),
    ("faster-whisper, CTranslate2", "MIT"),
    ("llama.cpp, llama-cpp-python", "MIT"),
    ("PyTorch", "BSD-3-Clause"),
    ("Transformers, tokenizers, huggingface_hub, safetensors", "Apache-2.0"),
    ("Qt for Python (PySide6)", "LGPL-3.0"),
    ("sounddevice (PortAudio)", "MIT"),
    ("python-soxr (libsoxr)", "LGPL-2.1-or-later"),
    ("NumPy", "BSD-3-Clause"),
)
# the suffixes SQLite gives a database's companion files (WAL, its shared-memory index, rollback journal)
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


def parley_version() -> str:
    """Parley's version as installed ("0.1.0"), or "unknown" when running from an uninstalled copy."""
    try:
        return importlib.metadata.version("parley")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def history_files(path: Path) -> list[Path]:
    """The history database and whichever of its companion files exist now."""
    return [p for p in (path, *(path.with_name(path.name + s) for s in SQLITE_COMPANIONS)) if p.exists()]


def settings_location(store: QSettings) -> str:
    """Where QSettings keeps the settings: the file, or the registry key on Windows."""
    where = store.fileName()
    if store.format() == QSettings.Format.NativeFormat and where.startswith("\\HKEY"):
        return f"Windows registry, {where}"
    return where


class AboutPage(QWidget):
    """The About and Privacy window.

    Args:
        settings: the app's QSettings (the file shown, and the model paths chosen).
        history_file: the history database of the profile in use.

    Signals:
        delete_history(): the user confirmed "Delete all history"; the window erases it and calls refresh().
        erase_voices(): the user confirmed "Erase all saved voices"; the window erases them and calls refresh().
    """

    delete_history = Signal()
    erase_voices = Signal()

    def __init__(self, settings: QSettings, history_file: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings, self.history_file = settings, Path(history_file)
        self.setObjectName("aboutPage")
        self.setWindowTitle("About Parley")
        self.where = QFormLayout()
        self.where.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.where.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.open_button = QPushButton("Open the history folder", objectName="openHistoryFolder")
        self.open_button.clicked.connect(self.open_folder)
        self.delete_button = QPushButton("Delete all history…", objectName="deleteAllHistory")
        self.delete_button.setProperty("danger", True)
        self.delete_button.clicked.connect(self.ask_delete)
        self.voices = QLabel(objectName="aboutWhere", wordWrap=True)
        self.voices.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.open_voices_button = QPushButton("Open the voices folder", objectName="openVoicesFolder")
        self.open_voices_button.clicked.connect(self.open_voices_folder)
        self.erase_voices_button = QPushButton("Erase all saved voices…", objectName="eraseVoices")
        self.erase_voices_button.setProperty("danger", True)
        self.erase_voices_button.clicked.connect(self.ask_erase_voices)

        privacy = QLabel(
            "<b>Nothing leaves this computer.</b> Parley listens, thinks and speaks here: no account, no cloud, "
            "no telemetry, and no network connection while you talk: Parley's own tests hold a whole spoken and "
            "typed conversation with the network blocked. The network is used only when you press Download on the "
            "Models page.", wordWrap=True)
        licences = QLabel("<br>".join(f"{name}: {licence}" for name, licence in LICENSES), objectName="hint",
                          wordWrap=True)
        body = QWidget()
        column = QVBoxLayout(body)
        column.addWidget(QLabel(f"Parley {parley_version()}", objectName="headline"))
        column.addWidget(QLabel("A private voice assistant that runs entirely on your machine. Parley is free "
                                "software under the Apache License 2.0.", wordWrap=True))
        column.addWidget(privacy)
        column.addWidget(QLabel("<b>What is stored where</b>"))
        column.addLayout(self.where)
        column.addWidget(QLabel("<b>Your saved voices</b>"))
        column.addWidget(self.voices)
        voice_buttons = QHBoxLayout()
        voice_buttons.addWidget(self.erase_voices_button)
        voice_buttons.addStretch(1)
        voice_buttons.addWidget(self.open_voices_button)
        column.addLayout(voice_buttons)
        column.addWidget(QLabel("<b>Licences</b>"))
        column.addWidget(licences)
        column.addStretch(1)
        scroll = QScrollArea(widgetResizable=True, frameShape=QScrollArea.Shape.NoFrame)
        scroll.setWidget(body)
        buttons = QHBoxLayout()
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        buttons.addWidget(self.open_button)
        close = QPushButton("Close", objectName="aboutClose")
        close.clicked.connect(self.close)
        buttons.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(scroll, 1)
        layout.addLayout(buttons)
        self.refresh()

    def refresh(self) -> None:
        """Look at the files again (sizes, what exists) and show them."""
        while self.where.rowCount():
            self.where.removeRow(0)
        for title, text in self.stored():
            value = QLabel(text, objectName="aboutWhere", wordWrap=True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # paths can be copied
            self.where.addRow(title, value)
        self.voices.setText(self.saved_voices())
        self.erase_voices_button.setEnabled(bool(VoiceLibrary().list()))

    def stored(self) -> list[tuple[str, str]]:
        """(what, where) for everything Parley keeps on this computer, as the page lists it."""
        from huggingface_hub import constants

        from engine.models import locate_model
        from engine.models import models_dir
        from engine.stt.whisper import cache_dir

        files = history_files(self.history_file)
        size = sum(f.stat().st_size for f in files)
        history = (f"{self.history_file}\n{_size(size)} in {len(files)} file(s) (SQLite)" if files else
                   f"{self.history_file}\n(nothing saved yet)")
        rows = [(f"Conversations (profile “{self.history_file.stem}”)", history)]
        others = sorted(p for p in self.history_file.parent.glob("*.sqlite3") if p != self.history_file)
        if others:
            rows.append(("Other profiles", "\n".join(str(p) for p in others)))
        rows.append(("Settings", settings_location(self.settings)))
        for kind, title, key in (("tts", "Speech model", "models/tts"), ("stt", "Speech recognition", "models/stt"),
                                 ("llm", "Language model", "models/llm")):
            found = locate_model(kind, str(self.settings.value(key, "") or ""))
            # the engine's reason is long (it holds the download command): the Models page shows it whole
            rows.append((title, found.where if found.path is not None else
                         "not found on this computer; Settings > Models… finds or downloads it"))
        rows.append(("Downloaded models", str(models_dir())))
        hub = Path(constants.HF_HUB_CACHE)
        rows.append(("Hugging Face cache", f"{hub}" + ("" if hub.exists() else " (not used on this computer)")))
        rows.append(("Caches", f"{cache_dir()} (the bundled Whisper model, assembled once)"))
        return rows

    def saved_voices(self) -> str:
        """What the page says of the saved voices: the folder, how many and how large, their names, and what a voice
        file holds."""
        library = VoiceLibrary()
        voices = library.list()
        names = ", ".join(f"{v.name} (damaged)" if v.damaged else v.name for v in voices)
        return (f"{library.folder}\n{library.summary()[:1].upper()}{library.summary()[1:]}"
                + (f": {names}" if voices else "") + "\n"
                "Each voice is one small file, made from the recording you gave: no recording is kept, but a voice "
                "cloned from its sound and words holds that sound's codes, from which it can be heard again.")

    def open_voices_folder(self) -> bool:
        """Open the saved voices' folder in the file manager (made first if no voice was saved yet)."""
        folder = VoiceLibrary().folder
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)  # the voices are the user's likeness: theirs alone
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    def ask_erase_voices(self) -> QMessageBox:
        """Ask to confirm erasing every saved voice; returns the open message box (Cancel is its default)."""
        return ask_to_confirm(self, "Erase all saved voices?", f"Erase every saved voice ({VoiceLibrary().summary()})? "
                              f"Their files are deleted from {VoiceLibrary().folder}; Parley then speaks in its own "
                              "voice. This cannot be undone.", "Erase all", "eraseVoices", self.erase_voices.emit)

    def open_folder(self) -> bool:
        """Open the history's folder in the file manager (made first if nothing was saved yet)."""
        folder = self.history_file.parent
        folder.mkdir(parents=True, exist_ok=True)
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    def ask_delete(self) -> QMessageBox:
        """Ask to confirm deleting every conversation; returns the open message box (Cancel is its default)."""
        return ask_to_confirm(self, "Delete all history?", f"Delete every saved conversation of profile "
                              f"“{self.history_file.stem}”? They are erased from {self.history_file} and the file is "
                              "rewritten, so no word of them is left in it. This cannot be undone.", "Delete all",
                              "deleteAll", self.delete_history.emit)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"
