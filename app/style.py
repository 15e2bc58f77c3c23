"""Parley's look: the Fusion style, a palette and style sheet in the light or dark scheme, the app icon.

The colours live in assets/themes.json and the rules in assets/style.qss (one sheet for both schemes,
its @names filled from the scheme's colours); the palette is built from the same colours, so widgets
that paint themselves (the meter's chart and level bar) match. "system" follows the desktop's colour
scheme (QStyleHints.colorScheme, Qt 6.5+), also when it changes while Parley runs.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QIcon, QPalette
from PySide6.QtWidgets import QApplication

__all__ = ["ASSETS", "THEMES", "app_icon", "apply_style", "colors", "palette", "scheme_for", "style_sheet"]

# inside app/ in a wheel (pyproject.toml); beside it in a checkout, and build_app.spec puts it there in the bundle
_HERE = Path(__file__).resolve().parent
ASSETS = _HERE / "assets" if (_HERE / "assets").is_dir() else _HERE.parent / "assets"
THEMES = ("system", "light", "dark")
_TOKEN = re.compile(r"@([a-z_]+)")


@cache
def colors(scheme: str) -> dict[str, str]:
    """The named colours of "light" or "dark" (assets/themes.json)."""
    if scheme not in ("light", "dark"):
        raise ValueError(f"unknown colour scheme {scheme!r}; choose light or dark")
    return json.loads((ASSETS / "themes.json").read_text(encoding="utf-8"))[scheme]


def style_sheet(scheme: str) -> str:
    """assets/style.qss with every @name replaced by its colour in `scheme`, and @assets by the assets folder.

    Raises:
        KeyError: the sheet names a colour themes.json lacks (the tests catch it, never a user).
    """
    named = {**colors(scheme), "assets": ASSETS.as_posix()}
    return _TOKEN.sub(lambda m: named[m[1]], (ASSETS / "style.qss").read_text(encoding="utf-8"))


def palette(scheme: str) -> QPalette:
    """A QPalette from the scheme's colours: the roles Fusion and the custom-painted widgets read."""
    c = {name: QColor(value) for name, value in colors(scheme).items()}
    pal = QPalette()
    Role = QPalette.ColorRole
    for role, name in ((Role.Window, "window"), (Role.WindowText, "text"), (Role.Base, "surface"),
                       (Role.AlternateBase, "surface_alt"), (Role.Text, "text"), (Role.Button, "surface"),
                       (Role.ButtonText, "text"), (Role.Highlight, "accent"), (Role.HighlightedText, "on_accent"),
                       (Role.ToolTipBase, "surface"), (Role.ToolTipText, "text"), (Role.PlaceholderText, "muted"),
                       (Role.Link, "accent"), (Role.LinkVisited, "accent_pressed"), (Role.BrightText, "danger"),
                       (Role.Mid, "border"), (Role.Midlight, "surface_alt"), (Role.Dark, "border"),
                       (Role.Light, "surface"), (Role.Shadow, "border"), (Role.Accent, "accent")):
        pal.setColor(role, c[name])
    for role in (Role.WindowText, Role.Text, Role.ButtonText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, c["muted"])
    return pal


@cache
def app_icon() -> QIcon:
    """Parley's icon: the SVG (any size), plus the rendered 256 px PNG for Qt builds without SVG support."""
    icon = QIcon(str(ASSETS / "icon.svg"))
    icon.addFile(str(ASSETS / "icon.png"))
    return icon


def scheme_for(theme: str, system: Qt.ColorScheme) -> str:
    """"light" or "dark" for a theme setting and the desktop's scheme (Unknown counts as light)."""
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; choose one of: {', '.join(THEMES)}")
    if theme != "system":
        return theme
    return "dark" if system == Qt.ColorScheme.Dark else "light"


def apply_style(app: QApplication, theme: str = "system") -> str:
    """Style the whole application and set its window icon; returns the scheme used ("light" or "dark").

    Call it again with another theme to switch at once (the settings' "ui/theme").

    Args:
        theme: "system" (follow the desktop, live), "light" or "dark".
    Raises:
        ValueError: another theme name.
    """
    hints = app.styleHints()
    scheme_for(theme, hints.colorScheme())  # a bad name fails before anything changes
    app.setProperty("parleyTheme", theme)  # first: the forced scheme below signals colorSchemeChanged
    if theme == "system":
        hints.unsetColorScheme()  # undo an earlier forced scheme, so the desktop's shows through again
    scheme = scheme_for(theme, hints.colorScheme())
    if theme != "system":
        # tells Qt's own dialogs and the platform (title bars) too, where the platform allows it
        hints.setColorScheme(Qt.ColorScheme.Dark if scheme == "dark" else Qt.ColorScheme.Light)
    _paint(app, scheme)
    if not app.property("parleyFollowsSystem"):  # connect once, however often the theme changes
        app.setProperty("parleyFollowsSystem", True)
        hints.colorSchemeChanged.connect(lambda system: _follow_system(app, system))
    return scheme


def _paint(app: QApplication, scheme: str) -> None:
    app.setStyle("Fusion")  # the built-in style that honours every palette role and style-sheet rule
    app.setPalette(palette(scheme))
    app.setStyleSheet(style_sheet(scheme))
    app.setWindowIcon(app_icon())
    app.setProperty("parleyScheme", scheme)


def _follow_system(app: QApplication, system: Qt.ColorScheme) -> None:
    """The desktop switched light/dark: restyle if the theme is "system" and the scheme really changed."""
    scheme = scheme_for("system", system)
    if app.property("parleyTheme") == "system" and scheme != app.property("parleyScheme"):
        _paint(app, scheme)
