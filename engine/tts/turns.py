"""Turns on the speech engine's device: the streams of one TTSEngine take it one at a time, the one whose listener runs
out of audio soonest first.

A turn is a stream's work for one chunk (its frames and their codec decode); between turns a stream keeps its state in
tensors of its own, so several utterances speak at once, interleaved chunk by chunk. A stream asks with a deadline,
when its listener will have heard all it has been given, or the moment it asks where that is past
(engine/tts/stream.py), so one that has just begun, whose listener hears nothing yet, goes before those with audio
still in hand, and those already due go in the order they asked. A stream that asks waits for the turn in progress
and those of streams due sooner, never for their whole utterances. Only the waiter due next is woken when a turn ends:
waking them all had each thread contend for the interpreter and the lock just to wait again, about half a millisecond
a turn with 16 streams (docs/BENCHMARKS.md, "What sixteen streams' first chunks wait for").
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Turns:
    """Lends the device to one holder at a time, the waiter with the earliest deadline first (a plain Lock lets a thread
    that releases take it straight back, starving the others)."""

    def __init__(self):
        self._lock = threading.Lock()
        # a heap of (deadline, arrival, the waiter's wake-up on the lock), one a waiter
        self._waiting: list[tuple[float, int, threading.Condition]] = []
        self._arrivals = itertools.count()
        self._holder: int | None = None  # the thread id holding the turn

    @contextmanager
    def turn(self, deadline: float = float("-inf")) -> Iterator[None]:
        """Wait for this thread's turn, hold it for the block, then hand it to the waiter due soonest.

        Args:
            deadline: when the holder's work is due, in time.perf_counter() seconds; the default, before any, for
                work that is due at once (moving the engine, say).
        Raises:
            RuntimeError: this thread holds the turn already (it would wait for itself for ever).
        """
        me = threading.get_ident()
        with self._lock:
            if self._holder == me:
                raise RuntimeError("this thread asked for the speech engine's turn while holding it")
            entry = (deadline, next(self._arrivals), threading.Condition(self._lock))
            heapq.heappush(self._waiting, entry)
            try:
                while self._holder is not None or self._waiting[0] is not entry:
                    entry[2].wait()
            except BaseException:  # interrupted while waiting: its place goes to the next
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
                self._wake_next()
                raise
            heapq.heappop(self._waiting)
            self._holder = me
        try:
            yield
        finally:
            with self._lock:
                self._holder = None
                self._wake_next()

    def _wake_next(self) -> None:
        """With the lock held: where the turn is free, wake the waiter due soonest, the only one that may take it. One
        that arrives due sooner before it wakes takes the turn instead, and wakes it when done."""
        if self._waiting and self._holder is None:
            self._waiting[0][2].notify()
