"""Asking before something is deleted: one warning box for every destructive action in the window."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QMessageBox, QWidget


def ask_to_confirm(parent: QWidget, title: str, text: str, action: str, key: str,
                   confirmed: Callable[[], None]) -> QMessageBox:
    """Open a warning box whose default is Cancel (so Enter and Esc keep everything) beside a red `action` button that
    calls `confirmed`; returns the open box. `key` names it for tests and accessibility: the box is "{key}Confirm",
    the button "confirm{Key}"."""
    box = QMessageBox(QMessageBox.Icon.Warning, title, text, parent=parent)
    box.setObjectName(f"{key}Confirm")
    button = box.addButton(action, QMessageBox.ButtonRole.DestructiveRole)
    button.setObjectName(f"confirm{key[0].upper()}{key[1:]}")
    button.setProperty("danger", True)
    box.setDefaultButton(box.addButton(QMessageBox.StandardButton.Cancel))
    box.buttonClicked.connect(lambda clicked: confirmed() if clicked is button else None)
    box.finished.connect(box.deleteLater)
    box.open()
    return box
