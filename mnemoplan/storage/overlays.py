"""Overlay writes, off the caller's path and in batches, with read-your-writes.

``remember`` returns once the log (the source of truth) has the records. The BM25 and
graph overlays follow on one background thread, in order. Both are cheap per record
and costly per write (a Tantivy commit, a Kùzu statement), so during a burst they
are written at most every ``interval_s``: documents go into the Tantivy writer at once
and are committed with the pending graph records at the next flush. A read first waits for
its user's queued jobs and flushes, so it sees every write that returned before it. A
journal intent is closed only once a flush has made its records durable in both
overlays; after a crash, start-up repair replays it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mnemoplan.storage.bm25 import BM25Doc, BM25Index
from mnemoplan.storage.graph.client import GraphIndex, GraphRecord
from mnemoplan.storage.journal import Intent, WriteJournal

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    intents: list[Intent] = field(default_factory=list)
    nodes: list[GraphRecord] = field(default_factory=list)


class OverlayWriter:
    """The background writer of the BM25 and graph overlays.

    Args:
        bm25: The BM25 overlay.
        graph: The graph overlay.
        journal: Where add intents are closed once durable.
        repair: Reconciles the overlays with the log for one intent (used when a write fails).
        interval_s: Longest a burst of writes defers a flush.
    """

    def __init__(
        self,
        bm25: BM25Index,
        graph: GraphIndex,
        journal: WriteJournal,
        repair: Callable[[Intent], None],
        *,
        interval_s: float = 0.5,
    ) -> None:
        self._bm25, self._graph, self._journal, self._repair = bm25, graph, journal, repair
        self.interval_s = interval_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemoplan-overlays")
        self._queued: dict[str, int] = {}
        self._cond = threading.Condition()
        self._pending: dict[str, _Pending] = {}
        self._last_flush: dict[str, float] = {}
        self._timers: dict[str, threading.Timer] = {}
        self._flush_lock = threading.RLock()
        self._closing = False
        self.failures: list[str] = []
        # Per user, the BM25 documents queued or added and not yet committed (searchable only
        # after a commit): read by ``unindexed``, so a search need not wait for the queue.
        self._unindexed: dict[str, dict[str, BM25Doc]] = {}
        self._added: dict[str, set[str]] = {}  # of those, the ones in the index's writer already
        self._docs_lock = threading.Lock()

    # -- the queue ---------------------------------------------------------------------

    def submit(self, user_id: str, job: Callable[[], None]) -> None:
        """Run a job of one user on the writer thread, after the jobs queued before it."""
        with self._cond:
            self._queued[user_id] = self._queued.get(user_id, 0) + 1

        def run() -> None:
            try:
                job()
            except Exception as exc:  # the journal intent stays; repair brings the overlay back
                log.exception("an overlay write failed; it will be repaired")
                self.failures.append(f"an index write failed ({type(exc).__name__}); it is repaired on restart")
            finally:
                self._unqueue(user_id)

        try:
            self._executor.submit(run)
        except RuntimeError:  # the executor is shut down: the job will never run, so it is not queued
            self._unqueue(user_id)
            raise

    def _unqueue(self, user_id: str) -> None:
        """One job of the user is done (or will never run): wake whoever waits for the queue."""
        with self._cond:
            self._queued[user_id] -= 1
            if not self._queued[user_id]:
                del self._queued[user_id]
            self._cond.notify_all()

    def _wait_queue(self, user_id: str | None) -> None:
        with self._cond:
            if user_id is None:
                self._cond.wait_for(lambda: not self._queued)
            else:
                self._cond.wait_for(lambda: user_id not in self._queued)

    # -- writes ------------------------------------------------------------------------

    def unindexed(self, user_id: str) -> list[BM25Doc]:
        """The user's BM25 documents written to the log and not yet searchable in the index (queued,
        or added and not committed): a search scores them itself rather than wait for a flush."""
        with self._docs_lock:
            return list(self._unindexed.get(user_id, {}).values())

    def add(self, user_id: str, intent: Intent, docs: list[BM25Doc], nodes: list[GraphRecord]) -> None:
        """Queue new records' overlay entries; they become searchable in the index at the next
        flush, and by ``unindexed`` until then."""
        with self._docs_lock:
            self._unindexed.setdefault(user_id, {}).update((d.id, d) for d in docs)

        def job() -> None:
            try:
                self._bm25.add(docs, commit=False)
                with self._docs_lock:
                    self._added.setdefault(user_id, set()).update(d.id for d in docs)
            except Exception:
                with self._docs_lock:  # the repair below rebuilds them into the index
                    self._drop_unindexed(user_id, [d.id for d in docs])
                # The nodes still pending first: the repair adds this intent's nodes with their edges
                # to earlier records (the turn before, the messages a summary was made of), which
                # Kùzu only creates between records already in the graph.
                self._flush_now(user_id)
                self._repair(intent)  # rebuilds the user's BM25 index and adds the graph's nodes
                log.warning("a BM25 write failed and was repaired from the log")
                self._journal.done(intent)  # its nodes are in the graph: adding them as new would fail
                return
            self._pend(user_id, intent, nodes)

        self.submit(user_id, job)

    def delete(self, user_id: str, intent: Intent, ids: list[str]) -> None:
        """Queue removing records (already out of the log) from both overlays, after the user's
        pending writes. Like an add's, the intent is closed by the flush that commits the BM25
        delete: a crash before it leaves the intent to start-up repair, not a document that
        outlives its record."""

        self.forget_unindexed(user_id, ids)

        def job() -> None:
            self._flush_now(user_id)
            self._graph.delete(ids)
            self._bm25.delete(user_id, ids, commit=False)
            self._pend(user_id, intent, [])

        self.submit(user_id, job)

    def _pend(self, user_id: str, intent: Intent, nodes: list[GraphRecord]) -> None:
        """Leave a job's intent (and graph nodes) to the next flush, now if one is due."""
        with self._flush_lock:
            pending = self._pending.setdefault(user_id, _Pending())
            pending.intents.append(intent)
            pending.nodes.extend(nodes)
            due = time.monotonic() - self._last_flush.get(user_id, 0.0) >= self.interval_s
            if not due:
                self._schedule(user_id)
        if due:
            self._flush_now(user_id)

    def after_pending(self, user_id: str, job: Callable[[], None]) -> None:
        """Queue a job that must see the user's pending writes (a delete, an edge update)."""

        def run() -> None:
            self._flush_now(user_id)
            job()

        self.submit(user_id, run)

    def _schedule(self, user_id: str) -> None:
        if user_id in self._timers or self._closing:
            return
        timer = threading.Timer(self.interval_s, self._timer_fired, args=(user_id,))
        timer.daemon = True
        self._timers[user_id] = timer
        timer.start()

    def _timer_fired(self, user_id: str) -> None:
        with self._flush_lock:
            self._timers.pop(user_id, None)
            if self._closing:
                return
        try:
            self.submit(user_id, lambda: self._flush_now(user_id))
        except RuntimeError:  # shut down (closed, or the interpreter exiting): repair replays the journal
            log.info("pending index writes of %s left to start-up repair (writer already shut down)", user_id)

    def _flush_now(self, user_id: str) -> None:
        with self._flush_lock:
            pending = self._pending.pop(user_id, None)
            if pending is None:
                return
            try:
                self._graph.add(pending.nodes, fresh=True)
            except Exception:
                log.warning("a graph write failed; repairing it from the log")
                for intent in pending.intents:
                    self._repair(intent)
            self._bm25.commit(user_id)
            with self._docs_lock:
                self._drop_unindexed(user_id, self._added.pop(user_id, set()))
            self._last_flush[user_id] = time.monotonic()
            for intent in pending.intents:
                self._journal.done(intent)

    def _drop_unindexed(self, user_id: str, ids: Iterable[str]) -> None:
        docs = self._unindexed.get(user_id)
        if docs is not None:
            for rid in ids:
                docs.pop(rid, None)
            if not docs:
                del self._unindexed[user_id]

    def forget_unindexed(self, user_id: str, ids: Iterable[str] | None = None) -> None:
        """Records deleted from the log: not searchable as waiting documents either (all of the user's: None)."""
        with self._docs_lock:
            if ids is None:
                self._unindexed.pop(user_id, None)
            else:
                self._drop_unindexed(user_id, ids)

    # -- readers and shutdown ----------------------------------------------------------

    def flush(self, user_id: str | None = None) -> None:
        """Read-your-writes: wait for the user's (or everyone's) jobs, then flush what is pending."""
        self._wait_queue(user_id)
        with self._flush_lock:
            users = [user_id] if user_id is not None else list(self._pending)
        for uid in users:
            self._flush_now(uid)

    def close(self) -> None:
        """Write everything still pending and stop the writer thread."""
        self.flush()
        with self._flush_lock:
            self._closing = True
            for timer in self._timers.values():
                timer.cancel()
        self.flush()
        self._executor.shutdown(wait=True)
        self.flush()
