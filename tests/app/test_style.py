"""app.style on real widgets offscreen: both schemes' sheets and palettes, the icon, following the desktop."""

import re

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage, QPalette
from PySide6.QtWidgets import QLabel, QPushButton

from app.style import ASSETS, apply_style, colors, palette, scheme_for, style_sheet


@pytest.fixture
def styled_app(qapp):
    """The test QApplication, set back to the light scheme afterwards."""
    yield qapp
    apply_style(qapp, "light")


def test_every_colour_the_sheet_names_exists_in_both_schemes():
    """No @name is left in either sheet, and the two schemes name the same colours."""
    assert set(colors("light")) == set(colors("dark"))
    for scheme in ("light", "dark"):
        sheet = style_sheet(scheme)
        assert "@" not in sheet
        assert colors(scheme)["accent"] in sheet
        images = re.findall(r"url\(([^)]+)\)", sheet)  # the check mark and the spin box arrows
        assert len(images) >= 3 and all(not QImage(path).isNull() for path in images), images


def test_forced_themes_set_different_palettes_and_the_icon(styled_app, qtlog):
    """'light' and 'dark' give their own window colours to the app and its widgets, and a real icon;
    Qt parses the sheet without a warning."""
    assert apply_style(styled_app, "dark") == "dark"
    button = QPushButton("Talk")
    label = QLabel("Parley")
    button.ensurePolished()
    assert not [r.message for r in qtlog.records if "style" in r.message.lower()]
    dark = label.palette().color(QPalette.ColorRole.Window).name().upper()
    assert dark == colors("dark")["window"]
    assert apply_style(styled_app, "light") == "light"
    assert QLabel().palette().color(QPalette.ColorRole.Window).name().upper() == colors("light")["window"]
    assert styled_app.styleSheet() == style_sheet("light")
    assert not styled_app.windowIcon().isNull()
    assert not styled_app.windowIcon().pixmap(64, 64).isNull()


def test_system_theme_follows_the_desktop_when_it_switches(styled_app):
    """With 'system', a colour-scheme change of the desktop restyles the app; a forced theme ignores it."""
    apply_style(styled_app, "system")
    hints = styled_app.styleHints()
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # what the platform sends when the desktop turns dark
    assert styled_app.property("parleyScheme") == "dark"
    assert styled_app.palette().color(QPalette.ColorRole.Base) == palette("dark").color(QPalette.ColorRole.Base)
    apply_style(styled_app, "light")
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert styled_app.property("parleyScheme") == "light"


def test_unknown_theme_is_refused_and_changes_nothing(styled_app):
    """A theme name other than system/light/dark is a ValueError naming the choices; the style stays."""
    apply_style(styled_app, "light")
    with pytest.raises(ValueError, match="choose one of: system, light, dark"):
        apply_style(styled_app, "sepia")
    assert styled_app.property("parleyTheme") == "light"
    assert scheme_for("system", Qt.ColorScheme.Unknown) == "light"


def test_raster_icons_are_committed_beside_the_svg():
    """The PNG (window icon fallback) and ICO (PyInstaller's Windows icon) exist and are what they claim."""
    assert (ASSETS / "icon.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (ASSETS / "icon.ico").read_bytes()[:4] == b"\x00\x00\x01\x00"
