"""Records by id in memory, so ranking does not pay a LanceDB round trip per query."""

from __future__ import annotations

import threading
from collections import OrderedDict

from mnemoplan.model import Record

# A user is read whole into the record cache up to this many records and this share of the cache:
# a small user costs about one by-id read, a large one several.
WHOLE_USER_MAX = 2_000
WHOLE_USER_SHARE = 4


class RecordCache:
    """Recently read records by id, so ranking does not pay a LanceDB round trip per query.

    Records are immutable except through the log's update methods, which evict them;
    a cache entry is therefore never stale. Every eviction starts a new epoch, and rows read
    in an earlier one are not kept (a read that began before a rewrite would bring the old
    rows back).
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: OrderedDict[str, Record] = OrderedDict()
        self._lock = threading.Lock()
        self._epoch = 0
        self._whole: set[str] = set()  # users read whole into the cache (see LanceLog.get)

    @property
    def capacity(self) -> int:
        return self._capacity

    def epoch(self) -> int:
        """Read before reading rows from the log; pass it to ``put``."""
        with self._lock:
            return self._epoch

    def get_many(self, user_id: str, ids: list[str]) -> tuple[dict[str, Record], list[str]]:
        """(cached records of this user, ids still to read)."""
        found: dict[str, Record] = {}
        missing: list[str] = []
        with self._lock:
            for rid in ids:
                rec = self._items.get(rid)
                if rec is not None and rec.user_id == user_id:
                    self._items.move_to_end(rid)
                    found[rid] = rec
                else:
                    missing.append(rid)
        return found, missing

    def holds_whole(self, user_id: str) -> bool:
        """True if the user's records were read into the cache at once (one rewritten since is read again by id)."""
        with self._lock:
            return user_id in self._whole

    def holds_any_whole(self) -> bool:
        """True if some user's records are held whole."""
        with self._lock:
            return bool(self._whole)

    def put_new(self, records: list[Record], epoch: int | None = None) -> None:
        """Records just written (or rewritten and read back since ``epoch``), kept for the users
        held whole (so they stay whole)."""
        with self._lock:
            kept = [rec for rec in records if rec.user_id in self._whole]
        if kept:
            self.put(kept, epoch)

    def put(self, records: list[Record], epoch: int | None = None, *, whole_user: str | None = None) -> bool:
        """Remember records just read (unless an eviction came since ``epoch``); True if kept.
        ``whole_user``: the records are all of that user's."""
        if self._capacity <= 0:
            return False
        with self._lock:
            if epoch is not None and epoch != self._epoch:
                return False
            for rec in records:
                self._items[rec.id] = rec
                self._items.move_to_end(rec.id)
            while len(self._items) > self._capacity:
                _, dropped = self._items.popitem(last=False)
                self._whole.discard(dropped.user_id)  # no longer whole in memory; reads fill gaps by id
            # The newest entries are never the ones dropped: all of them stay if they fit at all.
            if whole_user is not None and len(records) <= self._capacity:
                self._whole.add(whole_user)
        return True

    def evict(self, ids: list[str] | None = None, user_id: str | None = None) -> None:
        """Drop some records, a user's records, or everything."""
        with self._lock:
            self._epoch += 1
            if user_id is not None:
                self._whole.discard(user_id)
            elif ids is None:
                self._whole.clear()
            if ids is not None:
                for rid in ids:
                    self._items.pop(rid, None)
            elif user_id is not None:
                for rid in [r for r, rec in self._items.items() if rec.user_id == user_id]:
                    del self._items[rid]
            else:
                self._items.clear()
