"""Turns on the speech engine's device: the streams of one TTSEngine take it one at a time, first come first served.

A turn is a stream's work for one chunk (its frames and their codec decode); between turns a stream keeps its state in
tensors of its own, so several utterances speak at once, interleaved chunk by chunk, and a stream that asks waits for
at most one turn of each stream ahead of it, never for their whole utterances (engine/tts/stream.py).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    """Lends the device to one holder at a time, in the order they asked (a plain Lock lets a thread that releases
    take it straight back, starving the others)."""

    def __init__(self):
        self._changed = threading.Condition()
        self._waiting: deque[object] = deque()  # a token per waiter, oldest first
        self._holder: int | None = None  # the thread id holding the turn

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for this thread's turn, hold it for the block, then hand it to the longest waiter.

        Raises:
            RuntimeError: this thread holds the turn already (it would wait for itself for ever).
        """
        me, token = threading.get_ident(), object()
        with self._changed:
            if self._holder == me:
                raise RuntimeError("this thread asked for the speech engine's turn while holding it")
            self._waiting.append(token)
            try:
                while self._holder is not None or self._waiting[0] is not token:
                    self._changed.wait()
            except BaseException:  # interrupted while waiting: its place goes to the next
                self._waiting.remove(token)
                self._changed.notify_all()
                raise
            self._waiting.popleft()
            self._holder = me
        try:
            yield
        finally:
            with self._changed:
                self._holder = None
                self._changed.notify_all()
