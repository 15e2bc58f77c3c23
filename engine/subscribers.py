"""A thread-safe list of callbacks that events are delivered to (the metrics recorder, the voice loop)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

Event = TypeVar("Event")


class Subscribers(Generic[Event]):
    """Callbacks in the order they subscribed. emit() calls each on the emitting thread, outside the
    list's lock (a callback may subscribe, unsubscribe or read its source); one that raises is logged
    and the others still run."""

    def __init__(self, source: str):
        self._source = source  # for the log line of a failing callback
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Event], None]] = []

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[], None]:
        """Deliver every event from now on to `callback`; returns the function that unsubscribes it."""
        with self._lock:
            self._callbacks.append(callback)

        def unsubscribe():
            with self._lock:
                if callback in self._callbacks:
                    self._callbacks.remove(callback)

        return unsubscribe

    def emit(self, event: Event) -> None:
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback(event)
            except Exception:
                log.exception("a %s subscriber failed on %r", self._source, event)
