"""What the write path keeps in memory of each user: ledgers, each session's last turn, entity catalogs."""

from __future__ import annotations

import threading

import numpy as np

from mnemoplan.model import Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.catalog import CatalogCache, EntityCatalog
from mnemoplan.storage.counters import PendingCounts
from mnemoplan.storage.ledger import UserLedger
from mnemoplan.storage.log.table import LanceLog

# A session's last stored message, with its embedding: the previous turn of the next one.
LastTurn = tuple[Record, np.ndarray]


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
        self._ledgers: dict[str, UserLedger] = {}
        self._last: dict[tuple[str, str], LastTurn] = {}
        self.catalogs = CatalogCache(self._load_catalog)

    def _load_catalog(self, user_id: str) -> EntityCatalog:
        return EntityCatalog.from_counts(*self._log.mention_counts(user_id))

    def ledger(self, user_id: str) -> UserLedger:
        """The user's write-path bookkeeping (``UserLedger``, read from the log once)."""
        ledger = self._ledgers.get(user_id)
        if ledger is None:
            ledger = self._ledgers[user_id] = UserLedger.load(self._log, user_id)
            for rid, count in self._counts.mentions().items():  # not yet in the log: not lost by the reload
                ledger.raise_mentions(rid, count)
        return ledger

    def loaded_ledger(self, user_id: str) -> UserLedger | None:
        """The user's ledger if it is in memory (None: its next load reads the log)."""
        return self._ledgers.get(user_id)

    def drop_ledger(self, user_id: str) -> None:
        """Forget the user's ledger; the next use reads it from the log again (after a write
        that failed halfway, so the ledger never lists what the log does not hold)."""
        with self._write_lock:
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
        self._last[key] = (prev, emb)
        return prev, emb

    def stored(
        self, ledger: UserLedger | None, records: list[Record], embeddings: np.ndarray,
        last: dict[tuple[str, str], LastTurn],
    ) -> None:  # fmt: skip
        """Account for records the log now holds: ``last`` is each session's last message among
        them; ``ledger``, the user's ledger as it was before the write (None: not loaded)."""
        self._last.update(last)
        for rec, embedding in zip(records, embeddings, strict=True):
            if ledger is not None:
                ledger.note(rec, embedding)
            self.catalogs.add(rec.user_id, rec.entities, rec.seq)

    def forget_user(self, user_id: str) -> None:
        """Drop what is held of a user whose records were deleted."""
        self.catalogs.invalidate(user_id)
        self._ledgers.pop(user_id, None)
        self._last = {k: v for k, v in self._last.items() if k[0] != user_id}

    def clear(self) -> None:
        """Drop every user's ledger and last turns (after a rebuild)."""
        self._last.clear()
        self._ledgers.clear()
