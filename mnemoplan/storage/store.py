"""The memory store: the log and every overlay, written and deleted together.

Every write goes to the log first and then to each overlay under a journal intent;
every delete reaches every store and then purges old versions, segments and pages so
the bytes leave the disk. A crash in between is repaired by ``repair()`` at start-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from mnemoplan.errors import READ_ONLY_HINT, ReadOnlyData, storage_failure
from mnemoplan.extract.summary import forget_cached
from mnemoplan.storage.bm25 import BM25Doc, BM25Index
from mnemoplan.storage.catalog import CatalogCache, EntityCatalog
from mnemoplan.storage.documents import (
    KeyHasher,
    bm25_doc,
    context_vector,
    graph_record,
    leans_on,
)
from mnemoplan.storage.graph.client import GraphIndex, GraphUnreadable
from mnemoplan.storage.journal import Intent, WriteJournal
from mnemoplan.storage.log.table import LanceLog
from mnemoplan.storage.ledger import UserLedger
from mnemoplan.storage.lock import DataDirLock
from mnemoplan.storage.locks import KeyedLocks
from mnemoplan.storage.overlays import OverlayWriter
from mnemoplan.model import DocRecord, Record
from mnemoplan.model.scope import RecordFilter

log = logging.getLogger(__name__)


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


ACCESS_FLUSH = 1_000  # distinct retrieved records that make an access-count flush due...
ACCESS_FLUSH_S = 60.0  # ...once the last one is this old
ACCESS_FLUSH_MAX = 100_000  # or at once, to bound the memory they hold
FRAGMENTS_TO_COMPACT = 16  # small log fragments found at start-up that call for a compaction


class MemoryStore:
    """The log plus the BM25 and graph overlays under one data directory.

    A data directory that cannot be written when the store opens is opened to read only
    (``read_only``): searches work, and every write raises ``ReadOnlyData``. Nothing is repaired
    or maintained then; a store opened again once the directory can be written does both.

    Args:
        data_dir: Root directory; created if missing and locked for this process.
        context_weight: How far a message's search vector leans towards the previous turn.
        ann_min_rows: Rows at which the log builds an approximate vector index.
        commit_interval_s: Longest a burst of writes defers the BM25 commit.
        maintain_every: Appends between background compactions of the log.
        graph_buffer_pool_mb: Kùzu's page cache; allocated as used, a limit rather than a reservation.
        vector_cache_rows: Users with at most this many records are searched exactly, in memory
            (1.5 KB a row); larger ones through LanceDB's ANN index.
        token_cache_tokens: Users with at most this many token vectors have them held in memory
            (130 bytes each); larger ones are read from the log when a search asks.

    Raises:
        DataDirLocked: Another process holds the data directory.
        ReadOnlyData: The data directory cannot be written and holds no store to read.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        context_weight: float = 0.3,
        ann_min_rows: int = 50_000,
        commit_interval_s: float = 0.5,
        maintain_every: int = 64,
        graph_buffer_pool_mb: int = 1024,
        vector_cache_rows: int = 200_000,
        token_cache_tokens: int = 2_000_000,
    ) -> None:
        self.data_dir = data_dir
        self._dir_lock = DataDirLock.acquire(data_dir)
        self.read_only = not self._dir_lock.writable
        try:
            self.log = LanceLog(data_dir / "log", ann_min_rows=ann_min_rows, cache_vectors_per_user=vector_cache_rows,
                                cache_tokens_per_user=token_cache_tokens,
                                read_only=self.read_only)  # fmt: skip
            self.bm25 = BM25Index(data_dir / "bm25", read_only=self.read_only)
            self.journal = WriteJournal(data_dir / "journal")
            self.graph = self._open_graph(data_dir / "graph" / "graph.kuzu", graph_buffer_pool_mb)
        except BaseException:
            self._dir_lock.release()
            raise
        self.context_weight = context_weight
        self._write_lock = threading.RLock()
        self._writers = KeyedLocks()  # per-user locks (``writing``), taken before the write lock
        self._last: dict[tuple[str, str], tuple[Record, np.ndarray]] = {}
        self._ledgers: dict[str, UserLedger] = {}
        self.catalogs = CatalogCache(self._load_catalog)
        self._writes_since_compact = 0
        self.maintain_every = maintain_every
        self._maintenance_lock = threading.Lock()
        self._closed = False
        self._purges: dict[str, Intent] = {}  # purge intents not yet done, by token (under the write lock)
        self._rebuilt: set[str] = set()  # of those, the ones whose user's BM25 index was rebuilt since
        self._stalled: set[str] = set()  # of those, the ones a purge failed to finish (or a redone delete's)
        self._unfinished: dict[str, Intent] = {}  # delete intents whose delete raised, by token
        self._mention_counts: dict[str, int] = {}
        self._accesses: dict[str, int] = {}  # retrievals not yet written to the log
        # Guards both pending-count dicts. A leaf lock: nothing else is taken while it is held
        # (maintenance holds its own lock when it flushes, writes hold the write lock when they count).
        self._counts_lock = threading.Lock()
        self._accesses_flushed = time.monotonic()
        self.overlays = OverlayWriter(
            self.bm25, self.graph, self.journal, self._repair_intent, interval_s=commit_interval_s
        )

    def _open_graph(self, path: Path, buffer_pool_mb: int) -> GraphIndex:
        """The graph database; one Kùzu cannot open starts afresh and is rebuilt from the log
        (``repair``): it only ever holds what the log does, and without it no server starts."""
        try:
            return GraphIndex(path, buffer_pool_mb=buffer_pool_mb, read_only=self.read_only)
        except GraphUnreadable as exc:
            if self.read_only or not GraphIndex.opens_afresh(path, buffer_pool_mb):
                raise  # not the file: a new one would fail the same way, so it stays as it is
            log.warning("%s; it is rebuilt from the log", exc)
        # The intent first: if the new file cannot be opened either, the next start rebuilds it.
        if not any(intent.op == "rebuild_graph" for intent in self.journal.pending()):
            self.journal.begin(Intent(op="rebuild_graph", user_id=""))
        return GraphIndex(path, buffer_pool_mb=buffer_pool_mb, fresh=True)

    # -- helpers -----------------------------------------------------------------------

    def check_writable(self) -> None:
        """Raise ``ReadOnlyData`` if the store was opened to read only."""
        if self.read_only:
            raise ReadOnlyData(
                f"The data directory {self.data_dir} could not be written to when the server opened it, "
                "so it serves reads only.", hint=READ_ONLY_HINT,
            )  # fmt: skip

    def keys(self, user_id: str, *, create: bool = True) -> KeyHasher | None:
        """The keyed hasher of a user's graph names (None if the user has none yet)."""
        salt = self.log.user_salt(user_id, create=create)
        return KeyHasher(salt) if salt is not None else None

    @contextmanager
    def writing(self, user_id: str) -> Iterator[None]:
        """Hold the user's write lock, one per user with a write under way or waiting (another
        user's long import never holds this one's up).

        A remember holds it from its read of what is stored (repeats, current facts, the
        session's messages for its summary) to its write; a forget holds it while it deletes,
        so a remember never stores a summary or a fact of messages deleted meanwhile.
        """
        with self._writers.hold(user_id):
            yield

    def drop_ledger(self, user_id: str) -> None:
        """Forget the user's ledger; the next use reads it from the log again (after a write
        that failed halfway, so the ledger never lists what the log does not hold)."""
        with self._write_lock:
            self._ledgers.pop(user_id, None)

    def _load_catalog(self, user_id: str) -> EntityCatalog:
        return EntityCatalog.from_counts(*self.log.mention_counts(user_id))

    def catalog(self, user_id: str) -> EntityCatalog:
        """The user's entity catalog."""
        return self.catalogs.get(user_id)

    def ledger(self, user_id: str) -> UserLedger:
        """The user's write-path bookkeeping (``UserLedger``, read from the log once)."""
        ledger = self._ledgers.get(user_id)
        if ledger is None:
            ledger = self._ledgers[user_id] = UserLedger.load(self.log, user_id)
            with self._counts_lock:  # counts not yet in the log must not be lost by the reload
                pending = dict(self._mention_counts)
            for rid, count in pending.items():
                ledger.raise_mentions(rid, count)
        return ledger

    def existing(self, user_id: str, session_id: str, hashes: list[str], sources: list[str]) -> dict[str, str]:
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
        rows = sorted(self.log.select(where, ["id", "content_hash", "seq"]), key=lambda r: r["seq"])
        return [(r["content_hash"], r["id"]) for r in rows[-count:]] if count > 0 else []

    def _previous(self, rec: Record) -> tuple[Record | None, np.ndarray | None]:
        """The last message stored in the record's session, with its embedding."""
        key = (rec.user_id, rec.session_id)
        cached = self._last.get(key)
        if cached is not None:
            return cached
        last_id = self.ledger(rec.user_id).last_message(rec.session_id)
        if last_id is None:
            return None, None
        prev = self.log.get(rec.user_id, [last_id]).get(last_id)
        emb = self.log.vectors(rec.user_id, [last_id]).get(last_id)
        if prev is None or emb is None:
            return None, None
        self._last[key] = (prev, emb)
        return prev, emb

    # -- writes ------------------------------------------------------------------------

    def append(
        self, records: list[Record], embeddings: np.ndarray, tokens: list[bytes | None] | None = None
    ) -> list[Record]:
        """Store new records (in conversation order) in the log and every overlay.

        Assigns each record its sequence number and, for messages, the previous turn of
        its session, from which its contextual BM25 text and search vector are derived.

        Returns:
            The records as stored.
        """
        if not records:
            return []
        self.check_writable()
        user_id = records[0].user_id
        if any(r.user_id != user_id for r in records):
            raise ValueError("append() takes the records of one user")
        with self._write_lock:
            seqs = self.log.next_seqs(len(records))
            stored: list[Record] = []
            vectors = np.zeros_like(embeddings)
            prevs: list[Record | None] = []
            # Each session's last message in this batch; it becomes the session's previous turn
            # for later calls only once the log holds it.
            last: dict[tuple[str, str], tuple[Record, np.ndarray]] = {}
            for i, (rec, seq) in enumerate(zip(records, seqs, strict=True)):
                prev, prev_emb = (None, None)
                if rec.kind == "message":
                    key = (rec.user_id, rec.session_id)
                    prev, prev_emb = last[key] if key in last else self._previous(rec)
                rec = rec.model_copy(update={"seq": seq, "prev_id": prev.id if prev else ""})
                lean = prev_emb if leans_on(rec, prev) else None
                vectors[i] = context_vector(embeddings[i], lean, self.context_weight)
                if rec.kind == "message":
                    last[key] = (rec, embeddings[i])
                stored.append(rec)
                prevs.append(prev)
            keys = self.keys(user_id)
            assert keys is not None
            docs = [bm25_doc(r, p) for r, p in zip(stored, prevs, strict=True)]
            nodes = [graph_record(r, keys) for r in stored]
            intent = self.journal.begin(Intent("add", user_id, [r.id for r in stored]))
            # Not loaded (a delete dropped it since the caller read it): its next load reads these
            # rows from the log, and noting them as well would list each message twice.
            ledger = self._ledgers.get(user_id)
            try:
                self.log.add(stored, embeddings, vectors, tokens)
            except BaseException:
                self._ledgers.pop(user_id, None)
                raise  # the intent stays: repair removes whatever reached a store
            self._last.update(last)
            for rec, embedding in zip(stored, embeddings, strict=True):
                if ledger is not None:
                    ledger.note(rec, embedding)
                self.catalogs.add(rec.user_id, rec.entities, rec.seq)
            self._writes_since_compact += 1
            if self._writes_since_compact >= self.maintain_every:
                self._writes_since_compact = 0
                self._maintain_in_background()

        self.overlays.add(user_id, intent, docs, nodes)
        return stored

    def supersede(self, user_id: str, old_id: str, new_id: str) -> None:
        """Close an old fact's validity in favour of a newer one (history stays queryable).

        The message the old fact was read from is closed too once every fact read from it is:
        "I live in Oslo" is no longer current after "I moved to Bergen", and would otherwise
        outrank it ("...and I love skiing" stays current while that fact does).
        """
        with self._write_lock:
            now = datetime.now(UTC)
            self.log.set_superseded(old_id, new_id, now, user_id)
            self.ledger(user_id).retire_fact(old_id)
            old = self.log.get(user_id, [old_id]).get(old_id)
            for source in old.derived_from if old is not None else []:
                cited = RecordFilter(user_id, kinds=("fact",), cites=source)
                facts = self.log.select(cited, ["id", "superseded_by"])
                if all(f["superseded_by"] or f["id"] == old_id for f in facts):
                    self.log.set_superseded(source, new_id, now, user_id)
        self.overlays.after_pending(user_id, lambda: self.graph.close_relation(old_id, int(now.timestamp())))

    def reinforce(self, user_id: str, fact_ids: list[str]) -> None:
        """Facts said again: count the mentions instead of storing copies.

        The counts reach the log at the next maintenance (or close), in one update: a row
        update per remember would contend with compaction and slow every write.
        """
        if not fact_ids:
            return
        with self._write_lock:
            ledger = self.ledger(user_id)
            for rid in fact_ids:
                count = ledger.reinforce(rid)
                if count:
                    with self._counts_lock:
                        self._mention_counts[rid] = count

    def note_access(self, ids: list[str]) -> None:
        """Count one retrieval of each record.

        Costs a dict update on the query path. The counts reach the log at upkeep: a write's,
        or one started here once ``ACCESS_FLUSH`` distinct records wait and the last flush is
        ``ACCESS_FLUSH_S`` old (each flush is row updates plus a compaction, so not per query).
        """
        if not ids or self.read_only:  # counts that could never be written
            return
        with self._counts_lock:
            for rid in ids:
                self._accesses[rid] = self._accesses.get(rid, 0) + 1
            waiting = len(self._accesses)
            due = waiting >= ACCESS_FLUSH and time.monotonic() - self._accesses_flushed >= ACCESS_FLUSH_S
        if due or waiting >= ACCESS_FLUSH_MAX:
            self._maintain_in_background()

    def _flush_counts(self) -> None:
        """Write pending mention and access counts to the log; on failure they wait for the next upkeep."""
        with self._counts_lock:
            counts, self._mention_counts = self._mention_counts, {}
            accesses, self._accesses = self._accesses, {}
            self._accesses_flushed = time.monotonic()
        try:
            if counts:
                self.log.set_mention_counts(counts)
                counts = {}
            if accesses:
                self.log.add_accesses(accesses, datetime.now(UTC))
        except BaseException:
            with self._counts_lock:  # put back what did not land (mention counts are absolute)
                for rid, count in counts.items():
                    self._mention_counts[rid] = max(count, self._mention_counts.get(rid, 0))
                for rid, n in accesses.items():
                    self._accesses[rid] = self._accesses.get(rid, 0) + n
            raise

    def retract(self, user_id: str, ids: list[str], session_id: str = "") -> None:
        """Remove derived records that a fresh version replaces (summaries of a session).

        Not a forget: their text comes from records that stay, so there is nothing to purge;
        the overlays drop them in the background, after any pending write of theirs, and the
        intent stays until the BM25 delete is committed.
        """
        with self._write_lock:
            intent = self.journal.begin(Intent("delete", user_id, ids))
            self.log.delete(ids, user_id)
            ledger = self._ledgers.get(user_id)
            if ledger is not None:
                ledger.drop_summaries(session_id, ids)
        self.overlays.delete(user_id, intent, ids)

    def delete(self, user_id: str, ids: list[str]) -> DeleteReport:
        """Delete records of one user everywhere, with what was derived from them, and purge.

        Derived records (facts, summaries) citing a deleted record go too. The turn that
        followed a deleted message is re-indexed against its new previous turn, so no
        overlay keeps a trace of the deleted text.

        An earlier delete of the user that did not finish (``unfinished_ids``) is finished
        first, even when ``ids`` is empty or names nothing left: its records are then listed
        in ``DeleteReport.finished``.
        """
        self.check_writable()
        report = DeleteReport()
        with self.writing(user_id):
            self.wait_for_writes(user_id)
            with self._write_lock:
                self._redo_deletes(user_id)
                all_ids = self._with_derived(user_id, ids) if ids else []
                existing = self.log.get(user_id, all_ids) if all_ids else {}
                report.ids = [rid for rid in all_ids if rid in existing]
                report.sessions = {r.session_id for r in existing.values() if r.session_id}
                if report.ids:
                    links = self._links(user_id, report.ids)
                    intent = self.journal.begin(Intent("delete", user_id, report.ids, extra=links))
                    try:
                        self._delete_now(user_id, report, intent.extra)
                    except BaseException:
                        self._unfinished[intent.token] = intent  # done again by the user's next delete
                        raise
                    self._purge_later(intent)
        self._purge_user(user_id, report)  # the records are out of every store: writes may go on
        return report

    def unfinished_ids(self, user_id: str) -> set[str]:
        """Records of the user that a delete removed without finishing (it raised, or its purge
        failed): out of the log, maybe not yet out of every overlay or off the disk. The
        user's next delete finishes them."""
        with self._write_lock:
            stalled = [self._purges[t] for t in self._stalled if t in self._purges]
            intents = [*self._unfinished.values(), *stalled]
            return {rid for intent in intents if intent.user_id == user_id for rid in intent.ids}

    def _redo_deletes(self, user_id: str) -> None:
        """Run again the user's deletes that raised part way (under the write lock), as start-up
        repair would; their purges count as stalled, so the receipt lists what they removed."""
        for token, intent in list(self._unfinished.items()):
            if intent.user_id != user_id:
                continue
            self._delete_now(user_id, DeleteReport(ids=list(intent.ids)), intent.extra)
            del self._unfinished[token]
            self._stalled.add(self._purge_later(intent).token)

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
            with self._write_lock:
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
        with self._write_lock:
            earlier = [p for p in done if p.token in self._stalled and p.user_id == user_id]
            self._stalled.difference_update(p.token for p in done)
        own = set(report.ids)
        report.finished = list(dict.fromkeys(rid for p in earlier for rid in p.ids if rid not in own))

    def _with_derived(self, user_id: str, ids: list[str]) -> list[str]:
        out = list(dict.fromkeys(ids))
        frontier = list(out)
        while frontier:
            derived = self.graph.derived_from(frontier)
            frontier = [d for ds in derived.values() for d in ds if d not in out]
            out.extend(dict.fromkeys(frontier))
        return out

    def _links(self, user_id: str, ids: list[str]) -> dict[str, dict[str, str]]:
        """What a delete's intent keeps of its records' links (ids only), for a delete run again
        once they are out of the log: the turn before each, and what replaced each."""
        rows = self.log.select(RecordFilter(user_id, ids=tuple(ids)), ["id", "prev_id", "superseded_by"])
        return {"prev": {r["id"]: r["prev_id"] for r in rows if r["prev_id"]},
                "replaced_by": {r["id"]: r["superseded_by"] for r in rows if r["superseded_by"]}}  # fmt: skip

    def _delete_now(self, user_id: str, report: DeleteReport, links: dict[str, Any] | None = None) -> None:
        """Delete ``report.ids`` from the log and every overlay (under the write lock); ``links``
        (``_links``) stands in for the rows a delete run before already took out of the log."""
        ids = report.ids
        gone = set(ids)
        following = self.log.records(RecordFilter(user_id, follows=tuple(ids)))
        successors = [r for r in following if r.id not in gone]
        deleted = self.log.select(RecordFilter(user_id, ids=tuple(ids)), ["id", "prev_id", "superseded_by"])
        links = links or {}
        prev_of = {**links.get("prev", {}), **{row["id"]: row["prev_id"] for row in deleted}}
        replaced_by = {**links.get("replaced_by", {}), **{row["id"]: row["superseded_by"] for row in deleted}}
        with self._counts_lock:
            for rid in ids:
                self._accesses.pop(rid, None)
                self._mention_counts.pop(rid, None)
        report.per_store["log"] = self.log.delete(ids, user_id)
        self._reopen(user_id, gone, replaced_by)
        report.per_store["graph"] = self.graph.delete(ids)
        if successors:
            self._recontext(user_id, successors, prev_of, gone)
        # Out of every search now; the purge rebuilds the index to get their terms out of its segments.
        report.per_store["bm25"] = self.bm25.delete(user_id, ids)
        self._forgotten(user_id)

    def _reopen(self, user_id: str, gone: set[str], replaced_by: dict[str, str]) -> None:
        """What deleted records had replaced: pointed at what replaced them in turn, else current
        again (forgetting "I moved to Bergen" leaves Oslo as where the user lives), and then
        so are the messages the reopened facts were read from."""
        rows = self.log.select(RecordFilter(user_id, replaced_by=tuple(sorted(gone))),
                               ["id", "kind", "superseded_by", "valid_to", "derived_from"])  # fmt: skip
        sources: set[str] = set()
        for row in rows:
            after, seen = row["superseded_by"], set()
            while after in gone and after not in seen:  # Lyon -> Porto (forgotten) -> Paris
                seen.add(after)
                after = replaced_by.get(after, "")
            if after and after not in gone:
                self.log.set_superseded(row["id"], after, row["valid_to"], user_id)
                continue
            self.log.set_superseded(row["id"], "", None, user_id)
            self.graph.close_relation(row["id"], None)
            if row["kind"] == "fact":
                sources.update(s for s in row["derived_from"] or [] if s not in gone)
        if sources:
            replaced = RecordFilter(user_id, current=False, ids=tuple(sorted(sources)))
            for rid in self.log.ids(replaced):
                self.log.set_superseded(rid, "", None, user_id)

    def _recontext(self, user_id: str, successors: list[Record], prev_of: dict[str, str], gone: set[str]) -> None:
        """Point each successor at the nearest surviving earlier turn and recompute its vector
        and its BM25 document (which held the deleted turn's words as context)."""
        new_prev: dict[str, str] = {}
        for rec in successors:
            prev = rec.prev_id
            while prev in gone:
                prev = prev_of.get(prev, "")
            new_prev[rec.id] = prev
        wanted = [r.id for r in successors] + [p for p in new_prev.values() if p]
        emb = self.log.vectors(user_id, wanted)
        before = self.log.get(user_id, [p for p in new_prev.values() if p])
        updates = {}
        for rec in successors:
            prev = new_prev[rec.id]
            lean = emb.get(prev) if leans_on(rec, before.get(prev)) else None
            updates[rec.id] = (prev, context_vector(emb[rec.id], lean, self.context_weight))
        self.log.update_vectors(updates, user_id)
        keys = self.keys(user_id)
        assert keys is not None
        moved = [r.model_copy(update={"prev_id": new_prev[r.id]}) for r in successors]
        self.graph.add([graph_record(r, keys) for r in moved])
        self.bm25.add([bm25_doc(r, before.get(r.prev_id)) for r in moved], commit=False)

    def _forgotten(self, user_id: str) -> None:
        """Drop what the store keeps in memory of a user whose records were deleted (and the
        sentences the session summaries read, of every user)."""
        forget_cached()
        self.catalogs.invalidate(user_id)
        self._ledgers.pop(user_id, None)
        self._last = {k: v for k, v in self._last.items() if k[0] != user_id}

    def _purge_later(self, intent: Intent, ids: list[str] | None = None) -> Intent:
        """Mark a delete done in every store, its purge still to come (under the write lock);
        returns the purge's intent, which names the records deleted (``ids``, else the delete's).

        Replaying the delete itself after a crash could delete what was written after it (a
        user dropped, then remembering again while the purge waited); a crash now replays the
        purge alone."""
        purge = self.journal.begin(Intent("purge", intent.user_id, list(intent.ids if ids is None else ids)))
        self._purges[purge.token] = purge
        self.journal.done(intent)
        return purge

    def _purge(self, user_id: str | None = None) -> list[Intent] | None:
        """Take the bytes of deleted records off the disk: the user's BM25 index rebuilt
        without them, the log's old copies and versions (``LanceLog.rewrite_deleted``, then
        ``drop_unreferenced``) and the graph's write-ahead log. Returns the purge intents it
        finished, or None if the store was closed first (the intents then run at the next
        start). Runs the user's pending purges; without ``user_id``, everyone's (start-up repair).

        The deleted records are out of every search already, and most of this runs beside
        writes: the BM25 rebuild (``BM25Index.rebuild``; ~4-5 s at 100k records), then the
        log's rewrite and compaction of the fragments that held them (~3-6 s there). Only the
        last step holds the write lock (0.1-0.8 s there): dropping old versions and files no
        version refers to, which would race an append. None of it may race a maintenance run
        (dropping old versions under a compaction, or an index built from rows it rewrites),
        and a run can take a minute (the vector index at 100k records: ~45 s), so it takes the
        maintenance lock first, then the write lock, in the order ``close`` does. Each purge
        does the work of every purge intent whose user's BM25 index was rebuilt after it
        began: when another purge did all of the user's, this one has nothing left to do."""
        with self._write_lock:
            begun = {t: p for t, p in self._purges.items() if user_id is None or p.user_id == user_id}
        if not begun:
            return []
        for uid in sorted({p.user_id for p in begun.values()}):
            self.rebuild_bm25(uid)
        with self._write_lock:
            self._rebuilt.update(begun)
        with self._maintenance_lock:
            with self._write_lock:
                if self._closed:
                    return None
                if not begun.keys() & self._purges.keys():
                    return []
                covered = self._rebuilt & self._purges.keys()  # their deletes are all in the log already
            self.log.rewrite_deleted()
            self.graph.checkpoint()
            with self._write_lock:
                self.log.drop_unreferenced()
                done = [self._purges.pop(token) for token in covered]
                for purge in done:
                    self.journal.done(purge)
                self._rebuilt -= covered
            return done

    def drop_user(self, user_id: str) -> DeleteReport:
        """Delete every record of a user, the user's overlays and the user's graph secret."""
        self.check_writable()
        report = DeleteReport()
        with self.writing(user_id):
            self.wait_for_writes(user_id)
            with self._write_lock:
                report.ids = self.log.ids(RecordFilter(user_id))
                intent = self.journal.begin(Intent("drop_user", user_id))
                keys = self.keys(user_id, create=False)
                report.per_store["log"] = self.log.count(RecordFilter(user_id))
                self.log.delete_user(user_id)
                self.bm25.drop_user(user_id)
                report.per_store["bm25"] = report.per_store["log"]
                report.per_store["graph"] = self.graph.drop_user(keys.user) if keys else 0
                self.log.drop_user_salt(user_id)
                self._forgotten(user_id)
                for token, failed in list(self._unfinished.items()):  # whatever they left, this removed
                    if failed.user_id == user_id:
                        del self._unfinished[token]
                        self._stalled.add(self._purge_later(failed).token)
                self._purge_later(intent, report.ids)
        self._purge_user(user_id, report)
        return report

    # -- rebuild and repair --------------------------------------------------------------

    def user_records(self, user_id: str) -> list[Record]:
        """Every record of a user, in write order."""
        return sorted(self.log.iter_records(RecordFilter(user_id)), key=lambda r: r.seq)

    def rebuild_bm25(self, user_id: str, records: Sequence[Record | DocRecord] | None = None) -> int:
        """Rebuild a user's BM25 index from the log (this also purges deleted documents), beside
        writes made meanwhile (``BM25Index.rebuild``); ``records``: every record of the user."""

        def docs(ids: set[str] | None) -> list[BM25Doc]:
            if ids is None:
                found = self.log.doc_records(RecordFilter(user_id)) if records is None else records
                by_id = {r.id: r for r in found}
            else:  # written during the rebuild, and the turns they follow
                found = self.log.doc_records(RecordFilter(user_id, ids=tuple(sorted(ids))))
                prev = {r.prev_id for r in found if r.prev_id}
                wanted = RecordFilter(user_id, ids=tuple(sorted(prev)))
                by_id = {r.id: r for r in self.log.doc_records(wanted)} if prev else {}
            return [bm25_doc(r, by_id.get(r.prev_id)) for r in found]

        return self.bm25.rebuild(user_id, docs)

    def rebuild(
        self, user_id: str | None = None, progress: Callable[[str, int], None] | None = None
    ) -> dict[str, int]:
        """Rebuild every overlay of one user (or of all users) from the log; ``progress`` is told
        each user and their record count once they are done.

        Rebuilding all users writes the graph into a new file, so nothing stays in the pages
        of the old one (such as what Kùzu leaked into it while it ran in this process). A
        journal intent covers it: a rebuild cut short is done again at the next start, since
        until it ends the graph lacks users (and ``forget`` finds derived records through it).
        """
        self.check_writable()
        out: dict[str, int] = {}
        self.wait_for_writes()
        with self._write_lock:
            intent = self.journal.begin(Intent(op="rebuild_graph", user_id="")) if user_id is None else None
            if intent is not None:
                self.graph.recreate()
            for uid in [user_id] if user_id else self.log.user_ids():
                records = self.user_records(uid)
                keys = self.keys(uid)
                assert keys is not None
                self.rebuild_bm25(uid, records)
                self.graph.rebuild(keys.user, (graph_record(r, keys) for r in records))
                self._relean(uid, records)
                self.catalogs.invalidate(uid)
                out[uid] = len(records)
                if progress is not None:
                    progress(uid, len(records))
            self.graph.checkpoint()
            self._last.clear()
            self._ledgers.clear()
            if intent is not None:
                self.journal.done(intent)
        return out

    def _relean(self, user_id: str, records: list[Record], batch: int = 500) -> int:
        """Derive again the search vectors of long turns and of the turns after them, which
        ``leans_on`` no longer leans to the turn before (a log written before long turns stood
        alone leaned them); returns how many changed."""
        by_id = {r.id: r for r in records}
        asked = [r for r in records if r.kind == "message" and r.prev_id in by_id]
        asked = [r for r in asked if r.alone or by_id[r.prev_id].alone]
        changed: dict[str, np.ndarray] = {}
        for start in range(0, len(asked), batch):
            part = asked[start : start + batch]
            emb = self.log.vectors(user_id, [r.id for r in part] + [r.prev_id for r in part])
            stored = self.log.vectors(user_id, [r.id for r in part], column="vector")
            for rec in part:
                if rec.id not in emb or rec.id not in stored:
                    continue
                lean = emb.get(rec.prev_id) if leans_on(rec, by_id[rec.prev_id]) else None
                vector = context_vector(emb[rec.id], lean, self.context_weight)
                if not np.allclose(vector, stored[rec.id], atol=1e-6):
                    changed[rec.id] = vector
        self.log.set_vectors(user_id, changed)
        return len(changed)

    def repair(self) -> int:
        """Replay writes a crash interrupted; returns how many intents were repaired."""
        self.check_writable()
        pending = self.journal.pending()
        for intent in pending:
            log.warning("repairing an interrupted %s (%d record(s))", intent.op, len(intent.ids))
            if intent.op == "drop_user":  # outside the write lock: a purge takes the maintenance lock first
                self.drop_user(intent.user_id)  # purges, under intents of its own
                self.journal.done(intent)
                continue
            with self._write_lock:
                if intent.op == "delete":
                    self._delete_now(intent.user_id, DeleteReport(ids=list(intent.ids)), intent.extra)
                    self._purge_later(intent)
                elif intent.op == "add":
                    self._repair_add(intent)
                    self.journal.done(intent)
                elif intent.op == "purge":
                    self._purges[intent.token] = intent
            if intent.op == "rebuild_graph":
                self.rebuild()  # under an intent of its own
                self.journal.done(intent)
        if self._purges:
            self._purge()  # marks every purge intent done
        return len(pending)

    def _repair_intent(self, intent: Intent) -> None:
        with self._write_lock:
            self._repair_add(intent)

    def _repair_add(self, intent: Intent) -> None:
        present = self.log.get(intent.user_id, intent.ids)
        missing = [rid for rid in intent.ids if rid not in present]
        if missing:  # never reached the log: make sure no overlay has them either
            self.graph.delete(missing)
            self.rebuild_bm25(intent.user_id)  # a delete alone would leave their terms in Tantivy's segments
        else:  # re-add just these: rebuilding a user's whole index takes seconds at 100k records
            records = sorted(present.values(), key=lambda r: r.seq)
            prev = self.log.get(intent.user_id, [r.prev_id for r in records if r.prev_id])
            try:
                self.bm25.add([bm25_doc(r, present.get(r.prev_id) or prev.get(r.prev_id)) for r in records])
            except Exception:  # the index itself is in trouble: start it afresh from the log
                log.warning("re-adding to BM25 failed; rebuilding the user's index", exc_info=True)
                self.rebuild_bm25(intent.user_id)
        keys = self.keys(intent.user_id)
        assert keys is not None
        self.graph.add([graph_record(r, keys) for r in sorted(present.values(), key=lambda r: r.seq)])
        self.catalogs.invalidate(intent.user_id)

    def wait_for_writes(self, user_id: str | None = None) -> None:
        """Read-your-writes: block until the user's (or everyone's) writes are searchable."""
        self.overlays.flush(user_id)

    def maintain(self) -> None:
        """Upkeep of the log: compact its fragments and build indexes when due (see LanceLog.maintain)."""
        self.check_writable()
        self.wait_for_writes()
        with self._maintenance_lock:
            self._flush_counts()
            self.log.maintain()

    def maintain_if_fragmented(self, threshold: int = FRAGMENTS_TO_COMPACT) -> bool:
        """Compact in the background when a previous run left many small fragments (a server that
        stored messages one by one and stopped before its next compaction): every read of the log
        slows with them (a by-id read of 60 records: 68 ms at 154 fragments, 12 ms compacted).
        Also when a purge left the log without the vector index it should have."""
        if self.read_only:
            return False
        if self.log.fragments_to_compact() < threshold and not self.log.needs_vector_index():
            return False  # (a purge drops the vector index; the next maintenance builds it again)
        self._maintain_in_background()
        return True

    def _maintain_in_background(self) -> None:
        """Every ``maintain_every`` appends: small appends pile up fragments, and every filtered
        read and update slows with their number (an update: 8 ms on a compacted log, 180 ms at 300
        fragments). Writes go on meanwhile; only a purge waits for it."""
        if self._maintenance_lock.locked():
            return

        def run() -> None:
            with self._maintenance_lock:
                if self._closed:  # close() came first: the stores and the data-directory lock are gone
                    return
                try:
                    self._flush_counts()
                    self.log.maintain()
                except Exception:
                    log.exception("log maintenance failed; it will be tried again")

        threading.Thread(target=run, name="mnemoplan-maintenance", daemon=True).start()

    def close(self) -> None:
        """Flush and release every store and the data-directory lock."""
        self.overlays.close()
        with self._maintenance_lock:
            self._closed = True
            try:
                self._flush_counts()
            except Exception:  # counts are bookkeeping: closing the stores matters more
                log.exception("mention and access counts could not be written at close")
        with self._maintenance_lock, self._write_lock:  # the order a purge takes them in
            with ExitStack() as closing:  # each runs, last pushed first, whatever the others raise
                closing.callback(self._dir_lock.release)
                closing.callback(self.graph.close)
                closing.callback(self.graph.checkpoint)
                closing.callback(self.bm25.close)
