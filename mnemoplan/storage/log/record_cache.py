"""Records in memory, so ranking does not pay a LanceDB round trip per query."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import pyarrow as pa

from mnemoplan.model import Record
from mnemoplan.storage.log.schema import row_to_record

# A user is read whole into the cache up to this many records and this share of its rows: one
# scan of a small user costs about one read by id, and every later read is then served from memory.
WHOLE_USER_MAX = 5_000
WHOLE_USER_SHARE = 4


@dataclass
class _UserRows:
    """A user's rows as read (Arrow, ~600 bytes a record), and where each id's row is."""

    rows: pa.Table
    at: dict[str, int]


class RecordCache:
    """Records by id, and users read whole, so ranking does not pay a LanceDB round trip per query.

    Two parts, each an LRU: records (Python objects, ~10x the bytes of their rows) of any user,
    by id; and the rows of users read whole, kept as read (Arrow) and turned into records only
    when asked for. Under many users at once the whole users' records no longer fit as objects,
    and each recall read its user whole again (most of a server's time under a 50-user load).

    Records are immutable except through the log's update methods, which evict them; a cache
    entry is therefore never stale. Every eviction starts a new epoch, and rows read in an
    earlier one are not kept (a read that began before a rewrite would bring the old rows back).

    Args:
        capacity: Records held by id (0 disables the cache, users read whole included).
        user_rows: Rows held of the users read whole.
    """

    def __init__(self, capacity: int, user_rows: int = 100_000) -> None:
        self._capacity = capacity
        self._user_rows = user_rows if capacity > 0 else 0
        self._items: OrderedDict[str, Record] = OrderedDict()
        self._users: OrderedDict[str, _UserRows] = OrderedDict()  # users read whole (see LanceLog.get)
        self._held_rows = 0
        self._lock = threading.Lock()
        self._epoch = 0

    @property
    def whole_user_max(self) -> int:
        """The most records of a user read whole."""
        return min(WHOLE_USER_MAX, self._user_rows // WHOLE_USER_SHARE)

    def epoch(self) -> int:
        """Read before reading rows from the log; pass it to ``put`` or ``put_user``."""
        with self._lock:
            return self._epoch

    def get_many(self, user_id: str, ids: list[str]) -> tuple[dict[str, Record], list[str]]:
        """(cached records of this user, ids still to read)."""
        found: dict[str, Record] = {}
        missing: list[str] = []
        to_build: list[tuple[str, int]] = []
        with self._lock:
            whole = self._users.get(user_id)
            if whole is not None:
                self._users.move_to_end(user_id)
            for rid in ids:
                rec = self._items.get(rid)
                if rec is not None and rec.user_id == user_id:
                    self._items.move_to_end(rid)
                    found[rid] = rec
                elif whole is not None and rid in whole.at:
                    to_build.append((rid, whole.at[rid]))
                else:
                    missing.append(rid)
            epoch = self._epoch
        if to_build:
            assert whole is not None
            # One take for them all: a slice per row cost 3x (150 records: 32 ms against 9.5)
            built = [row_to_record(row) for row in whole.rows.take([at for _, at in to_build]).to_pylist()]
            found.update({rec.id: rec for rec in built})
            self.put(built, epoch)
        return found, missing

    def holds_whole(self, user_id: str) -> bool:
        """True if the user's records were read into the cache at once (one rewritten since is read again by id)."""
        with self._lock:
            return user_id in self._users

    def holds_any_whole(self) -> bool:
        """True if some user's records are held whole."""
        with self._lock:
            return bool(self._users)

    def put_new(self, records: list[Record], epoch: int | None = None) -> None:
        """Records just written (or rewritten and read back since ``epoch``), kept for the users
        held whole (so they stay whole)."""
        with self._lock:
            kept = [rec for rec in records if rec.user_id in self._users]
        if kept:
            self.put(kept, epoch)

    def put(self, records: list[Record], epoch: int | None = None) -> bool:
        """Remember records just read (unless an eviction came since ``epoch``); True if kept."""
        if self._capacity <= 0:
            return False
        with self._lock:
            if epoch is not None and epoch != self._epoch:
                return False
            for rec in records:
                self._items[rec.id] = rec
                self._items.move_to_end(rec.id)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return True

    def put_user(self, user_id: str, rows: pa.Table, epoch: int) -> bool:
        """Hold all of a user's rows (``META_COLUMNS``, just read), unless an eviction came since
        ``epoch`` or they are more than ``user_rows``; True if kept. The users read whole least
        recently go first."""
        if rows.num_rows > self._user_rows:
            return False
        rows = rows.combine_chunks()  # a slice of one chunk is cheap; of many, not
        entry = _UserRows(rows, {rid: i for i, rid in enumerate(rows.column("id").to_pylist())})
        with self._lock:
            if epoch != self._epoch:
                return False
            old = self._users.pop(user_id, None)
            self._held_rows += rows.num_rows - (old.rows.num_rows if old else 0)
            self._users[user_id] = entry
            while self._held_rows > self._user_rows:
                _, dropped = self._users.popitem(last=False)
                self._held_rows -= dropped.rows.num_rows
        return True

    def evict(self, ids: list[str] | None = None, user_id: str | None = None) -> None:
        """Drop some records, a user's records, or everything."""
        with self._lock:
            self._epoch += 1
            if ids is not None:
                for rid in ids:
                    self._items.pop(rid, None)
                for entry in self._users.values():  # a user stays whole; these are read again by id
                    for rid in ids:
                        entry.at.pop(rid, None)
            elif user_id is not None:
                dropped = self._users.pop(user_id, None)
                self._held_rows -= dropped.rows.num_rows if dropped else 0
                for rid in [r for r, rec in self._items.items() if rec.user_id == user_id]:
                    del self._items[rid]
            else:
                self._items.clear()
                self._users.clear()
                self._held_rows = 0
