"""Counts kept in memory until upkeep writes them: facts said again, and records retrieved."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from mnemoplan.storage.log.table import LanceLog

ACCESS_FLUSH = 1_000  # distinct retrieved records that make an access-count flush due...
ACCESS_FLUSH_S = 60.0  # ...once the last one is this old
ACCESS_FLUSH_MAX = 100_000  # or at once, to bound the memory they hold


class PendingCounts:
    """Mention counts (absolute) and retrievals (increments) not yet in the log.

    A row update per remember or per query would contend with compaction and slow every
    write; the counts reach the log in one update each at the next upkeep (``flush``).

    Args:
        log: Where the counts are written.
    """

    def __init__(self, log: LanceLog) -> None:
        self._log = log
        self._mentions: dict[str, int] = {}
        self._accesses: dict[str, int] = {}  # retrievals not yet written to the log
        # Guards both dicts. A leaf lock: nothing else is taken while it is held (maintenance
        # holds its own lock when it flushes, writes hold the write lock when they count).
        self._lock = threading.Lock()
        self._flushed = time.monotonic()

    def set_mentions(self, rid: str, count: int) -> None:
        """A fact's mention count is now ``count``."""
        with self._lock:
            self._mentions[rid] = count

    def mentions(self) -> dict[str, int]:
        """The mention counts not yet in the log (a copy)."""
        with self._lock:
            return dict(self._mentions)

    def note_access(self, ids: list[str]) -> bool:
        """Count one retrieval of each record; returns whether a flush is due: ``ACCESS_FLUSH``
        distinct records wait and the last flush is ``ACCESS_FLUSH_S`` old, or
        ``ACCESS_FLUSH_MAX`` wait (each flush is row updates plus a compaction, so not per query)."""
        with self._lock:
            for rid in ids:
                self._accesses[rid] = self._accesses.get(rid, 0) + 1
            waiting = len(self._accesses)
            due = waiting >= ACCESS_FLUSH and time.monotonic() - self._flushed >= ACCESS_FLUSH_S
        return due or waiting >= ACCESS_FLUSH_MAX

    def forget(self, ids: list[str]) -> None:
        """Drop the counts of deleted records."""
        with self._lock:
            for rid in ids:
                self._accesses.pop(rid, None)
                self._mentions.pop(rid, None)

    def flush(self) -> None:
        """Write pending mention and access counts to the log; on failure they wait for the next upkeep.

        Raises:
            Exception: Whatever the log's write raised (the counts are kept).
        """
        with self._lock:
            counts, self._mentions = self._mentions, {}
            accesses, self._accesses = self._accesses, {}
            self._flushed = time.monotonic()
        try:
            if counts:
                self._log.set_mention_counts(counts)
                counts = {}
            if accesses:
                self._log.add_accesses(accesses, datetime.now(UTC))
        except BaseException:
            with self._lock:  # put back what did not land (mention counts are absolute)
                for rid, count in counts.items():
                    self._mentions[rid] = max(count, self._mentions.get(rid, 0))
                for rid, n in accesses.items():
                    self._accesses[rid] = self._accesses.get(rid, 0) + n
            raise
