"""HistoryView driven offscreen over a real SQLite history: list, preview, filter, reopen, export, delete."""

import json

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox

from app.history_view import HistoryView, safe_file_name
from engine.history import HistoryStore, Turn


@pytest.fixture
def store(tmp_path):
    with HistoryStore(tmp_path / "history.sqlite3") as history:
        older = history.new_conversation()
        history.add_turn(older, Turn("user", "What is the capital of France?", created_at=1_000.0))
        history.add_turn(older, Turn("assistant", "Paris.", created_at=1_001.0))
        newer = history.new_conversation()
        history.add_turn(newer, Turn("user", "Tell me a story about a fox", created_at=2_000.0))
        history.add_turn(newer, Turn("assistant", "Once upon a time, a fox", heard_text="Once upon",
                                     interrupted=True, created_at=2_001.0))
        history.add_turn(newer, Turn("user", "Shorter, please.", created_at=2_002.0))
        yield history


@pytest.fixture
def view(qtbot, store):
    widget = HistoryView(store)
    qtbot.addWidget(widget)
    widget.show()
    return widget


def _rows(view):
    return [view.list.item(r).text() for r in range(view.list.count()) if not view.list.item(r).isHidden()]


def test_lists_conversations_newest_first_with_turn_counts_and_previews_the_selection(view, store):
    """Each row shows the title and 'N turns'; the newest is selected and its text is in the preview."""
    rows = _rows(view)
    assert rows[0].startswith("Tell me a story about a fox\n") and rows[0].endswith("· 3 turns")
    assert rows[1].startswith("What is the capital of France?\n") and rows[1].endswith("· 2 turns")
    assert view.preview.toPlainText() == store.export_text(view.selected_id())
    assert "[interrupted; heard up to: “Once upon”]" in view.preview.toPlainText()


def test_open_and_double_click_emit_reopen_with_the_conversation_id(view, qtbot, store):
    """The Open button and activating a row both emit reopen(id) for the selected conversation."""
    france = store.list_conversations()[1].id
    view.select(france)
    with qtbot.waitSignal(view.reopen) as opened:
        qtbot.mouseClick(view.open_button, Qt.MouseButton.LeftButton)
    assert opened.args == [france]
    view.list.setFocus()
    with qtbot.waitSignal(view.reopen) as activated:
        qtbot.keyClick(view.list, Qt.Key.Key_Return)
    assert activated.args == [france]


def test_filter_keeps_the_conversations_that_hold_the_words_in_any_turn(view):
    """Typing in the search box keeps only the conversations holding every word, in the title or in any turn
    (a reply, a later question), in any case; an empty search shows them all again."""
    view.filter.setText("fox")
    assert len(_rows(view)) == 1 and "fox" in _rows(view)[0]
    view.filter.setText("PARIS")  # only in the France conversation's reply
    assert len(_rows(view)) == 1 and "France" in _rows(view)[0]
    view.filter.setText("story shorter")  # the title's word and a later turn's
    assert len(_rows(view)) == 1 and "fox" in _rows(view)[0]
    view.filter.setText("no such words")
    assert _rows(view) == [] and not view.open_button.isEnabled() and view.preview.toPlainText() == ""
    assert view.preview.placeholderText() == "No conversation holds “no such words”."  # not "Select a conversation"
    view.filter.clear()
    assert len(_rows(view)) == 2 and view.preview.placeholderText().startswith("Select a conversation")


def test_export_through_the_file_dialog_writes_text_or_json(view, qtbot, store, tmp_path):
    """Choosing a .txt file writes the text export; choosing the JSON filter writes the JSON export."""
    cid = view.selected_id()
    qtbot.mouseClick(view.export_button, Qt.MouseButton.LeftButton)
    dialog = view.findChild(QFileDialog, "exportDialog")
    assert dialog is not None and dialog.isVisible()
    dialog.selectFile(str(tmp_path / "fox.txt"))
    dialog.accept()
    assert (tmp_path / "fox.txt").read_text(encoding="utf-8") == store.export_text(cid)

    dialog = view.ask_export()
    dialog.selectNameFilter("JSON (*.json)")
    dialog.filterSelected.emit("JSON (*.json)")  # what the dialog's filter box sends when the user picks it
    dialog.selectFile(str(tmp_path / "fox"))
    dialog.accept()
    doc = json.loads((tmp_path / "fox.json").read_text(encoding="utf-8"))
    assert doc == json.loads(store.export_json(cid))
    assert [t["role"] for t in doc["turns"]] == ["user", "assistant", "user"]


def test_export_into_a_missing_folder_shows_a_readable_error_and_writes_nothing(view, tmp_path):
    """An unwritable place is an error dialog naming the path; no file or temp file is left."""
    target = tmp_path / "no-such-folder" / "out.txt"
    assert view.export_to(view.selected_id(), target) is False
    box = view.findChild(QMessageBox, "errorDialog")
    assert box is not None and box.isVisible()
    assert "exporting the conversation" in box.text() and "no-such-folder" in box.informativeText()
    assert not target.parent.exists()


def test_delete_asks_first_cancel_keeps_it_and_confirm_removes_it(view, qtbot, store):
    """Delete… opens a confirmation; Cancel changes nothing; Delete removes the conversation everywhere."""
    cid = view.selected_id()
    box = view.ask_delete()
    assert box.isVisible() and "cannot be undone" in box.text()
    box.button(QMessageBox.StandardButton.Cancel).click()
    assert [s.id for s in store.list_conversations()].count(cid) == 1 and len(_rows(view)) == 2

    qtbot.mouseClick(view.delete_button, Qt.MouseButton.LeftButton)
    box = view.findChild(QMessageBox, "deleteConfirm")
    with qtbot.waitSignal(view.deleted) as gone:
        qtbot.mouseClick(box.findChild(type(view.open_button), "confirmDelete"), Qt.MouseButton.LeftButton)
    assert gone.args == [cid]
    assert cid not in [s.id for s in store.list_conversations()]
    assert len(_rows(view)) == 1 and view.selected_id() != cid


def test_an_empty_history_explains_itself_and_disables_the_actions(qtbot, tmp_path):
    """With no conversations the list gives way to a one-line explanation and no action is enabled."""
    with HistoryStore(tmp_path / "empty.sqlite3") as empty:
        widget = HistoryView(empty)
        qtbot.addWidget(widget)
        widget.show()
        assert widget.empty.isVisible() and not widget.list.isVisible()
        assert not any(b.isEnabled() for b in (widget.open_button, widget.export_button, widget.delete_button))
        cid = empty.new_conversation("Later")
        widget.refresh()
        assert widget.list.isVisible() and widget.selected_id() == cid


def test_titles_become_safe_file_names():
    """Separators and characters Windows refuses become spaces; an empty result has a fallback."""
    assert safe_file_name('What is a/b: "c"?') == "What is a b c"
    assert safe_file_name("..") == "conversation"
