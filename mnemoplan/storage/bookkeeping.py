"""What the write path keeps in memory of each user: ledgers, each session's last turn, entity catalogs."""

from __future__ import annotations

import threading

import numpy as np
from cachetools import LRUCache

from mnemoplan.model import Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.catalog import CatalogCache, EntityCatalog
from mnemoplan.storage.counters import PendingCounts
from mnemoplan.storage.ledger import UserLedger
from mnemoplan.storage.log.table import LanceLog

# A session's last stored message, with its embedding: the previous turn of the next one.
LastTurn = tuple[Record, np.ndarray]

# Users whose ledgers and catalogs stay in memory, and sessions whose last turn does: the least
# recently used go first and are read from the log again at their next use, so a server's memory
# is bounded by the users it serves at once, not by every user it ever served.
USERS_HELD = 1_024
SESSIONS_HELD = 8_192
# Entities of the catalogs held across users, an eighth of their mentions too (``CatalogCache.weight``):
# a thousand users' catalogs took 435 MB on the million store (~830k entities, ~520 bytes each
# with the user's mention index; a user of 1k records holds 60-2,400 of them), and one read
# again takes 10-40 ms (bench/README.md).
CATALOG_ENTITIES = 262_144


class WriteBookkeeping:
    """Per-user state the write path reads instead of querying the log each time, read from the
    log on first use and dropped when a delete or a failed write makes it doubtful.

    Args:
        log: Where the state is read from.
        counts: Mention counts not yet in the log (a reloaded ledger takes them in).
        write_lock: The store's write lock (held by ``drop_ledger``).
    """

    def __init__(self, log: LanceLog, counts: PendingCounts, write_lock: threading.RLock) -> None:
        self._log = log
        self._counts = counts
        self._write_lock = write_lock
        self._ledgers: LRUCache[str, UserLedger] = LRUCache(USERS_HELD)
        self._last: LRUCache[tuple[str, str], LastTurn] = LRUCache(SESSIONS_HELD)
        self._held = threading.Lock()  # a leaf lock over both (an LRU's read reorders it)
        self.catalogs = CatalogCache(self._load_catalog, CATALOG_ENTITIES)

    def _load_catalog(self, user_id: str) -> EntityCatalog:
        return EntityCatalog.from_rows(self._log.mention_rows(user_id))

    def ledger(self, user_id: str) -> UserLedger:
        """The user's write-path bookkeeping (``UserLedger``, read from the log once)."""
        with self._held:
            ledger = self._ledgers.get(user_id)
        if ledger is None:
            ledger = UserLedger.load(self._log, user_id)
            for rid, count in self._counts.mentions().items():  # not yet in the log: not lost by the reload
                ledger.raise_mentions(rid, count)
            with self._held:
                self._ledgers[user_id] = ledger
        return ledger

    def loaded_ledger(self, user_id: str) -> UserLedger | None:
        """The user's ledger if it is in memory (None: its next load reads the log)."""
        with self._held:
            return self._ledgers.get(user_id)

    def drop_ledger(self, user_id: str) -> None:
        """Forget the user's ledger; the next use reads it from the log again (after a write
        that failed halfway, so the ledger never lists what the log does not hold)."""
        with self._write_lock, self._held:
            self._ledgers.pop(user_id, None)

    def existing(
        self, user_id: str, session_id: str, hashes: list[str], sources: list[str]
    ) -> dict[str, str]:
        """Ids already stored, by content hash and by ``src:<source id>`` within the session."""
        ledger = self.ledger(user_id)
        out = {h: ledger.by_hash[h] for h in hashes if h in ledger.by_hash}
        for src in sources:
            rid = ledger.by_source.get((session_id, src))
            if rid:
                out[f"src:{src}"] = rid
        return out

    def session_tail(self, user_id: str, session_id: str, count: int) -> list[tuple[str, str]]:
        """(content hash, id) of a session's last ``count`` messages, oldest first."""
        where = RecordFilter(user_id, session_id=session_id, kinds=("message",))
        rows = sorted(self._log.select(where, ["id", "content_hash", "seq"]), key=lambda r: r["seq"])
        return [(r["content_hash"], r["id"]) for r in rows[-count:]] if count > 0 else []

    def previous(self, rec: Record) -> tuple[Record | None, np.ndarray | None]:
        """The last message stored in the record's session, with its embedding."""
        key = (rec.user_id, rec.session_id)
        with self._held:
            cached = self._last.get(key)
        if cached is not None:
            return cached
        last_id = self.ledger(rec.user_id).last_message(rec.session_id)
        if last_id is None:
            return None, None
        prev = self._log.get(rec.user_id, [last_id]).get(last_id)
        emb = self._log.vectors(rec.user_id, [last_id]).get(last_id)
        if prev is None or emb is None:
            return None, None
        with self._held:
            self._last[key] = (prev, emb)
        return prev, emb

    def stored(
        self, ledger: UserLedger | None, records: list[Record], embeddings: np.ndarray,
        last: dict[tuple[str, str], LastTurn],
    ) -> None:  # fmt: skip
        """Account for records the log now holds: ``last`` is each session's last message among
        them; ``ledger``, the user's ledger as it was before the write (None: not loaded)."""
        with self._held:
            self._last.update(last)
        for rec, embedding in zip(records, embeddings, strict=True):
            if ledger is not None:
                ledger.note(rec, embedding)
            self.catalogs.add(rec.user_id, rec.entities, rec.seq, rec.id)

    def forget_records(
        self, user_id: str, records: list[Record], *, reopened: bool, catalog: EntityCatalog | None
    ) -> None:
        """Take deleted records out of what is held of their user, rather than read it all
        again (two reads of the user's whole log per forget, each slowest under load): from
        ``catalog``, the user's catalog as loaded before the log's delete (``CatalogCache.peek``),
        and from the ledger. A delete that made facts current again (``reopened``) drops the
        user's ledger, whose current facts it changed; the last turns of the sessions it touched
        are read again (what followed a deleted turn now follows another)."""
        mentions = [m for rec in records for m in rec.entities]
        self.catalogs.remove(user_id, mentions, catalog, [rec.id for rec in records])
        sessions = {rec.session_id for rec in records}
        with self._held:
            ledger = self._ledgers.get(user_id)
            if ledger is not None and reopened:
                del self._ledgers[user_id]
            elif ledger is not None:
                ledger.drop(records)
            for key in [k for k in self._last if k[0] == user_id and k[1] in sessions]:
                del self._last[key]

    def forget_user(self, user_id: str) -> None:
        """Drop what is held of a user whose records were deleted."""
        self.catalogs.invalidate(user_id)
        with self._held:
            self._ledgers.pop(user_id, None)
            for key in [k for k in self._last if k[0] == user_id]:
                del self._last[key]

    def clear(self) -> None:
        """Drop every user's ledger and last turns (after a rebuild)."""
        with self._held:
            self._last.clear()
            self._ledgers.clear()
