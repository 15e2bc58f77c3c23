"""The Models page: for the speech, speech-recognition and language models, and the voice-cloning model that only
those who save their own voices need, whether one is present and where it was found, a way to choose another, and a
hub download with progress and cancel.

Discovery is the engine's (engine/models.py locate_model); downloads are engine/downloads.py, run on a Python
thread whose progress comes back as queued signals. Paths are stored in the shared QSettings keys "models/tts",
"models/stt", "models/llm", "models/base" (empty = find it automatically). With no network the page says so and
gives the command to run on a machine that has one.
Object names for the style sheet: QWidget#modelsPage, QFrame#modelRow and QLabel#modelState (dynamic
property state = "present", "missing" or "downloading"), QLabel#modelTitle, QLabel#modelWhere,
QLabel#offlineHelp, QProgressBar#downloadBar.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.catalogue import Offer
from engine.models import Found, locate_model

STATES = ("present", "missing", "downloading")


@dataclass(frozen=True)
class ModelKind:
    """One row of the page: kind "tts", "stt", "llm" or "clone"; its QSettings key; what Choose… asks for, "folder" or
    "file"; offer: what its Download fetches (engine/catalogue.py); optional: Parley runs without it (the
    voice-cloning model), so it is never "missing"."""

    kind: str
    title: str
    key: str
    pick: str
    offer: Offer
    optional: bool = False

    def label(self) -> str:
        """The offer as its button names it: "Qwen2.5 1.5B Instruct, about 1 GB"."""
        return f"{self.offer.name}, {self.offer.size}"

    def download_folder(self) -> Path:
        return self.offer.download_folder()

    def downloaded_path(self) -> Path:
        return self.offer.downloaded_path()


def _kinds() -> tuple[ModelKind, ...]:
    from engine.catalogue import CLONING, WHISPER_SMALL, recommended, this_machine

    best = recommended(this_machine())
    return (
        ModelKind("tts", "Voice — Qwen3-TTS", "models/tts", "folder", best["tts"]),
        # on a CPU the bundled base is the better fit (a larger Whisper slows every turn); small stays on offer
        ModelKind("stt", "Hearing — Whisper", "models/stt", "folder", best["stt"] or WHISPER_SMALL),
        ModelKind("llm", "Thinking — language model (GGUF)", "models/llm", "file", best["llm"]),
        ModelKind("clone", "Your voices — Qwen3-TTS Base", "models/base", "folder", CLONING, optional=True),
    )


class _Download(QObject):
    """One download on a Python thread; its signals arrive queued in the GUI thread.

    progress(done_bytes, total_bytes): as objects, since model sizes overflow a Qt int.
    finished(str): the kind ("tts", ...) whose download completed.
    failed(str, Exception): the kind, and the DownloadError (or other) its download raised.
    Connect them to bound methods of widgets, never lambdas: only a receiver object makes Qt queue a
    call from this thread into the GUI thread.
    """

    progress = Signal(object, object)
    finished = Signal(str)
    failed = Signal(str, object)

    def __init__(self, kind: ModelKind):
        super().__init__()
        self.kind = kind
        self.cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"download {kind.offer.repo_id}")

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def _run(self) -> None:
        from engine.downloads import download_model

        try:
            # the folder is there only when the page offered to download a damaged model again
            folder = self.kind.download_folder()
            download_model(self.kind.offer.repo_id, folder, files=self.kind.offer.files, progress=self.progress.emit,
                           cancel=self.cancel, replace=folder.exists())
        except Exception as e:  # shown in the row; the page decides how
            self.failed.emit(self.kind.kind, e)
        else:
            self.finished.emit(self.kind.kind)


class ModelRow(QFrame):
    """A model's card: title, state, where it was found (or why it is missing), and its actions.

    Signals:
        progressed(): its download's bytes (done, total) changed.
    """

    progressed = Signal()

    def __init__(self, kind: ModelKind, parent: QWidget | None = None):
        super().__init__(parent)
        self.kind = kind
        self.done = self.total = 0  # its download's bytes, while one runs
        self.setObjectName("modelRow")
        self.title = QLabel(kind.title, objectName="modelTitle")
        self.state = QLabel(objectName="modelState")
        self.where = QLabel(objectName="modelWhere", wordWrap=True)
        self.where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.choose_button = QPushButton("Choose…", objectName="chooseButton",
                                         accessibleName=f"Choose the {kind.title} on this computer")
        self.auto_button = QPushButton("Find automatically", objectName="autoButton")
        self.download_button = QPushButton(f"Download {kind.label()}", objectName="downloadButton")
        self.download_button.setToolTip(f"{kind.offer.name} ({kind.offer.licence}): {kind.offer.why}. From "
                                        f"{kind.offer.repo_id} on the Hugging Face hub into {kind.download_folder()}")
        self.cancel_button = QPushButton("Cancel", objectName="cancelButton")
        self.bar = QProgressBar(objectName="downloadBar", accessibleName=f"{kind.title}: download progress")
        self.bar.setRange(0, 1000)  # per mille: QProgressBar is int-based and models pass 2**31 bytes
        self.bar_text = QLabel(objectName="modelWhere")
        self.offline = QLabel(objectName="offlineHelp", wordWrap=True, textFormat=Qt.TextFormat.PlainText)
        self.offline.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_button = QPushButton("Copy command", objectName="copyButton")

        head = QHBoxLayout()
        head.addWidget(self.title)
        head.addStretch(1)
        head.addWidget(self.state)
        actions = QHBoxLayout()
        actions.addWidget(self.choose_button)
        actions.addWidget(self.auto_button)
        actions.addStretch(1)
        actions.addWidget(self.download_button)
        progress = QHBoxLayout()
        progress.addWidget(self.bar, 1)
        progress.addWidget(self.bar_text)
        progress.addWidget(self.cancel_button)
        offline = QHBoxLayout()
        offline.addWidget(self.offline, 1)
        offline.addWidget(self.copy_button, 0, Qt.AlignmentFlag.AlignTop)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(14, 12, 14, 12)
        layout.addLayout(head)
        layout.addWidget(self.where)
        layout.addLayout(progress)
        layout.addLayout(offline)
        layout.addLayout(actions)
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.command()))

    def command(self) -> str:
        """The command that fetches this model on another machine."""
        from engine.downloads import download_command

        return download_command(self.kind.offer.repo_id, self.kind.download_folder(), self.kind.offer.files)

    def show_found(self, found: Found, setting: str, downloading: bool) -> None:
        """Show a discovery result, or a download under way."""
        state = ("downloading" if downloading else "present" if found.path is not None else
                 "damaged" if found.damaged else "missing")
        self.state.setText({"present": "Ready", "missing": "Not downloaded" if self.kind.optional else "Missing",
                            "damaged": "Cannot be read", "downloading": "Downloading"}[state])
        # a missing model's first clause; the whole message (with the engine's advice) is the tooltip
        self.where.setText(f"Needed only to make and speak in your own voices: {self.kind.offer.why}."
                           if state == "missing" and self.kind.optional else found.headline)
        self.where.setToolTip("" if found.path else found.where)
        self.download_button.setProperty("primary", state in ("missing", "damaged"))
        self.auto_button.setVisible(bool(setting))
        # a damaged download is fetched again in place; a good one needs no button, nor does one chosen elsewhere
        again = (state == "damaged" and self.kind.download_folder().exists()
                 and (not setting or Path(setting) == self.kind.downloaded_path()))
        self.download_button.setText(f"Download {self.kind.label()}" + (" again" if again else ""))
        self.download_button.setVisible(not downloading and (again or not self.kind.download_folder().exists()))
        for widget in (self.bar, self.bar_text, self.cancel_button):
            widget.setVisible(downloading)
        if downloading:
            self.bar.setValue(0)
            self.bar_text.setText("starting…")
        self.show_offline(state in ("missing", "damaged"))
        self._set_state(state)

    def show_offline(self, visible: bool, reason: str = "") -> None:
        """The offline help: what to run on a machine with a network, and where to put the result."""
        self.offline.setText(
            (f"{reason}\n\n" if reason else "")
            + "No network here? On a computer that has one, run:\n"
            f"  {self.command()}\n"
            f"then copy that folder to {self.kind.download_folder()} on this computer "
            f"(or anywhere, and use Choose…)."
        )
        self.offline.setVisible(visible)
        self.copy_button.setVisible(visible)

    def show_progress(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        self.progressed.emit()
        self.bar.setValue(round(1000 * done / total) if total else 0)
        self.bar_text.setText(f"{_megabytes(done)} of {_megabytes(total)}" if total else "asking the hub…")

    def _set_state(self, state: str) -> None:
        for widget in (self, self.state, self.download_button):
            widget.setProperty("state", state)
            widget.style().unpolish(widget)  # the style sheet styles by state
            widget.style().polish(widget)


class ModelsPage(QWidget):
    """The three models' rows; a first-run page and the "Models…" page alike.

    Signals:
        modelsChanged(): a model path changed (chosen, reset, or a download finished); the window
            reloads the engine.
    """

    modelsChanged = Signal()

    def __init__(self, settings: QSettings, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings
        self.setObjectName("modelsPage")
        self.setWindowTitle("Models — Parley")
        self.rows = {kind.kind: ModelRow(kind) for kind in _kinds()}
        self.downloads: dict[str, _Download] = {}
        self.summary = QLabel(objectName="hint", wordWrap=True)
        self.get_recommended_button = QPushButton("Get the recommended models", objectName="getRecommended")
        self.get_recommended_button.setProperty("primary", True)
        self.get_recommended_button.clicked.connect(self.get_recommended)
        # every download under way in one bar, as "Get the recommended models" starts several
        self.total_bar = QProgressBar(objectName="downloadBar", accessibleName="All downloads: progress")
        self.total_bar.setRange(0, 1000)
        self.total_text = QLabel(objectName="modelWhere")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 16, 16, 16)
        layout.setSpacing(12)
        layout.addWidget(QLabel("Models", objectName="headline"))
        layout.addWidget(self.summary)
        layout.addWidget(self.get_recommended_button, 0, Qt.AlignmentFlag.AlignLeft)
        total = QHBoxLayout()
        total.addWidget(self.total_bar, 1)
        total.addWidget(self.total_text)
        layout.addLayout(total)
        for name, row in self.rows.items():
            layout.addWidget(row)
            row.progressed.connect(self._show_total)
            row.choose_button.clicked.connect(lambda _=False, n=name: self.ask_choose(n))
            row.auto_button.clicked.connect(lambda _=False, n=name: self.set_path(n, ""))
            row.download_button.clicked.connect(lambda _=False, n=name: self.start_download(n))
            row.cancel_button.clicked.connect(lambda _=False, n=name: self.cancel_download(n))
        layout.addStretch(1)
        close = QPushButton("Close", objectName="modelsClose")
        close.clicked.connect(self.close)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(close)
        layout.addLayout(buttons)
        # a page closed mid-download stops its transfers (what they fetched is kept for next time)
        events = self.downloads
        self.destroyed.connect(lambda *_: [d.cancel.set() for d in events.values()])
        self.refresh()

    def refresh(self) -> None:
        """Look for every model again and show what was found."""
        self.found = {}
        for name, row in self.rows.items():
            setting = self._setting(name)
            self.found[name] = locate_model(name, setting)
            row.show_found(self.found[name], setting, name in self.downloads)
        unusable = [self.rows[n].kind.title.split(" — ")[0] + (" (cannot be read)" if f.damaged else "")
                    for n, f in self.found.items() if f.path is None and not self.rows[n].kind.optional]
        todo = self.recommended_downloads()
        offers = "; ".join(f"{row.kind.offer.name} ({row.kind.offer.size}, {row.kind.offer.licence})"
                           for row in (self.rows[n] for n in todo))
        self.summary.setText(
            ("Everything Parley needs is on this computer; nothing you say leaves it." if not unusable else
             f"Missing: {', '.join(unusable)}. Download what is missing, or choose a model that is already on this "
             "computer. Parley never uploads anything; downloads come from the Hugging Face hub.")
            + (f"\nRecommended for this computer: {offers}." if todo else "")
        )
        self.get_recommended_button.setVisible(bool(todo))
        self._show_total()

    def _show_total(self) -> None:
        """The downloads under way together: one bar, and how many bytes of how many."""
        rows = [self.rows[name] for name in self.downloads]
        done, total = sum(r.done for r in rows), sum(r.total for r in rows)
        self.total_bar.setVisible(bool(rows))
        self.total_text.setVisible(bool(rows))
        self.total_bar.setValue(round(1000 * done / total) if total else 0)
        models = "1 model" if len(rows) == 1 else f"{len(rows)} models"
        self.total_text.setText(f"{models}: {_megabytes(done)} of {_megabytes(total)}" if total else
                                f"{models}: asking the hub…")

    def recommended_downloads(self) -> list[str]:
        """The kinds "Get the recommended models" fetches (engine/catalogue.py to_download), less those under way."""
        from engine.catalogue import this_machine, to_download

        return [offer.kind for offer in to_download(self.found, this_machine()) if offer.kind not in self.downloads]

    def get_recommended(self) -> None:
        """Download every recommended model not here yet, side by side, each with its own progress."""
        for name in self.recommended_downloads():
            self.start_download(name)

    def missing(self) -> list[str]:
        """The kinds ("tts", "stt", "llm") with no model found; the window shows this page at start when any is. The
        optional voice-cloning model is never missing."""
        return [name for name, found in self.found.items() if found.path is None and not self.rows[name].kind.optional]

    def _setting(self, name: str) -> str:
        return str(self.settings.value(self.rows[name].kind.key, "") or "")

    # -- choosing

    def ask_choose(self, name: str) -> QFileDialog:
        """Open the folder (TTS, STT) or file (LLM) chooser for a model; returns the open dialog."""
        kind = self.rows[name].kind
        start = self._setting(name) or str(kind.download_folder().parent)
        dialog = QFileDialog(self, f"Choose the {kind.title.split(' — ')[1]} model", start)
        dialog.setObjectName("chooseDialog")
        dialog.setOption(QFileDialog.Option.DontUseNativeDialog)  # styled like Parley, the same everywhere
        if kind.pick == "folder":
            dialog.setFileMode(QFileDialog.FileMode.Directory)
            dialog.setOption(QFileDialog.Option.ShowDirsOnly)
        else:
            dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
            dialog.setNameFilters(["GGUF models (*.gguf)", "All files (*)"])
        dialog.fileSelected.connect(lambda path: self.set_path(name, path))
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def set_path(self, name: str, path: str) -> None:
        """Store a model path ("" = find automatically), show the result, and emit modelsChanged."""
        self.settings.setValue(self.rows[name].kind.key, path)
        self.settings.sync()
        self.refresh()
        self.modelsChanged.emit()

    # -- downloading

    def start_download(self, name: str) -> None:
        """Start downloading a model from the hub (no-op while one for that row runs)."""
        if name in self.downloads:
            return
        download = _Download(self.rows[name].kind)
        self.rows[name].done = self.rows[name].total = 0
        download.progress.connect(self.rows[name].show_progress)
        download.finished.connect(self._download_finished)
        download.failed.connect(self._download_failed)
        self.downloads[name] = download
        self.refresh()
        download.start()

    def cancel_download(self, name: str) -> None:
        """Stop a running download; it ends with DownloadCancelled (its bytes kept for a resume)."""
        if name in self.downloads:
            self.downloads[name].cancel.set()
            self.rows[name].bar_text.setText("cancelling…")

    def _download_finished(self, name: str) -> None:
        self.downloads.pop(name).join(5.0)
        self.set_path(name, str(self.rows[name].kind.downloaded_path()))

    def _download_failed(self, name: str, error: Exception) -> None:
        from engine.downloads import DownloadCancelled, NoNetworkError

        self.downloads.pop(name).join(5.0)
        self.refresh()
        row = self.rows[name]
        if isinstance(error, NoNetworkError):
            row.show_offline(True, "This computer cannot reach the Hugging Face hub.")
        elif isinstance(error, DownloadCancelled):
            row.where.setText(f"Download cancelled; what was fetched is kept, and Download resumes it. "
                              f"{self.found[name].where if self.found[name].path else ''}".strip())
        else:
            row.where.setText(f"Download failed: {error}")


def _megabytes(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"
