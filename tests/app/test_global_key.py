"""The talk key that works from any app, on a real X server (Xvfb) with keys typed through XTEST, as a keyboard
types them: X's own auto-repeat included."""

import shutil
import subprocess

import pytest

from app.global_key import GlobalKeyError, GlobalTalkKey, unavailable
from app.main_window import MainWindow
from engine.events import Ready
from tests.app.conftest import INFO

HELD_S = 1.0  # longer than X's auto-repeat delay (660 ms), so the held key repeats


@pytest.fixture(scope="module")
def x_display():
    """A private Xvfb; its display name (":N"). -noreset: by default an X server starts afresh when its last client
    leaves, and a client connecting meanwhile has its connection reset (a test that lets go of its grab, then grabs
    again from a new connection, met that)."""
    if shutil.which("Xvfb") is None:
        pytest.fail("Xvfb is not installed; apt-get install -y --no-install-recommends xvfb")
    server = subprocess.Popen(["Xvfb", "-displayfd", "1", "-nolisten", "tcp", "-noreset", "-screen", "0", "640x480x24"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    name = ":" + server.stdout.readline().strip()
    yield name
    server.terminate()
    server.wait(10)


class Keyboard:
    """Presses and releases keys on the X display through XTEST."""

    def __init__(self, name: str):
        from Xlib import display

        self.display = display.Display(name)

    def code(self, key: str) -> int:
        from Xlib import XK

        return self.display.keysym_to_keycode(XK.string_to_keysym(key))

    def send(self, kind, *keys: str) -> None:
        from Xlib.ext import xtest

        for key in keys:
            xtest.fake_input(self.display, kind, self.code(key))
        self.display.sync()

    def hold(self, qtbot, keys: tuple[str, ...], seconds: float, meanwhile: str | None = None) -> None:
        from Xlib import X

        self.send(X.KeyPress, *keys)
        qtbot.wait(round(seconds * 1000))
        if meanwhile:
            self.send(X.KeyPress, meanwhile)
            self.send(X.KeyRelease, meanwhile)
        self.send(X.KeyRelease, *reversed(keys))


CTRL_ALT_SPACE = ("Control_L", "Alt_L", "space")


def watch(key: GlobalTalkKey) -> list[str]:
    seen = []
    key.pressed.connect(lambda: seen.append("down"))
    key.released.connect(lambda: seen.append("up"))
    return seen


def test_the_key_held_in_any_window_is_one_press_and_one_release(x_display, qtbot):
    """Held past X's auto-repeat, with another key typed meanwhile: pressed() once, released() once."""
    key = GlobalTalkKey("Ctrl+Alt+Space", x_display)
    seen = watch(key)
    key.start()
    try:
        keyboard = Keyboard(x_display)
        for _ in range(2):
            keyboard.hold(qtbot, CTRL_ALT_SPACE, HELD_S, meanwhile="a")
            qtbot.waitUntil(lambda: seen[-1:] == ["up"])
        keyboard.hold(qtbot, ("Control_L", "space"), 0.2)  # not the shortcut: nothing
        qtbot.wait(200)
    finally:
        key.stop()
    assert seen == ["down", "up", "down", "up"]


def test_a_key_another_program_holds_is_refused_and_free_again_once_let_go(x_display):
    """Only one program can hold a key: the second is told so, plainly; after stop() the key is free."""
    first, second = GlobalTalkKey("Ctrl+Alt+Space", x_display), GlobalTalkKey("Ctrl+Alt+Space", x_display)
    first.start()
    try:
        with pytest.raises(GlobalKeyError, match="Ctrl\\+Alt\\+Space is already taken by another program"):
            second.start()
    finally:
        first.stop()
    second.start()
    second.stop()
    second.stop()  # twice is harmless


@pytest.mark.parametrize("shortcut, message", [
    ("Ctrl+Hyper+X", "is not a key with Ctrl, Alt, Shift or Meta"),
    ("", "is not a key with Ctrl, Alt, Shift or Meta"),
    ("Ctrl+NoSuchKey", "'NoSuchKey' in 'Ctrl\\+NoSuchKey' is not a key this keyboard has"),
])
def test_a_shortcut_that_is_no_key_is_a_clear_error(x_display, shortcut, message):
    with pytest.raises(GlobalKeyError, match=message):
        GlobalTalkKey(shortcut, x_display).start()


def test_no_x_display_is_a_clear_error_and_other_desktops_say_why():
    """No X server at the display: a readable error. Wayland and other systems: why not, and what works."""
    with pytest.raises(GlobalKeyError, match="cannot reach the X display"):
        GlobalTalkKey("Ctrl+Alt+Space", ":97").start()
    assert unavailable("xcb") is None
    assert "Wayland lets no app hear keys pressed in other windows" in unavailable("wayland")
    assert "hold Space in Parley's window" in unavailable("windows")


@pytest.fixture
def x_window(qtbot, settings, tmp_path, x_display, monkeypatch):
    """The main window on the offscreen platform, with its talk key on the Xvfb display, as under X11."""
    monkeypatch.setenv("DISPLAY", x_display)
    monkeypatch.setattr("app.main_window.unavailable", lambda platform: None)
    window = MainWindow(settings, history_file=tmp_path / "history.sqlite3")
    qtbot.addWidget(window)
    window.worker.event.emit(Ready(INFO))
    window.hands_free.setChecked(False)
    yield window
    window._release_global_key()


def test_the_window_talks_while_the_key_is_held_elsewhere_and_lets_it_go_while_its_settings_are_open(
        x_window, x_display, qtbot):
    """Push-to-talk from any app: the held key asks press() once and release() once; while the settings dialog is
    open the key is let go (so its field can take that very key) and held again once it closes."""
    window, keyboard = x_window, Keyboard(x_display)
    assert window.global_key is not None and window.global_key_problem is None
    presses, releases = [], []
    window.press_requested.connect(lambda: presses.append(1))
    window.release_requested.connect(lambda: releases.append(1))
    keyboard.hold(qtbot, CTRL_ALT_SPACE, HELD_S)
    qtbot.waitUntil(lambda: len(releases) == 1)
    qtbot.wait(200)
    assert (len(presses), len(releases)) == (1, 1)

    dialog = window.open_settings()
    assert window.global_key is None
    probe = GlobalTalkKey("Ctrl+Alt+Space", x_display)
    probe.start()  # free while the dialog is open
    probe.stop()
    dialog.reject()
    assert window.global_key is not None


def test_a_talk_key_that_cannot_be_held_is_said_in_the_status_bar_and_the_settings(x_window, x_display, qtbot,
                                                                                    settings):
    """Another program holds the key: the window says so and that Space still works; the settings show why."""
    window = x_window
    window._release_global_key()
    other = GlobalTalkKey("Ctrl+Alt+Space", x_display)
    other.start()
    try:
        window._grab_global_key()
        assert window.global_key is None
        assert "cannot be used from other apps" in window.statusBar().currentMessage()
        dialog = window.open_settings()
        assert "already taken by another program" in dialog.global_key_note.text()
        dialog.reject()
    finally:
        other.stop()
    settings.global_talk_key = ""  # none: nothing held, nothing to say
    window._grab_global_key()
    assert window.global_key is None and window.global_key_problem is None
