"""Locks by key (a user id), held only while someone holds or waits for them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: int = 0  # holding it or waiting for it


class KeyedLocks:
    """One lock per key with a call under way or waiting; dropped when the last one leaves, so
    the table does not grow with every key ever seen, and one key's long hold never holds up
    another's."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._guard = threading.Lock()

    @contextmanager
    def hold(self, key: str) -> Iterator[None]:
        """Hold the key's lock."""
        with self._guard:
            entry = self._entries.setdefault(key, _Entry())
            entry.calls += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._guard:
                entry.calls -= 1
                if not entry.calls:
                    del self._entries[key]

    def wait_idle(self) -> None:
        """Wait until every call under way now (and those waiting with it) is done."""
        with self._guard:
            entries = list(self._entries.values())
        for entry in entries:
            with entry.lock:
                pass

    def __len__(self) -> int:
        with self._guard:
            return len(self._entries)


@dataclass
class StoreLocks:
    """The locks the store's parts share, taken in this order when more than one is: a user's
    (``users``), then ``maintenance``, then ``write``.

    Attributes:
        users: One lock per user with a write or a delete under way or waiting.
        maintenance: Held by a maintenance run (long when it builds the vector index of a
            large log) and by the end of a purge, which must not run beside one.
        write: Held while the log and the overlays' queue change together.
        closed: Set, under ``maintenance``, once the store began to close: nothing may start then.
    """

    users: KeyedLocks = field(default_factory=KeyedLocks)
    maintenance: threading.Lock = field(default_factory=threading.Lock)
    write: threading.RLock = field(default_factory=threading.RLock)
    closed: bool = False
