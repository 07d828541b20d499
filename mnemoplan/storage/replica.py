"""A server on a log that other servers share: its caches of a user are kept to what the log holds.

The log (in object storage) is the one truth; this server's caches of a user (records, vectors and
token vectors in memory, the user's BM25 index and graph entries on local disk) hold what the log
held at the user's head (``log.heads``) this server last saw. Before each call of the user the head
is read again: when another server wrote or forgot since, the caches are dropped and the overlays
rebuilt from the log, so no answer misses a memory acknowledged elsewhere or returns one forgotten
elsewhere. Before each write of its own the server marks the head pending (``begin``) and after it
publishes a new one; a write of another server between its read and its publish shows up as a swap
that fails, and the server then treats its own caches as stale too. A pending head is never taken as
known: a server killed between its commit and its publish leaves one, and every other server then
rebuilds the user at each call until a write publishes again, rather than keep caches that miss the
commit. A server starts knowing no head: each user is rebuilt at first touch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from mnemoplan.storage.locks import KeyedLocks
from mnemoplan.storage.log.heads import PENDING, UserHeads, new_head

log = logging.getLogger(__name__)


class Replica:
    """Freshness of one server's caches, per user.

    Args:
        heads: The users' heads in the shared log.
        refresh: Rebuilds this server's caches and overlays of a user from the log.
        user_lock: Holds a user's write lock (``MemoryStore.writing``): a refresh never runs beside
            a write of the same user in this server.
    """

    def __init__(self, heads: UserHeads, refresh: Callable[[str], None],
                 user_lock: Callable[[str], AbstractContextManager[None]]) -> None:  # fmt: skip
        self._heads = heads
        self._refresh = refresh
        self._user_lock = user_lock
        self._known: dict[str, str] = {}  # user -> the head this server's caches hold
        self._pending: dict[str, str] = {}  # user -> the pending head of this server's write under way
        self._guard = threading.Lock()
        self._refreshing = KeyedLocks()
        self.checks = 0
        self.refreshes = 0
        self.check_ms = 0.0  # time spent reading heads (the freshness check's cost)

    def _read(self, user_id: str) -> str:
        started = time.perf_counter()
        head = self._heads.read(user_id)
        with self._guard:
            self.checks += 1
            self.check_ms += (time.perf_counter() - started) * 1000
        return head

    def catch_up(self, user_id: str) -> None:
        """Make this server's caches of the user hold what the log holds now (before a call of theirs)."""
        head = self._read(user_id)
        if self._known.get(user_id) == head:
            return
        with self._refreshing.hold(user_id), self._user_lock(user_id):
            head = self._read(user_id)
            if self._known.get(user_id) == head:
                return  # another call of the user rebuilt meanwhile
            self._refresh(user_id)
            with self._guard:
                self.refreshes += 1
            if not head.startswith(PENDING) and self._read(user_id) == head:  # nothing committed meanwhile
                self._known[user_id] = head
            else:
                self._known.pop(user_id, None)

    def begin(self, user_id: str) -> None:
        """This server is about to commit a change of the user's records: mark the head pending."""
        pending = PENDING + new_head()
        expected = self._known.get(user_id)
        if expected is not None and self._heads.swap(user_id, expected, pending):
            self._pending[user_id] = pending  # this server's caches were current until this write
            return
        self._heads.set(user_id, pending)
        self._known.pop(user_id, None)
        self._pending.pop(user_id, None)

    def published(self, user_id: str) -> None:
        """This server committed a change of the user's records: give the user a new head."""
        head = new_head()
        expected = self._pending.pop(user_id, None)
        if expected is not None and self._heads.swap(user_id, expected, head):
            self._known[user_id] = head
            return
        # Another server wrote too (or this one never knew the head): a head nobody knows, and this
        # server's caches count as stale until it reads them from the log again.
        self._heads.set(user_id, head)
        self._known.pop(user_id, None)

    def forget(self, user_id: str) -> None:
        """Know nothing of the user any more (its caches are dropped)."""
        self._known.pop(user_id, None)
        self._pending.pop(user_id, None)
