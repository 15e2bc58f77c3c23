"""What a screen reader reads: every control of every window has a name (Qt's accessibility interface, the one
AT-SPI, UI Automation and VoiceOver ask), and the ones whose purpose a name cannot say have a description."""

import pytest
from PySide6.QtGui import QAccessible
from PySide6.QtWidgets import (QAbstractButton, QAbstractItemView, QAbstractSpinBox, QComboBox, QKeySequenceEdit,
                               QLineEdit, QPlainTextEdit, QProgressBar, QTabBar, QTextEdit, QWidget)

from app.main_window import MainWindow
from app.settings_dialog import SettingsDialog
from engine.events import Ready
from tests.app.conftest import INFO

CONTROLS = (QAbstractButton, QAbstractItemView, QAbstractSpinBox, QComboBox, QKeySequenceEdit, QLineEdit,
            QPlainTextEdit, QProgressBar, QTextEdit)
PARTS_OF = (*CONTROLS, QTabBar)


def unnamed(window: QWidget) -> list[str]:
    """The controls in `window` that a screen reader would announce without a name; hidden ones (a notice bar
    with nothing to say) and the parts of a control (a field's clear button, a combo box's list, a tab bar's
    arrows: read as the control) are not asked."""
    missing = []
    for widget in window.findChildren(QWidget):
        chain = [widget]
        while chain[-1] is not window and chain[-1].parent() is not None:
            chain.append(chain[-1].parent())
        if (not isinstance(widget, CONTROLS) or widget.objectName().startswith("qt_")
                or any(w.isHidden() for w in chain[:-1]) or any(isinstance(w, PARTS_OF) for w in chain[1:-1])):
            continue
        if not QAccessible.queryAccessibleInterface(widget).text(QAccessible.Text.Name).strip():
            missing.append(f"{type(widget).__name__} {widget.objectName() or '(no object name)'}")
    return missing


@pytest.fixture
def window(qtbot, settings, tmp_path):
    window = MainWindow(settings, history_file=tmp_path / "history.sqlite3")
    qtbot.addWidget(window)
    window.show()
    window.worker.event.emit(Ready(INFO))
    return window


def test_every_control_of_the_main_window_has_a_name(window):
    assert unnamed(window) == []


def test_every_control_of_the_settings_has_a_name(qtbot, settings):
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    assert unnamed(dialog) == []


def test_every_control_of_the_new_voice_dialog_has_a_name(qtbot, settings):
    """Its inputs, Record, the meter, and the working bar and Open Models… where they show."""
    from app.voice_dialog import VoiceDialog
    from engine.errors import ModelMissingError

    dialog = VoiceDialog("")
    qtbot.addWidget(dialog)
    dialog.show()
    assert unnamed(dialog) == []
    dialog.show_result("Me", None, ModelMissingError("no Base model"))
    assert dialog.action_button.isVisible() and unnamed(dialog) == []


@pytest.mark.parametrize("opener", ["open_models", "open_history", "open_about"])
def test_every_control_of_models_history_and_about_has_a_name(window, opener):
    assert unnamed(getattr(window, opener)()) == []


def test_the_controls_a_name_cannot_explain_have_a_description(window):
    """The talk button, the message box and the conversation say what they do, not only what they are."""
    for widget in (window.talk_button, window.message, window.chat, window.meter.level):
        interface = QAccessible.queryAccessibleInterface(widget)
        assert interface.text(QAccessible.Text.Description).strip(), widget.objectName()
