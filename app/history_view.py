"""Past conversations from the SQLite store (engine/history.py): listed newest first with their date
and turn count, previewed, reopened, exported as text or JSON, and deleted after a confirmation.

The store belongs to the thread that made it (sqlite3 connections do): give this view one made in the
GUI thread; the worker writes turns through its own, and WAL lets both see each other's commits.
File and confirmation dialogs open with open(), so the event loop never blocks on them.
Object names for the style sheet: QWidget#historyView, QListWidget#historyList,
QPlainTextEdit#historyPreview, QLabel#historyDetail, QLabel#headline.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from PySide6.QtCore import QDateTime, QLocale, QStandardPaths, Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.confirm import ask_to_confirm
from app.errors import ErrorDialog, problem_for
from engine.errors import HistoryError
from engine.history import ConversationSummary, HistoryStore

EXPORT_FILTERS = {"Text (*.txt)": ".txt", "JSON (*.json)": ".json"}
_ID_ROLE = Qt.ItemDataRole.UserRole
_PICK = "Select a conversation to read it here."


class HistoryView(QWidget):
    """The conversation list with Open, Export… and Delete; a preview of the selected conversation.

    Signals:
        reopen(int): the user asked to continue a conversation; carries its id.
        deleted(int): a conversation was deleted; carries its id (the window drops it if it is open).
    """

    reopen = Signal(int)
    deleted = Signal(int)

    def __init__(self, store: HistoryStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.store = store
        self.setObjectName("historyView")
        self.setWindowTitle("History — Parley")
        self.filter = QLineEdit(objectName="historyFilter", placeholderText="Search conversations",
                                clearButtonEnabled=True, accessibleName="Search conversations")
        self.list = QListWidget(objectName="historyList", accessibleName="Conversations")
        self.list.setWordWrap(True)
        self.preview = QPlainTextEdit(objectName="historyPreview", readOnly=True, accessibleName="The conversation")
        self.preview.setPlaceholderText(_PICK)
        self.empty = QLabel("No conversations yet. What you and Parley say is kept here, on this computer only.",
                            objectName="historyDetail", wordWrap=True, alignment=Qt.AlignmentFlag.AlignCenter)
        self.open_button = QPushButton("Open", objectName="historyOpen")
        self.open_button.setProperty("primary", True)
        self.export_button = QPushButton("Export…", objectName="historyExport")
        self.delete_button = QPushButton("Delete…", objectName="historyDelete")
        self.delete_button.setProperty("danger", True)

        split = QSplitter(Qt.Orientation.Horizontal)
        left = QWidget()
        column = QVBoxLayout(left)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.filter)
        column.addWidget(self.list, 1)
        column.addWidget(self.empty, 1)
        split.addWidget(left)
        split.addWidget(self.preview)
        split.setStretchFactor(1, 2)
        buttons = QHBoxLayout()
        buttons.addWidget(self.delete_button)
        buttons.addStretch(1)
        buttons.addWidget(self.export_button)
        buttons.addWidget(self.open_button)
        close = QPushButton("Close", objectName="historyClose")
        close.clicked.connect(self.close)
        buttons.addWidget(close)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 16, 16, 16)
        layout.addWidget(QLabel("History", objectName="headline"))
        layout.addWidget(split, 1)
        layout.addLayout(buttons)

        self.filter.textChanged.connect(self._apply_filter)
        self.list.currentItemChanged.connect(lambda *_: self._show_selected())
        self.list.itemActivated.connect(lambda _item: self._reopen())
        self.open_button.clicked.connect(self._reopen)
        self.export_button.clicked.connect(self.ask_export)
        self.delete_button.clicked.connect(self.ask_delete)
        self.refresh()

    # -- the list

    def refresh(self) -> None:
        """Reload the list from the store, keeping the selection where that conversation still exists."""
        selected = self.selected_id()
        try:
            summaries = self.store.list_conversations()
        except HistoryError as e:
            summaries = []
            self._show_error(e, "reading the history")
        self.list.clear()
        for summary in summaries:
            item = QListWidgetItem(f"{summary.title or 'Untitled conversation'}\n{describe(summary)}")
            item.setData(_ID_ROLE, summary.id)
            item.setToolTip(summary.title)
            self.list.addItem(item)
            if summary.id == selected:
                self.list.setCurrentItem(item)
        if self.list.currentItem() is None and self.list.count():
            self.list.setCurrentRow(0)
        self.list.setVisible(bool(summaries))
        self.empty.setVisible(not summaries)
        self._apply_filter(self.filter.text())
        self._show_selected()

    def selected_id(self) -> int | None:
        """The id of the selected conversation, or None."""
        item = self.list.currentItem()
        return None if item is None or item.isHidden() else item.data(_ID_ROLE)

    def select(self, conversation_id: int) -> None:
        """Select a conversation by id (no-op for an id not listed)."""
        for row in range(self.list.count()):
            if self.list.item(row).data(_ID_ROLE) == conversation_id:
                self.list.setCurrentRow(row)
                return

    def _apply_filter(self, text: str) -> None:
        """Show the conversations whose title or turns hold every word of `text` (HistoryStore.search)."""
        if not self.list.count():  # nothing to show, or the history could not be read (refresh said so)
            self._show_selected()
            return
        try:
            shown = self.store.search(text)
        except HistoryError as e:
            self._show_error(e, "searching the history")
            return
        found = 0
        for row in range(self.list.count()):
            item = self.list.item(row)
            item.setHidden(item.data(_ID_ROLE) not in shown)
            found += not item.isHidden()
        self.preview.setPlaceholderText(_PICK if found else f"No conversation holds “{text.strip()}”.")
        self._show_selected()

    def _show_selected(self) -> None:
        cid = self.selected_id()
        for button in (self.open_button, self.export_button, self.delete_button):
            button.setEnabled(cid is not None)
        if cid is None:
            self.preview.clear()
            return
        try:
            self.preview.setPlainText(self.store.export_text(cid))
        except HistoryError as e:
            self.preview.setPlainText(str(e))

    def showEvent(self, event) -> None:
        self.refresh()  # the worker may have added turns since this view last looked
        super().showEvent(event)

    # -- actions

    def _reopen(self) -> None:
        cid = self.selected_id()
        if cid is not None:
            self.reopen.emit(cid)

    def ask_export(self) -> QFileDialog | None:
        """Ask where to export the selected conversation (text or JSON); returns the open dialog."""
        cid = self.selected_id()
        if cid is None:
            return None
        name = self.list.currentItem().toolTip() or f"conversation-{cid}"
        folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation) or str(Path.home())
        dialog = QFileDialog(self, "Export conversation", str(Path(folder) / (safe_file_name(name) + ".txt")))
        dialog.setObjectName("exportDialog")
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setNameFilters(list(EXPORT_FILTERS))
        dialog.setDefaultSuffix("txt")
        # Qt's own dialog: styled like the rest of Parley, and the same on every desktop
        dialog.setOption(QFileDialog.Option.DontUseNativeDialog)
        dialog.filterSelected.connect(lambda f: dialog.setDefaultSuffix(EXPORT_FILTERS[f].lstrip(".")))
        dialog.fileSelected.connect(lambda path: self.export_to(cid, Path(path)))
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def export_to(self, conversation_id: int, path: Path) -> bool:
        """Write a conversation to `path`: JSON for a .json name, else plain text; False (and an error
        dialog) when it cannot be written. The file appears whole or not at all (temp file, then rename)."""
        try:
            text = (self.store.export_json(conversation_id) if path.suffix.lower() == ".json"
                    else self.store.export_text(conversation_id))
            _write_atomically(path, text)
        except (HistoryError, OSError) as e:
            self._show_error(e, "exporting the conversation")
            return False
        return True

    def ask_delete(self) -> QMessageBox | None:
        """Ask to confirm deleting the selected conversation; returns the open message box."""
        cid = self.selected_id()
        if cid is None:
            return None
        title = self.list.currentItem().text().split("\n")[0]
        return ask_to_confirm(self, "Delete conversation?", f"Delete “{title}” and all its turns? This cannot be "
                              "undone.", "Delete", "delete", lambda: self.delete(cid))

    def delete(self, conversation_id: int) -> None:
        """Delete a conversation from the store (no confirmation: ask_delete asks) and refresh the list."""
        try:
            self.store.delete_conversation(conversation_id)
        except HistoryError as e:
            self._show_error(e, "deleting the conversation")
            return
        self.refresh()
        self.deleted.emit(conversation_id)

    def _show_error(self, error: Exception, doing: str) -> None:
        dialog = ErrorDialog(problem_for(error, doing), self)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()


def describe(summary: ConversationSummary) -> str:
    """'2 Dec 2026, 17:40 · 6 turns': the list's second line, month named in the user's language."""
    # a fixed day-month-year order: the locale's short numeric date ("2 12 2026" in C) is ambiguous
    when = QLocale().toString(QDateTime.fromSecsSinceEpoch(int(summary.updated_at)), "d MMM yyyy, HH:mm")
    turns = f"{summary.turn_count} turn" + ("" if summary.turn_count == 1 else "s")
    return f"{when} · {turns}"


def safe_file_name(title: str) -> str:
    """A title as a file name: no path separators or characters Windows refuses, at most 60 characters."""
    name = re.sub(r'[\\/:*?"<>|\x00-\x1f]+', " ", title).strip(" .")
    return " ".join(name.split())[:60] or "conversation"


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
