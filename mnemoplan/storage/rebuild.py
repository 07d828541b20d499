"""Overlays rebuilt from the log, the source of truth: one user's BM25 index, or everything."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mnemoplan.model import DocRecord, Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.bm25 import BM25Doc, BM25Index
from mnemoplan.storage.bookkeeping import WriteBookkeeping
from mnemoplan.storage.catalog import EntityCatalog
from mnemoplan.storage.documents import GraphRows, KeyHasher, bm25_doc, context_vector, leans_on, user_keys
from mnemoplan.storage.graph.client import GraphIndex
from mnemoplan.storage.journal import Intent, WriteJournal
from mnemoplan.storage.locks import StoreLocks
from mnemoplan.storage.log.schema import doc_records
from mnemoplan.storage.log.table import LanceLog
from mnemoplan.storage.overlays import OverlayWriter

log = logging.getLogger(__name__)

# Told each user rebuilt and their record count.
Progress = Callable[[str, int], None]


def _beside(graph: Callable[[], object], here: Callable[[], object]) -> None:
    """``here()`` while ``graph()`` runs in a thread of its own: a rebuild's graph writes are the
    graph's process's work, mostly waited on here, so the BM25 index is built meanwhile (a 100k
    user's first touch on object storage: 11.3 -> 8.0 s, medians of five; bench/README.md)."""
    with ThreadPoolExecutor(1, thread_name_prefix="graph-rebuild") as pool:
        pending = pool.submit(graph)
        try:
            here()
        except BaseException:
            failed = pending.exception()  # waits for the graph: the caller's lock still covers it
            if failed is not None:
                log.error("rebuilding the graph failed too", exc_info=failed)
            raise
        pending.result()


class Rebuilder:
    """Rebuilds of the overlays from the log.

    Args:
        log: The log.
        bm25: The BM25 overlay.
        graph: The graph overlay.
        journal: Where a rebuild keeps its intent until done.
        overlays: The overlays' writer (a rebuild waits for every pending write).
        locks: The store's locks.
        bookkeeping: The write path's state (dropped by a rebuild).
        context_weight: How far a message's search vector leans towards the previous turn.
    """

    def __init__(
        self, *, log: LanceLog, bm25: BM25Index, graph: GraphIndex, journal: WriteJournal,
        overlays: OverlayWriter, locks: StoreLocks, bookkeeping: WriteBookkeeping, context_weight: float,
    ) -> None:  # fmt: skip
        self._log, self._bm25, self._graph, self._journal = log, bm25, graph, journal
        self._overlays, self._locks, self._bookkeeping = overlays, locks, bookkeeping
        self._context_weight = context_weight

    def user_records(self, user_id: str) -> list[Record]:
        """Every record of a user, in write order."""
        return sorted(self._log.iter_records(RecordFilter(user_id)), key=lambda r: r.seq)

    def rebuild_bm25(self, user_id: str, records: Sequence[Record | DocRecord] | None = None) -> int:
        """Rebuild a user's BM25 index from the log (this also purges deleted documents), beside
        writes made meanwhile (``BM25Index.rebuild``); ``records``: every record of the user."""

        def docs(ids: set[str] | None) -> list[BM25Doc]:
            if ids is None:
                found = self._log.doc_records(RecordFilter(user_id)) if records is None else records
                by_id = {r.id: r for r in found}
            else:  # written during the rebuild, and the turns they follow
                found = self._log.doc_records(RecordFilter(user_id, ids=tuple(sorted(ids))))
                prev = {r.prev_id for r in found if r.prev_id}
                wanted = RecordFilter(user_id, ids=tuple(sorted(prev)))
                by_id = {r.id: r for r in self._log.doc_records(wanted)} if prev else {}
            return [bm25_doc(r, by_id.get(r.prev_id)) for r in found]

        return self._bm25.rebuild(user_id, docs)

    def rebuild(self, user_id: str | None = None, progress: Progress | None = None) -> dict[str, int]:
        """Rebuild every overlay of one user (or of all users) from the log; ``progress`` is told
        each user and their record count once they are done.

        Rebuilding all users writes the graph into a new file, so nothing stays in the pages
        of the old one (such as what Kùzu leaked into it while it ran in this process). A
        journal intent covers a rebuild, of all users or of one: one cut short is done again at
        the next start, since until it ends the graph lacks users or part of one (and ``forget``
        finds derived records through it).
        """
        out: dict[str, int] = {}
        self._overlays.flush(None)
        with self._locks.write:
            everyone = user_id is None
            op = "rebuild_graph" if everyone else "rebuild_user"
            intent = self._journal.begin(Intent(op=op, user_id=user_id or ""))
            if everyone:
                self._graph.recreate()
            for uid in [user_id] if user_id else self._log.user_ids():
                data = self._log.overlay_rows(uid)
                docs = doc_records(data)
                keys = user_keys(self._log, uid)
                assert keys is not None
                graph_rows = GraphRows(data, keys)
                _beside(lambda: self._graph.rebuild(keys.user, graph_rows, dropped=everyone),
                        lambda: self.rebuild_bm25(uid, docs))  # fmt: skip
                self._relean(uid, docs)
                self._bookkeeping.catalogs.invalidate(uid)
                out[uid] = len(docs)
                if progress is not None:
                    progress(uid, len(docs))
            self._graph.checkpoint()
            self._bookkeeping.clear()
            self._journal.done(intent)
        return out

    def refresh(self, user_id: str) -> int:
        """Make this server's caches and overlays of a user hold what the log holds now (another
        server of a shared log wrote or forgot): what is held in memory is dropped, the BM25 index
        and the graph entries are rebuilt from the log. Returns the user's records. Nothing is
        written to the log."""
        self._overlays.flush(user_id)
        with self._locks.write:
            salt = self._log.user_keys.cached(user_id)
            self._log.forget_cached(user_id)
            self._bookkeeping.forget_user(user_id)
            seen = self._bookkeeping.catalogs.changes(user_id)
            data = self._log.overlay_rows(user_id)  # no ``Record`` built: ~70 us each, 7 s at 100k
            keys = user_keys(self._log, user_id, create=False)

            def graph() -> None:
                if salt is not None:  # the entries the graph holds were keyed with it
                    self._graph.drop_user(KeyHasher(salt).user)
                if keys is not None and data.num_rows:
                    self._graph.rebuild(keys.user, GraphRows(data, keys))

            def here() -> None:
                # The user's next call reads their entity catalog and its mention index: built from
                # these rows, not read again (0.85 s of a 100k user's first recall on moto).
                self._bookkeeping.catalogs.offer(user_id, EntityCatalog.from_rows(data), seen)
                self.rebuild_bm25(user_id, doc_records(data))

            _beside(graph, here)
        return data.num_rows

    def _relean(self, user_id: str, records: list[DocRecord], batch: int = 500) -> int:
        """Derive again the search vectors of long turns and of the turns after them, which
        ``leans_on`` no longer leans to the turn before (a log written before long turns stood
        alone leaned them); returns how many changed."""
        by_id = {r.id: r for r in records}
        asked = [r for r in records if r.kind == "message" and r.prev_id in by_id]
        asked = [r for r in asked if r.alone or by_id[r.prev_id].alone]
        changed: dict[str, np.ndarray] = {}
        for start in range(0, len(asked), batch):
            part = asked[start : start + batch]
            emb = self._log.vectors(user_id, [r.id for r in part] + [r.prev_id for r in part])
            stored = self._log.vectors(user_id, [r.id for r in part], column="vector")
            for rec in part:
                if rec.id not in emb or rec.id not in stored:
                    continue
                lean = emb.get(rec.prev_id) if leans_on(rec, by_id[rec.prev_id]) else None
                vector = context_vector(emb[rec.id], lean, self._context_weight)
                if not np.allclose(vector, stored[rec.id], atol=1e-6):
                    changed[rec.id] = vector
        self._log.set_vectors(user_id, changed)
        return len(changed)
