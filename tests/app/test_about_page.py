"""The About / Privacy page on real widgets and a real SQLite history file: what it says is stored where,
opening the folder, and deleting all history (asked first; erased in place, not a byte of it left in the
file, its -wal or -shm, and the History view shows the empty store)."""

import sqlite3

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QLabel, QMessageBox, QPushButton

from app.about_page import LICENSES, AboutPage, parley_version
from app.errors import erase_failed
from app.main_window import MainWindow
from engine.history import HistoryStore, Turn, erase_history
from tests.test_history import bytes_on_disk

SECRET = "my bank PIN is zebra-4711"  # what must not survive "Delete all history"


def save_conversation(path, text=SECRET) -> int:
    with HistoryStore(path) as store:
        cid = store.new_conversation()
        store.add_turn(cid, Turn("user", text))
        store.add_turn(cid, Turn("assistant", "I will forget it when you ask."))
    return cid


def files_of(path):
    return [path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm")]


def page_text(page: AboutPage) -> str:
    form = page.where
    return "\n".join(form.itemAt(row, role).widget().text() for row in range(form.rowCount())
                     for role in (form.ItemRole.LabelRole, form.ItemRole.FieldRole))


@pytest.fixture
def history_file(tmp_path):
    return tmp_path / "data" / "parley" / "history" / "default.sqlite3"


def test_the_page_says_where_this_machine_keeps_history_settings_and_models(qtbot, settings, history_file,
                                                                              monkeypatch, tmp_path):
    """History file (size), other profiles, the settings file, the model folders and caches are this machine's
    real paths; the version and one line per licence are shown."""
    from huggingface_hub import constants

    monkeypatch.setenv("PARLEY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    page = AboutPage(settings.store, history_file)
    qtbot.addWidget(page)
    assert f"{history_file}\n(nothing saved yet)" in page_text(page)

    save_conversation(history_file)
    save_conversation(history_file.with_name("work.sqlite3"), "another profile")
    page.refresh()
    text = page_text(page)
    assert "profile “default”" in text and "(SQLite)" in text and str(history_file) in text
    assert str(history_file.with_name("work.sqlite3")) in text
    assert settings.store.fileName() in text and str(tmp_path / "models") in text
    assert str(constants.HF_HUB_CACHE) in text and str(tmp_path / "cache" / "parley") in text
    assert "Chosen" not in text  # nothing chosen in these settings: the models are looked for
    labels = "\n".join(label.text() for label in page.findChildren(QLabel))
    assert f"Parley {parley_version()}" in labels and parley_version() != "unknown"
    assert all(f"{name}: {licence}" in labels for name, licence in LICENSES)
    assert "telemetry" in labels and "network blocked" in labels
    assert "tests/" not in labels and "Parley: Apache" not in labels  # a user's words, not a developer's


class Desktop(QObject):
    """Receives the file: URLs Qt would hand to the desktop's file manager."""

    def __init__(self):
        super().__init__()
        self.opened = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.opened.append(url.toLocalFile())


def test_open_the_folder_hands_the_history_folder_to_the_file_manager(qtbot, settings, history_file):
    """The button asks the desktop to open the folder the history lives in (made first if need be)."""
    desktop = Desktop()
    QDesktopServices.setUrlHandler("file", desktop, "open")
    try:
        page = AboutPage(settings.store, history_file)
        qtbot.addWidget(page)
        page.open_button.click()
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert desktop.opened == [str(history_file.parent)] and history_file.parent.is_dir()


def test_cancel_keeps_every_conversation(qtbot, settings, history_file):
    """Delete all history… asks first; Cancel (the default button) deletes nothing."""
    cid = save_conversation(history_file)
    page = AboutPage(settings.store, history_file)
    qtbot.addWidget(page)
    page.show()
    with qtbot.assertNotEmitted(page.delete_history):
        page.delete_button.click()
        box = page.findChild(QMessageBox, "deleteAllConfirm")
        assert box.isVisible() and str(history_file) in box.text()
        assert box.defaultButton() is box.button(QMessageBox.StandardButton.Cancel)
        box.defaultButton().click()
    with HistoryStore(history_file) as store:
        assert [c.id for c in store.list_conversations()] == [cid]


def test_delete_all_history_erases_it_in_place_and_the_history_view_shows_it_empty(qtbot, settings, history_file):
    """From the window (F1, no engine running): confirmed, every conversation is erased from the file, not a
    byte of the old conversation is left in it, its -wal or -shm, the open History view shows no
    conversations, the chat is cleared."""
    save_conversation(history_file)
    window = MainWindow(settings, history_file=history_file)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    window.chat.add_user(SECRET)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)  # the menus' shortcuts act on the active window
    qtbot.keyClick(window.chat, Qt.Key.Key_H, Qt.KeyboardModifier.ControlModifier)
    assert window.history_view.list.count() == 1
    assert all(f.exists() for f in files_of(history_file))  # WAL mode: an open connection has all three
    assert SECRET.encode() in bytes_on_disk(history_file)

    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    qtbot.keyClick(window.chat, Qt.Key.Key_F1)
    page = window.about_page
    assert page is not None and page.isVisible() and "(SQLite)" in page_text(page)
    page.delete_button.click()
    page.findChild(QMessageBox, "deleteAllConfirm").findChild(QPushButton, "confirmDeleteAll").click()

    qtbot.waitUntil(lambda: window.history_view is not None and window.history_view.isVisible())
    view = window.history_view
    assert view.list.count() == 0 and view.empty.isVisibleTo(view)
    assert SECRET.encode() not in bytes_on_disk(history_file)
    with sqlite3.connect(history_file) as db:  # the same file, empty
        assert db.execute("SELECT COUNT(*) FROM turns").fetchone() == (0,)
    assert window.chat.bubbles == [] and "deleted" in window.statusBar().currentMessage()
    assert "(SQLite)" in page_text(page)  # refreshed: it now lists the new, empty file


def test_erasing_a_locked_history_is_a_clear_error_and_deletes_nothing(history_file):
    """Another program holding the write lock: erase_history raises a HistoryError naming the file and the
    lock, shown as "The history could not be erased"; every conversation is still there."""
    from engine.errors import HistoryError

    cid = save_conversation(history_file)
    locker = sqlite3.connect(history_file, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    with pytest.raises(HistoryError, match="locked") as raised:
        erase_history(history_file)
    locker.execute("ROLLBACK")
    locker.close()
    problem = erase_failed(raised.value)
    assert problem.headline == "The history could not be erased" and str(history_file) in problem.detail
    with HistoryStore(history_file) as store:
        assert [c.id for c in store.list_conversations()] == [cid]


def test_erasing_a_history_never_saved_makes_no_file(history_file):
    """Nothing saved yet: erase_history has nothing to erase and leaves no file behind."""
    erase_history(history_file)
    assert not history_file.exists() and not history_file.parent.exists()


def test_the_saved_voices_are_listed_opened_and_erased_after_asking(qtbot, settings, history_file, voices, cloned):
    """The page lists the saved voices (their folder, how many and how large, their names, what a voice file holds);
    Open the voices folder hands it to the file manager; Erase all saved voices… asks first (Cancel the default),
    and confirmed from the window (no engine running) deletes every voice, clears the setting that chose one, and
    the page shows none."""
    voices.add("Grandma Ann", cloned)
    voices.add("Bob", cloned)
    settings.saved_voice = "Bob"
    window = MainWindow(settings, history_file=history_file)
    qtbot.addWidget(window)
    window.show()
    page = window.open_about()
    text = page.voices.text()
    assert str(voices.folder) in text and "2 voices, " in text and "Bob, Grandma Ann" in text
    assert "no recording is kept" in text and page.erase_voices_button.isEnabled()

    desktop = Desktop()
    QDesktopServices.setUrlHandler("file", desktop, "open")
    try:
        page.open_voices_button.click()
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert desktop.opened == [str(voices.folder)]

    with qtbot.assertNotEmitted(page.erase_voices):
        page.erase_voices_button.click()
        box = page.findChild(QMessageBox, "eraseVoicesConfirm")
        assert box.isVisible() and "2 voices" in box.text()
        assert box.defaultButton() is box.button(QMessageBox.StandardButton.Cancel)
        box.defaultButton().click()
    assert len(voices.list()) == 2
    page.erase_voices_button.click()
    [box] = [b for b in page.findChildren(QMessageBox, "eraseVoicesConfirm") if b.isVisible()]
    box.findChild(QPushButton, "confirmEraseVoices").click()
    assert voices.list() == [] and not voices.folder.exists() and settings.saved_voice == ""
    assert "None saved" in page.voices.text() and not page.erase_voices_button.isEnabled()
    assert window.statusBar().currentMessage() == "2 saved voices deleted from this computer"
