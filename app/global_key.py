"""Talking from any app: a push-to-talk key that works while Parley's window is not the focused one.

On X11 the key is grabbed on the root window (python-xlib), so the X server sends its presses and releases to
Parley whichever window has the focus, and to no other app. Wayland lets no app see keys meant for another window;
there, and on systems this does not cover yet, unavailable() says so and Space in Parley's window remains.
"""

from __future__ import annotations

import select
import threading

from PySide6.QtCore import QObject, Signal

DEFAULT_KEY = "Ctrl+Alt+Space"
REPEAT_WAIT_S = 0.03  # after a release, how long the press of an auto-repeat may take to arrive


class GlobalKeyError(Exception):
    """The key cannot be grabbed; the message is for the user."""


def unavailable(platform: str) -> str | None:
    """Why a global key cannot work under Qt's platform plugin `platform` ("xcb", "wayland", ...); None if it can."""
    if platform == "xcb":
        try:
            import Xlib  # noqa: F401
        except ImportError:
            return "python-xlib is not installed: pip install python-xlib==0.33"
        return None
    if platform.startswith("wayland"):
        return ("Wayland lets no app hear keys pressed in other windows: hold Space in Parley's window, or start "
                "Parley in an X11 session")
    return "not available on this system yet: hold Space in Parley's window"


def parse(shortcut: str) -> tuple[int, str]:
    """("Ctrl+Alt+Space" ->) the X modifier mask and the key's X name ("space").

    Raises:
        GlobalKeyError: no key, or a modifier other than Ctrl, Alt, Shift and Meta.
    """
    from Xlib import X

    masks = {"ctrl": X.ControlMask, "alt": X.Mod1Mask, "shift": X.ShiftMask, "meta": X.Mod4Mask}
    *modifiers, key = [part.strip() for part in shortcut.split("+")] if shortcut.strip() else [""]
    unknown = [m for m in modifiers if m.lower() not in masks]
    if not key or unknown:
        raise GlobalKeyError(f"{shortcut!r} is not a key with Ctrl, Alt, Shift or Meta, like {DEFAULT_KEY}")
    mask = 0
    for m in modifiers:
        mask |= masks[m.lower()]
    return mask, key


class GlobalTalkKey(QObject):
    """Holds `shortcut` ("Ctrl+Alt+Space") grabbed on an X display from start() to stop(), on a thread of its own.

    Signals (delivered on the GUI thread):
        pressed(): the key went down; released(): it went up (X's auto-repeat of a held key is neither).
    Args:
        shortcut: modifiers and a key, as Qt writes a shortcut (QKeySequence's portable text).
        display: the X display's name; None is $DISPLAY's.
    """

    pressed = Signal()
    released = Signal()

    def __init__(self, shortcut: str = DEFAULT_KEY, display: str | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.shortcut, self._display_name = shortcut, display
        self._display = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        """Grabs the key; from now on pressed() and released() come, whichever window has the focus.

        Raises:
            GlobalKeyError: the X display cannot be reached, the key is not one it has, or another program holds it.
        """
        from Xlib import XK, X, display, error

        mask, name = parse(self.shortcut)
        try:
            self._display = d = display.Display(self._display_name)
        except (error.DisplayError, error.ConnectionClosedError, OSError) as e:
            raise GlobalKeyError(f"cannot reach the X display for the global talk key: {e}") from e
        keysym = XK.string_to_keysym(name) or XK.string_to_keysym(name.lower())
        keycode = d.keysym_to_keycode(keysym) if keysym else 0
        if not keycode:
            d.close()
            raise GlobalKeyError(f"{name!r} in {self.shortcut!r} is not a key this keyboard has")
        refused = error.CatchError(error.BadAccess)
        root = d.screen().root
        # X counts Caps Lock and Num Lock (Mod2) as modifiers: the key is grabbed with each of them on and off
        for locks in (0, X.LockMask, X.Mod2Mask, X.LockMask | X.Mod2Mask):
            root.grab_key(keycode, mask | locks, True, X.GrabModeAsync, X.GrabModeAsync, onerror=refused)
        d.sync()
        if refused.get_error() is not None:
            d.close()
            raise GlobalKeyError(f"{self.shortcut} is already taken by another program; choose another key")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._listen, args=(keycode,), name="parley-global-key", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Lets the key go (other programs may grab it again); safe to call when not started."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None
        if self._display is not None:
            self._display.close()  # closing the connection ends its grabs
            self._display = None

    def _listen(self, keycode: int) -> None:
        from Xlib import X

        d, down, held_back = self._display, False, []
        while not self._stopping.is_set():
            if held_back:
                event = held_back.pop()
            elif d.pending_events() or select.select([d.fileno()], [], [], 0.1)[0]:
                event = d.next_event()
            else:
                continue
            # while the key is held the keyboard is Parley's: other keys' events come here too
            if event.type not in (X.KeyPress, X.KeyRelease) or event.detail != keycode:
                continue
            # auto-repeat: X sends a held key as a release and a press at the same moment
            if event.type == X.KeyRelease and (d.pending_events() or select.select([d.fileno()], [], [],
                                                                                    REPEAT_WAIT_S)[0]):
                following = d.next_event()
                if following.type == X.KeyPress and following.time == event.time:
                    continue
                held_back.append(following)
            if (event.type == X.KeyPress) != down:
                down = not down
                (self.pressed if down else self.released).emit()
