"""Per-user entries in memory (the vector and token caches' common part): least recently used
first out, and a load from the log only kept if nothing changed the user while it read."""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


class UserCache(Generic[Entry]):
    """Per-user entries in memory, least recently used first out, that a load from the log may
    only fill if nothing changed the user meanwhile. Subclasses say how big an entry is.

    Args:
        max_total: Size (in ``size`` units) kept across users.
    """

    def __init__(self, max_total: int) -> None:
        self.max_total = max_total
        self._users: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()
        # Bumped by every change to a user's rows (and, for all users, by a full invalidation):
        # a load that started before one must not be cached (it may miss rows appended
        # meanwhile, or hold rows deleted meanwhile).
        self._epoch = 0
        self._changes: Counter[str] = Counter()

    @staticmethod
    def size(entry: Entry) -> int:
        """How much of ``max_total`` an entry takes."""
        raise NotImplementedError

    def get(self, user_id: str) -> Entry | None:
        """The user's entry if held."""
        with self._lock:
            entry = self._users.get(user_id)
            if entry is not None:
                self._users.move_to_end(user_id)
            return entry

    def generation(self, user_id: str) -> tuple[int, int]:
        """Read before loading a user's rows; pass it to ``put``."""
        with self._lock:
            return self._epoch, self._changes[user_id]

    def put(self, user_id: str, entry: Entry, generation: tuple[int, int]) -> None:
        """Hold a user's entry, loaded whole from the log, unless they changed since
        ``generation`` was read (the load may then be stale; the next one will not be)."""
        with self._lock:
            if generation != (self._epoch, self._changes[user_id]):
                return
            self._users[user_id] = entry
            self._users.move_to_end(user_id)
            total = sum(self.size(e) for e in self._users.values())
            while total > self.max_total and len(self._users) > 1:
                _, old = self._users.popitem(last=False)
                total -= self.size(old)

    def _change(self, user_id: str, change: Callable[[Entry], Entry | None]) -> None:
        """Replace a held user's entry by ``change(entry)``, or drop it when that is None
        (under the lock); a load in flight is refused, as for any change."""
        self._changes[user_id] += 1
        entry = self._users.get(user_id)
        if entry is None:
            return
        changed = change(entry)
        if changed is None:
            del self._users[user_id]
        else:
            self._users[user_id] = changed

    def invalidate(self, user_id: str | None = None) -> None:
        """Drop one user's entry, or everyone's."""
        with self._lock:
            self._invalidate(user_id)

    def _invalidate(self, user_id: str | None) -> None:
        """``invalidate``'s work, under the lock (subclasses drop what else they know of the user)."""
        if user_id is None:
            self._epoch += 1
            self._users.clear()
        else:
            self._changes[user_id] += 1
            self._users.pop(user_id, None)
