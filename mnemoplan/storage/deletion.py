"""Deletes that reach every store, and the purge that takes the deleted bytes off the disk.

A delete takes records (and what was derived from them) out of the log and every overlay
under a journal intent, then leaves a purge intent until their bytes are gone: the user's
BM25 index rebuilt without them, the log's fragments rewritten, the graph checkpointed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mnemoplan.errors import storage_failure
from mnemoplan.model import Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.bm25 import BM25Doc, BM25Index
from mnemoplan.storage.bookkeeping import WriteBookkeeping
from mnemoplan.storage.catalog import EntityCatalog
from mnemoplan.storage.counters import PendingCounts
from mnemoplan.storage.documents import bm25_doc, context_vector, graph_record, leans_on, user_keys
from mnemoplan.storage.graph.client import GraphIndex, GraphRecord
from mnemoplan.storage.journal import Intent, WriteJournal
from mnemoplan.storage.locks import StoreLocks
from mnemoplan.storage.log.table import LanceLog
from mnemoplan.storage.log.tables import read_again_if_dropped
from mnemoplan.storage.overlays import OverlayWriter
from mnemoplan.storage.rebuild import Rebuilder

log = logging.getLogger(__name__)

# Told the user's id once a delete took records of theirs out of every store.
ForgetListener = Callable[[str], None]
# What a delete's intent keeps of its records' links: {"prev": {id: prev_id}, "replaced_by": {id: id}}.
Links = dict[str, dict[str, str]]


@dataclass
class _Reads:
    """What a delete read of the log before it writes (``Deleter._read``).

    Attributes:
        replaced: Records a deleted one had replaced, with what replaced that one in turn and when:
            (id, replaced by, valid to).
        reopened: Records current again (what only deleted records had replaced, and the
            messages the reopened facts were read from).
        relations: Of those, the ones whose graph relations open again (not the messages).
        vectors: The turns that followed a deleted one: their new previous turn and search vector.
        nodes: Those turns' graph records, linked to their new previous turn.
        docs: Those turns' BM25 documents, with their new previous turn's words as context.
        removed: The records deleted, as the log held them (None when a delete is run again
            from its intent: they are out of the log already).
    """

    replaced: list[tuple[str, str, Any]] = field(default_factory=list)
    reopened: list[str] = field(default_factory=list)
    relations: list[str] = field(default_factory=list)
    vectors: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)
    nodes: list[GraphRecord] = field(default_factory=list)
    docs: list[BM25Doc] = field(default_factory=list)
    removed: list[Record] | None = None


@dataclass
class DeleteReport:
    """What a delete removed from each store.

    Attributes:
        ids: Records this delete removed.
        per_store: Records or rows removed per store.
        sessions: Sessions the removed records were in.
        finished: Records an earlier delete of the user removed without finishing (it raised, or its
            purge failed), which this one finished removing and purging.
        purged: Whether the bytes of ``ids`` and ``finished`` left the disk. False if the store
            closed first (the next start purges them) or the purge failed (``warnings`` says why;
            the user's next delete, or the next start, does it).
        warnings: What did not go as it should.
    """

    ids: list[str] = field(default_factory=list)
    per_store: dict[str, int] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)
    finished: list[str] = field(default_factory=list)
    # False: the bytes are still on the disk, to be purged later (the store closed first, or the
    # purge failed: at the next forget of the user, or the next start); ``warnings`` says which.
    purged: bool = True
    warnings: list[str] = field(default_factory=list)


class Deleter:
    """Deletes and purges of the store's records.

    Args:
        log: The log.
        bm25: The BM25 overlay.
        graph: The graph overlay.
        journal: Where intents are kept until done.
        overlays: The overlays' writer (a delete waits for the user's pending writes).
        locks: The store's locks.
        counts: Counts not yet in the log (a deleted record's go).
        bookkeeping: The write path's state (a deleted user's is dropped).
        rebuilder: Rebuilds a user's BM25 index (a purge's first step).
        context_weight: How far a message's search vector leans towards the previous turn.
        forgotten: Told each user whose records a delete removed (caches of what users said).
    """

    def __init__(
        self, *, log: LanceLog, bm25: BM25Index, graph: GraphIndex, journal: WriteJournal,
        overlays: OverlayWriter, locks: StoreLocks, counts: PendingCounts, bookkeeping: WriteBookkeeping,
        rebuilder: Rebuilder, context_weight: float, forgotten: Sequence[ForgetListener] = (),
    ) -> None:  # fmt: skip
        self._log, self._bm25, self._graph, self._journal = log, bm25, graph, journal
        self._overlays, self._locks, self._counts = overlays, locks, counts
        self._bookkeeping, self._rebuilder = bookkeeping, rebuilder
        self._context_weight = context_weight
        self._forgotten_listeners = tuple(forgotten)
        self._purges: dict[str, Intent] = {}  # purge intents not yet done, by token (under the write lock)
        self._rebuilt: set[str] = set()  # of those, the ones whose user's BM25 index was rebuilt since
        self._stalled: set[str] = set()  # of those, the ones a purge failed to finish (or a redone delete's)
        self._unfinished: dict[str, Intent] = {}  # delete intents whose delete raised, by token

    def delete(self, user_id: str, ids: list[str]) -> DeleteReport:
        """Delete records of one user everywhere, with what was derived from them, and purge.

        Derived records (facts, summaries) citing a deleted record go too. The turn that
        followed a deleted message is re-indexed against its new previous turn, so no
        overlay keeps a trace of the deleted text.

        An earlier delete of the user that did not finish (``unfinished_ids``) is finished
        first, even when ``ids`` is empty or names nothing left: its records are then listed
        in ``DeleteReport.finished``.
        """
        report = DeleteReport()
        with self._locks.users.hold(user_id):
            self._overlays.flush(user_id)
            with self._locks.write:
                self._redo_deletes(user_id)
            # Reads under the user's lock alone (no write of the user meanwhile): under many
            # clients a read is several times slower, and every remember waits for the write lock.
            # A purge may drop old files under them (``drop_unreferenced``): they are read again.
            existing, links, reads = read_again_if_dropped(lambda: self._read_delete(user_id, ids))
            report.ids = list(existing)
            report.sessions = {r.session_id for r in existing.values() if r.session_id}
            if report.ids:
                intent = self._journal.begin(Intent("delete", user_id, report.ids, extra=links))
                done = False
                try:
                    # The graph's part first, under the user's lock alone: the graph process,
                    # busy with recalls, answered a forget in ~0.1-0.2 s under many clients
                    # while every remember waited for the write lock. Should it fail (the store
                    # closing), the log still holds the records, and the intent does it again.
                    self._unlink(report, reads)
                    with self._locks.write:
                        if self._locks.closed:  # the stores and the data directory are released
                            raise RuntimeError("the store is closed; the next start finishes this forget")
                        self._delete_now(user_id, report, reads)
                        done = True
                        self._purge_later(intent)
                finally:
                    if not done:
                        with self._locks.write:
                            self._unfinished[intent.token] = intent  # done again by the user's next delete
                            self._bookkeeping.forget_user(user_id)  # it may have deleted some of the log
        self._purge_user(user_id, report)  # the records are out of every store: writes may go on
        return report

    def drop_user(self, user_id: str) -> DeleteReport:
        """Delete every record of a user, the user's overlays and the user's graph secret."""
        report = DeleteReport()
        with self._locks.users.hold(user_id):
            self._overlays.flush(user_id)
            with self._locks.write:
                report.ids = self._log.ids(RecordFilter(user_id))
                intent = self._journal.begin(Intent("drop_user", user_id))
                keys = user_keys(self._log, user_id, create=False)
                report.per_store["log"] = self._log.count(RecordFilter(user_id))
                self._log.delete_user(user_id)
                self._bm25.drop_user(user_id)
                self._overlays.forget_unindexed(user_id)
                report.per_store["bm25"] = report.per_store["log"]
                report.per_store["graph"] = self._graph.drop_user(keys.user) if keys else 0
                self._log.drop_user_salt(user_id)
                self._forgotten(user_id)
                for token, failed in list(self._unfinished.items()):  # whatever they left, this removed
                    if failed.user_id == user_id:
                        del self._unfinished[token]
                        self._stalled.add(self._purge_later(failed).token)
                self._purge_later(intent, report.ids)
        self._purge_user(user_id, report)
        return report

    def unfinished_ids(self, user_id: str) -> set[str]:
        """Records of the user that a delete removed without finishing (it raised, or its purge
        failed): out of the log, maybe not yet out of every overlay or off the disk. The
        user's next delete finishes them."""
        with self._locks.write:
            stalled = [self._purges[t] for t in self._stalled if t in self._purges]
            intents = [*self._unfinished.values(), *stalled]
            return {rid for intent in intents if intent.user_id == user_id for rid in intent.ids}

    # -- start-up repair -------------------------------------------------------------------

    def replay(self, intent: Intent) -> None:
        """Run an interrupted delete again, from its intent (under the write lock), and leave its purge."""
        self._run_again(intent)
        self._purge_later(intent)

    def resume_purge(self, intent: Intent) -> None:
        """Take up an interrupted purge (under the write lock); ``purge_pending`` runs it."""
        self._purges[intent.token] = intent

    def purge_pending(self) -> None:
        """Run every pending purge, of every user."""
        if self._purges:
            self._purge()  # marks every purge intent done

    # -- the delete ------------------------------------------------------------------------

    def _redo_deletes(self, user_id: str) -> None:
        """Run again the user's deletes that raised part way (under the write lock), as start-up
        repair would; their purges count as stalled, so the receipt lists what they removed."""
        for token, intent in list(self._unfinished.items()):
            if intent.user_id != user_id:
                continue
            self._run_again(intent)
            del self._unfinished[token]
            self._stalled.add(self._purge_later(intent).token)

    def _run_again(self, intent: Intent) -> None:
        """A delete from its intent, its records maybe out of the log already (``_links``)."""
        report = DeleteReport(ids=list(intent.ids))
        reads = self._read(intent.user_id, intent.ids, intent.extra)
        self._unlink(report, reads)
        self._delete_now(intent.user_id, report, reads)

    def _with_derived(self, ids: list[str]) -> list[str]:
        out = list(dict.fromkeys(ids))
        frontier = list(out)
        while frontier:
            derived = self._graph.derived_from(frontier)
            frontier = [d for ds in derived.values() for d in ds if d not in out]
            out.extend(dict.fromkeys(frontier))
        return out

    def _read_delete(self, user_id: str, ids: list[str]) -> tuple[dict[str, Record], Links, _Reads]:
        """What a delete of ``ids`` reads before it writes: the records it deletes (those
        derived from them too; in that order), their links (``_links``) and the rest (``_read``)."""
        all_ids = self._with_derived(ids) if ids else []
        found = self._log.get(user_id, all_ids) if all_ids else {}
        existing = {rid: found[rid] for rid in all_ids if rid in found}
        if not existing:
            return existing, {}, _Reads()
        links = self._links(user_id, list(existing))
        reads = self._read(user_id, list(existing), links)
        reads.removed = list(existing.values())
        return existing, links, reads

    def _links(self, user_id: str, ids: list[str]) -> Links:
        """What a delete's intent keeps of its records' links (ids only), for a delete run again
        once they are out of the log: the turn before each, and what replaced each."""
        rows = self._log.select(RecordFilter(user_id, ids=tuple(ids)), ["id", "prev_id", "superseded_by"])
        return {"prev": {r["id"]: r["prev_id"] for r in rows if r["prev_id"]},
                "replaced_by": {r["id"]: r["superseded_by"] for r in rows if r["superseded_by"]}}  # fmt: skip

    def _read(self, user_id: str, ids: list[str], links: Links | None = None) -> _Reads:
        """What a delete of ``ids`` reads of the log before it writes (``_delete_now``); ``links``
        (``_links``) stands in for the rows a delete run before already took out of the log."""
        gone = set(ids)
        following = self._log.records(RecordFilter(user_id, follows=tuple(ids)))
        deleted = self._log.select(RecordFilter(user_id, ids=tuple(ids)), ["id", "prev_id", "superseded_by"])
        links = links or {}
        prev_of = {**links.get("prev", {}), **{row["id"]: row["prev_id"] for row in deleted}}
        replaced_by = {**links.get("replaced_by", {}), **{row["id"]: row["superseded_by"] for row in deleted}}
        reads = _Reads()
        self._read_reopened(user_id, gone, replaced_by, reads)
        successors = [r for r in following if r.id not in gone]
        if successors:
            self._read_context(user_id, successors, prev_of, gone, reads)
        return reads

    def _read_reopened(
        self, user_id: str, gone: set[str], replaced_by: dict[str, str], reads: _Reads
    ) -> None:
        """What deleted records had replaced: pointed at what replaced them in turn, else current
        again (forgetting "I moved to Bergen" leaves Oslo as where the user lives), and then
        so are the messages the reopened facts were read from."""
        rows = self._log.select(RecordFilter(user_id, replaced_by=tuple(sorted(gone))),
                                ["id", "kind", "superseded_by", "valid_to", "derived_from"])  # fmt: skip
        sources: set[str] = set()
        for row in rows:
            if row["id"] in gone:
                continue
            after, seen = row["superseded_by"], set()
            while after in gone and after not in seen:  # Lyon -> Porto (forgotten) -> Paris
                seen.add(after)
                after = replaced_by.get(after, "")
            if after and after not in gone:
                reads.replaced.append((row["id"], after, row["valid_to"]))
                continue
            reads.reopened.append(row["id"])
            reads.relations.append(row["id"])
            if row["kind"] == "fact":
                sources.update(s for s in row["derived_from"] or [] if s not in gone)
        if sources:
            reads.reopened += self._log.ids(RecordFilter(user_id, current=False, ids=tuple(sorted(sources))))

    def _read_context(
        self, user_id: str, successors: list[Record], prev_of: dict[str, str], gone: set[str], reads: _Reads
    ) -> None:
        """Point each successor at the nearest surviving earlier turn, with the search vector and
        the BM25 document that follow from it (the deleted turn's words were its context)."""
        new_prev: dict[str, str] = {}
        for rec in successors:
            prev = rec.prev_id
            while prev in gone:
                prev = prev_of.get(prev, "")
            new_prev[rec.id] = prev
        wanted = [r.id for r in successors] + [p for p in new_prev.values() if p]
        emb = self._log.vectors(user_id, wanted)
        before = self._log.get(user_id, [p for p in new_prev.values() if p])
        keys = user_keys(self._log, user_id)
        assert keys is not None
        for rec in successors:
            prev = new_prev[rec.id]
            lean = emb.get(prev) if leans_on(rec, before.get(prev)) else None
            reads.vectors[rec.id] = (prev, context_vector(emb[rec.id], lean, self._context_weight))
            moved = rec.model_copy(update={"prev_id": prev})
            reads.nodes.append(graph_record(moved, keys))
            reads.docs.append(bm25_doc(moved, before.get(prev)))

    def _unlink(self, report: DeleteReport, reads: _Reads) -> None:
        """The graph's part of a delete (``_delete_now`` the rest, after it): the relations of
        reopened facts valid again, ``report.ids`` out, the turns that followed them linked to
        their new previous turns. Under the user's lock alone, which a refresh of the user
        takes too; the graph is rebuilt whole only before serving (start-up repair, ``reindex``).
        A close of the store meanwhile fails it (or ``delete``'s check after it), before the log
        lost anything: the user's next delete or the next start runs the delete again.
        """
        for rid in reads.relations:
            self._graph.close_relation(rid, None)
        report.per_store["graph"] = self._graph.delete(report.ids)
        if reads.nodes:
            self._graph.add(reads.nodes)

    def _delete_now(self, user_id: str, report: DeleteReport, reads: _Reads) -> None:
        """Delete ``report.ids`` from the log and the BM25 index (under the write lock), as
        ``reads`` (``_read``) found them, once ``_unlink`` took them out of the graph."""
        ids = report.ids
        catalog = self._bookkeeping.catalogs.peek(user_id)  # as loaded before the log changes
        self._counts.forget(ids)
        report.per_store["log"] = self._log.delete(ids, user_id)
        for rid, after, valid_to in reads.replaced:
            self._log.set_superseded([rid], after, valid_to, user_id)
        self._log.set_superseded(reads.reopened, "", None, user_id)
        if reads.vectors:
            self._log.update_vectors(reads.vectors, user_id)
            self._bm25.add(reads.docs, commit=False)
        # Out of every search now; the purge rebuilds the index to get their terms out of its segments.
        report.per_store["bm25"] = self._bm25.delete(user_id, ids)
        self._overlays.forget_unindexed(user_id, ids)
        self._forgotten(user_id, reads, catalog)

    def _forgotten(
        self, user_id: str, reads: _Reads | None = None, catalog: EntityCatalog | None = None
    ) -> None:
        """Take deleted records out of what the store keeps in memory of their user (all of
        it dropped, without ``reads.removed``; ``catalog``: the user's entity catalog loaded
        before the delete), and tell the listeners (the write path's cache of the sentences
        its summaries read, of every user)."""
        for listener in self._forgotten_listeners:
            listener(user_id)
        if reads is not None and reads.removed is not None:
            reopened = bool(reads.reopened)
            self._bookkeeping.forget_records(user_id, reads.removed, reopened=reopened, catalog=catalog)
        else:
            self._bookkeeping.forget_user(user_id)

    # -- the purge -------------------------------------------------------------------------

    def _purge_user(self, user_id: str, report: DeleteReport) -> None:
        """Run every pending purge of the user, noting in ``report`` whether the bytes left the
        disk and which earlier deletes it finished. A purge that fails stays pending (its
        intent too): the user's next delete runs it again, or else the next start."""
        try:
            done = self._purge(user_id)
        except Exception as exc:
            # The records are deleted already, so a purge that fails (a full disk: it writes new
            # copies before it drops the old ones) is no failure of the delete.
            log.warning("purging deleted records failed; the user's next forget finishes it", exc_info=True)
            with self._locks.write:
                self._stalled.update(t for t, p in self._purges.items() if p.user_id == user_id)
            failure = storage_failure(exc)
            why = failure.message.rstrip(".") if failure else f"{type(exc).__name__}, see the server log"
            report.purged = False
            report.warnings.append(
                f"The memories are deleted and out of every search, but their bytes are still on the disk: "
                f"the purge failed ({why}). The next forget of this user's memories (this one again will "
                "do) or the next start finishes it."
            )
            return
        if done is None:  # closed first: the next start purges
            report.purged = False
            return
        with self._locks.write:
            earlier = [p for p in done if p.token in self._stalled and p.user_id == user_id]
            self._stalled.difference_update(p.token for p in done)
        own = set(report.ids)
        report.finished = list(dict.fromkeys(rid for p in earlier for rid in p.ids if rid not in own))

    def _purge_later(self, intent: Intent, ids: list[str] | None = None) -> Intent:
        """Mark a delete done in every store, its purge still to come (under the write lock);
        returns the purge's intent, which names the records deleted (``ids``, else the delete's).

        Replaying the delete itself after a crash could delete what was written after it (a
        user dropped, then remembering again while the purge waited); a crash now replays the
        purge alone."""
        purge = self._journal.begin(Intent("purge", intent.user_id, list(intent.ids if ids is None else ids)))
        self._purges[purge.token] = purge
        self._journal.done(intent)
        return purge

    def _purge(self, user_id: str | None = None) -> list[Intent] | None:
        """Take the bytes of deleted records off the disk: the user's BM25 index rebuilt
        without them, the log's old copies of them and old versions (``LanceLog.rewrite_deleted``, then
        ``drop_unreferenced``) and the graph's write-ahead log. Returns the purge intents it
        finished, or None if the store was closed first (the intents then run at the next
        start). Runs the user's pending purges; without ``user_id``, everyone's (start-up repair).

        The deleted records are out of every search already, and most of this runs beside
        writes: the BM25 rebuild (``BM25Index.rebuild``), then the log's rewrite and compaction
        of the fragments that held them. Only the last and shortest step holds the write lock:
        dropping old versions and files no version refers to, which would race an append. None
        of it may race a maintenance run (dropping old versions under a compaction, or an index
        built from rows it rewrites), and a run can be long (building the vector index of a
        large log), so it takes the maintenance lock first, then the write lock, in the order
        ``close`` does. Each purge does the work of every purge intent whose user's BM25 index
        was rebuilt after it began: when another purge did all of the user's, this one has
        nothing left to do."""
        with self._locks.write:
            begun = {t: p for t, p in self._purges.items() if user_id is None or p.user_id == user_id}
        if not begun:
            return []
        for uid in sorted({p.user_id for p in begun.values()}):
            self._rebuilder.rebuild_bm25(uid)
        with self._locks.write:
            self._rebuilt.update(begun)
        with self._locks.maintenance:
            with self._locks.write:
                if self._locks.closed:
                    return None
                if not begun.keys() & self._purges.keys():
                    return []
                covered = self._rebuilt & self._purges.keys()  # their deletes are all in the log already
                ids = {rid for token in covered for rid in self._purges[token].ids}
            self._log.rewrite_deleted(ids)
            self._graph.checkpoint()
            with self._locks.write:
                self._log.drop_unreferenced()
                done = [self._purges.pop(token) for token in covered]
                for purge in done:
                    self._journal.done(purge)
                self._rebuilt -= covered
            return done
