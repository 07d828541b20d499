"""Locks by key (a user id), held only while someone holds or waits for them; a lock that lets
reads go first (the graph process's pipe)."""

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


class ReadsFirst:
    """The graph's pipe's lock (``GraphIndex``): one call at a time, a waiting read going before a waiting write, up to
    ``ahead`` reads in a row (then the write goes: under steady recalls it would never find
    the pipe free of readers, and some writers hold wider locks while they wait).

    The child answers one call at a time, and a write (a remember's entities, a forget's
    delete, a rebuild) can take a hundred milliseconds on a large graph: under many clients at
    once, recalls queued behind them for seconds.
    """

    def __init__(self, ahead: int = 4) -> None:
        self._turn = threading.Condition()
        self._busy = False
        self._reads_waiting = self._writes_waiting = 0
        self._ahead, self._passed = ahead, 0  # reads gone first while a write waited

    def _may_go(self, read: bool) -> bool:
        if self._busy:
            return False
        if read:
            return not self._writes_waiting or self._passed < self._ahead
        return not self._reads_waiting or self._passed >= self._ahead

    @contextmanager
    def hold(self, read: bool = False) -> Iterator[None]:
        with self._turn:
            if read:
                self._reads_waiting += 1
            else:
                self._writes_waiting += 1
            try:
                self._turn.wait_for(lambda: self._may_go(read))
            finally:
                if read:
                    self._reads_waiting -= 1
                else:
                    self._writes_waiting -= 1
            self._busy = True
            self._passed = self._passed + 1 if read and self._writes_waiting else 0
        try:
            yield
        finally:
            with self._turn:
                self._busy = False
                self._turn.notify_all()
