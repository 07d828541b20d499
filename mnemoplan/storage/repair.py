"""Repair of writes a crash or a failure interrupted, from their journal intents."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mnemoplan.storage.bm25 import BM25Index
from mnemoplan.storage.bookkeeping import WriteBookkeeping
from mnemoplan.storage.deletion import Deleter
from mnemoplan.storage.documents import bm25_doc, graph_record, user_keys
from mnemoplan.storage.graph.client import GraphIndex
from mnemoplan.storage.journal import Intent, WriteJournal
from mnemoplan.storage.locks import StoreLocks
from mnemoplan.storage.log.table import LanceLog
from mnemoplan.storage.rebuild import Rebuilder

log = logging.getLogger(__name__)


class Repairer:
    """Replays interrupted intents: an append reconciled with the log, a delete run again, a purge
    finished, a rebuild (of every user, or of one) done again.

    Args:
        log: The log.
        bm25: The BM25 overlay.
        graph: The graph overlay.
        journal: The intents.
        locks: The store's locks.
        bookkeeping: The write path's state (a repaired user's catalog is read again).
        rebuilder: Rebuilds overlays from the log.
        deleter: Runs deletes and purges again.
    """

    def __init__(
        self, *, log: LanceLog, bm25: BM25Index, graph: GraphIndex, journal: WriteJournal, locks: StoreLocks,
        bookkeeping: WriteBookkeeping, rebuilder: Rebuilder, deleter: Deleter,
    ) -> None:  # fmt: skip
        self._log, self._bm25, self._graph, self._journal = log, bm25, graph, journal
        self._locks, self._bookkeeping = locks, bookkeeping
        self._rebuilder, self._deleter = rebuilder, deleter

    def repair(self) -> int:
        """Replay writes a crash interrupted; returns how many intents were repaired."""
        pending = self._journal.pending()
        rebuilt, rebuilt_users = False, set[str]()
        everyone = any(intent.op == "rebuild_graph" for intent in pending)  # answers a rebuild of one user too
        for intent in pending:
            log.warning("repairing an interrupted %s (%d record(s))", intent.op, len(intent.ids))
            if intent.op == "drop_user":  # outside the write lock: a purge takes the maintenance lock first
                self._deleter.drop_user(intent.user_id)  # purges, under intents of its own
                self._journal.done(intent)
                continue
            with self._locks.write:
                if intent.op == "delete":
                    self._deleter.replay(intent)
                elif intent.op == "add":
                    self.repair_add(intent)
                    self._journal.done(intent)
                elif intent.op == "purge":
                    self._deleter.resume_purge(intent)
            if intent.op == "rebuild_graph":
                # One rebuild answers every pending one: a rebuild cut short leaves two (the one
                # it repaired and its own), and each was rebuilt in turn (half an hour each on a
                # store of 500k memories).
                if not rebuilt:
                    self._rebuilder.rebuild(progress=self._rebuild_progress())  # under an intent of its own
                    rebuilt = True
                self._journal.done(intent)
            elif intent.op == "rebuild_user":
                user = intent.user_id
                if not everyone and user not in rebuilt_users and user_keys(self._log, user, create=False):
                    self._rebuilder.rebuild(user)  # under an intent of its own (a user dropped since has no keys)
                    rebuilt_users.add(user)
                self._journal.done(intent)
        self._deleter.purge_pending()
        return len(pending)

    def _rebuild_progress(self) -> Callable[[str, int], None]:
        """Log each user rebuilt at start-up: on a large store the rebuild takes minutes, before
        the server answers anything."""
        total, done = len(self._log.user_ids()), [0, 0]

        def told(user_id: str, records: int) -> None:
            done[0] += 1
            done[1] += records
            log.warning("rebuilding the indexes from the log: %d of %d users, %d records", done[0], total, done[1])

        return told

    def repair_add(self, intent: Intent) -> None:
        """Bring the overlays in line with the log for one append's records (under the write lock)."""
        present = self._log.get(intent.user_id, intent.ids)
        missing = [rid for rid in intent.ids if rid not in present]
        if missing:  # never reached the log: make sure no overlay has them either
            self._graph.delete(missing)
            # A delete alone would leave their terms in Tantivy's segments.
            self._rebuilder.rebuild_bm25(intent.user_id)
        else:  # re-add just these: rebuilding a large user's whole index is slow
            records = sorted(present.values(), key=lambda r: r.seq)
            prev = self._log.get(intent.user_id, [r.prev_id for r in records if r.prev_id])
            try:
                self._bm25.add([bm25_doc(r, present.get(r.prev_id) or prev.get(r.prev_id)) for r in records])
            except Exception:  # the index itself is in trouble: start it afresh from the log
                log.warning("re-adding to BM25 failed; rebuilding the user's index", exc_info=True)
                self._rebuilder.rebuild_bm25(intent.user_id)
        keys = user_keys(self._log, intent.user_id)
        assert keys is not None
        # An append reaches the graph with all its edges in one transaction: those there are whole,
        # the others are new to it (created, not merged: a merge per edge was ten times slower on a
        # large graph, and a start-up after a crash repairs hundreds of appends).
        in_graph = self._graph.ids(keys.user) if present else set()
        todo = [r for r in sorted(present.values(), key=lambda r: r.seq) if r.id not in in_graph]
        self._graph.add([graph_record(r, keys) for r in todo], fresh=True)
        self._bookkeeping.catalogs.invalidate(intent.user_id)
