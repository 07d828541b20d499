"""The memory store: the log and every overlay, written and deleted together.

Every write goes to the log first and then to each overlay under a journal intent;
every delete reaches every store and then purges old versions, segments and pages so
the bytes leave the disk. A crash in between is repaired by ``repair()`` at start-up.

The store opens, writes and closes; its parts do the rest: deletes and purges
(``deletion.py``), rebuilds (``rebuild.py``), start-up repair (``repair.py``), the write
path's per-user state (``bookkeeping.py``) and counts waiting for upkeep (``counters.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from mnemoplan.errors import READ_ONLY_HINT, ReadOnlyData
from mnemoplan.model import DocRecord, Record
from mnemoplan.model.records import as_utc
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.bm25 import BM25Index
from mnemoplan.storage.bookkeeping import LastTurn, WriteBookkeeping
from mnemoplan.storage.catalog import EntityCatalog
from mnemoplan.storage.counters import PendingCounts
from mnemoplan.storage.deletion import DeleteReport, Deleter, ForgetListener
from mnemoplan.storage.documents import KeyHasher, bm25_doc, context_vector, graph_record, leans_on, user_keys
from mnemoplan.storage.graph.client import GraphError, GraphIndex, GraphUnreadable
from mnemoplan.storage.journal import Intent, WriteJournal
from mnemoplan.storage.ledger import UserLedger
from mnemoplan.storage.lock import DataDirLock
from mnemoplan.storage.locks import StoreLocks
from mnemoplan.storage.log.table import LanceLog
from mnemoplan.storage.overlays import OverlayWriter
from mnemoplan.storage.rebuild import Progress, Rebuilder
from mnemoplan.storage.repair import Repairer
from mnemoplan.storage.replica import Replica
from mnemoplan.storage.supersession import Supersession
from mnemoplan.storage.log.heads import UserHeads

__all__ = ["FRAGMENTS_TO_COMPACT", "DeleteReport", "MemoryStore"]

log = logging.getLogger(__name__)

FRAGMENTS_TO_COMPACT = 16  # small log fragments found at start-up that call for a compaction


class MemoryStore:
    """The log plus the BM25 and graph overlays under one data directory.

    A data directory that cannot be written when the store opens is opened to read only
    (``read_only``): searches work, and every write raises ``ReadOnlyData``. Nothing is repaired
    or maintained then; a store opened again once the directory can be written does both.

    Args:
        data_dir: Root directory; created if missing and locked for this process.
        context_weight: How far a message's search vector leans towards the previous turn.
        ann_min_rows: Rows at which the log builds an approximate vector index (once a user is
            past ``vector_cache_rows``).
        commit_interval_s: Longest a burst of writes defers the BM25 commit.
        maintain_every: Appends between background compactions of the log.
        graph_buffer_pool_mb: Kùzu's page cache; allocated as used, a limit rather than a reservation.
        vector_cache_rows: Users with at most this many records are searched exactly, in memory
            (1.5 KB a row); larger ones through LanceDB's ANN index.
        token_cache_tokens: Users with at most this many token vectors have them held in memory
            (130 bytes each); larger ones are read from the log when a search asks.
        forgotten: Told the user's id whenever a delete removed records of theirs: what other
            parts hold of what users said (the write path's sentence cache) goes with them.
        storage_uri: Where the log's tables are, when not in the data directory (object storage).
        storage_options: LanceDB's options for ``storage_uri``.
        count_accesses: Count what searches return (``note_access``): the use weight reads it.

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
        forgotten: Sequence[ForgetListener] = (),
        storage_uri: str | None = None,
        storage_options: dict[str, str] | None = None,
        count_accesses: bool = False,
    ) -> None:
        self.data_dir = data_dir
        # Retrievals are counted only for a ranking or a caller that reads them: upkeep writes the
        # counts into rows all over the log, and the next forget's purge rewrites every fragment
        # those updates touched (on a 505k-record store under load, purges never caught up).
        self.count_accesses = count_accesses
        self._dir_lock = DataDirLock.acquire(data_dir)
        self.read_only = not self._dir_lock.writable
        try:
            self.log = LanceLog(data_dir / "log", ann_min_rows=ann_min_rows, cache_vectors_per_user=vector_cache_rows,
                                cache_tokens_per_user=token_cache_tokens, read_only=self.read_only,
                                uri=storage_uri, storage_options=storage_options)  # fmt: skip
            self.bm25 = BM25Index(data_dir / "bm25", read_only=self.read_only)
            self.journal = WriteJournal(data_dir / "journal")
            self.graph = self._open_graph(data_dir / "graph" / "graph.kuzu", graph_buffer_pool_mb)
        except BaseException:
            self._dir_lock.release()
            raise
        self.context_weight = context_weight
        self.locks = StoreLocks()
        self._writes_since_compact = 0
        self.maintain_every = maintain_every
        self.counts = PendingCounts(self.log)
        self.bookkeeping = WriteBookkeeping(self.log, self.counts, self.locks.write)
        self.catalogs = self.bookkeeping.catalogs
        self.overlays = OverlayWriter(
            self.bm25, self.graph, self.journal, self._repair_intent, interval_s=commit_interval_s
        )
        self.rebuilder = Rebuilder(
            log=self.log, bm25=self.bm25, graph=self.graph, journal=self.journal, overlays=self.overlays,
            locks=self.locks, bookkeeping=self.bookkeeping, context_weight=context_weight,
        )
        self.deleter = Deleter(
            log=self.log, bm25=self.bm25, graph=self.graph, journal=self.journal, overlays=self.overlays,
            locks=self.locks, counts=self.counts, bookkeeping=self.bookkeeping, rebuilder=self.rebuilder,
            context_weight=context_weight, forgotten=forgotten,
        )
        self.repairer = Repairer(
            log=self.log, bm25=self.bm25, graph=self.graph, journal=self.journal, locks=self.locks,
            bookkeeping=self.bookkeeping, rebuilder=self.rebuilder, deleter=self.deleter,
        )
        self.supersession = Supersession(self.log, self.bm25, self.graph, self.overlays, self.locks, self.bookkeeping,
                                         self._begin, self._changed)  # fmt: skip
        # A log other servers share: each call of a user first catches up with what they wrote.
        self.replica = Replica(UserHeads(self.log.tables), self.rebuilder.refresh, self.writing) \
            if self.log.shared else None  # fmt: skip

    def _open_graph(self, path: Path, buffer_pool_mb: int) -> GraphIndex:
        """The graph database; one Kùzu cannot open starts afresh and is rebuilt from the log
        (``repair``): it only ever holds what the log does, and without it no server starts."""
        try:
            return GraphIndex(path, buffer_pool_mb=buffer_pool_mb, read_only=self.read_only)
        except GraphUnreadable as exc:
            if self.read_only or not GraphIndex.opens_afresh(path, buffer_pool_mb):
                raise  # not the file: a new one would fail the same way, so it stays as it is
            log.warning("%s; it is rebuilt from the log", exc)
        self._note_graph_rebuild()  # first: if the new file cannot be opened either, the next start rebuilds it
        return GraphIndex(path, buffer_pool_mb=buffer_pool_mb, fresh=True)

    def _note_graph_rebuild(self) -> None:
        """Journal that the graph must be rebuilt from the log (``repair`` does it), once."""
        if not any(intent.op == "rebuild_graph" for intent in self.journal.pending()):
            self.journal.begin(Intent(op="rebuild_graph", user_id=""))

    # -- helpers -----------------------------------------------------------------------

    def catch_up(self, user_id: str) -> None:
        """Before a call of the user: on a shared log, make this server's caches of the user hold
        what the log holds now (``replica.Replica``); nothing to do on a log of this server alone.
        Never called holding the user's write lock."""
        if self.replica is not None:
            self.replica.catch_up(user_id)

    def _begin(self, user_id: str) -> None:
        """Before a change of the user's records reaches the log: on a shared log, other servers are
        told one is under way (should this server die before ``_changed``, they do not trust their
        caches of the user)."""
        if self.replica is not None:
            self.replica.begin(user_id)

    def _changed(self, user_id: str) -> None:
        """After a change of the user's records reached the log: on a shared log, other servers are told."""
        if self.replica is not None:
            self.replica.published(user_id)

    def check_writable(self) -> None:
        """Raise ``ReadOnlyData`` if the store was opened to read only.

        Raises:
            ReadOnlyData: It was.
        """
        if self.read_only:
            raise ReadOnlyData(
                f"The data directory {self.data_dir} could not be written to when the server opened it, "
                "so it serves reads only.", hint=READ_ONLY_HINT,
            )  # fmt: skip

    def keys(self, user_id: str, *, create: bool = True) -> KeyHasher | None:
        """The keyed hasher of a user's graph names (None if the user has none yet)."""
        return user_keys(self.log, user_id, create=create)

    @contextmanager
    def writing(self, user_id: str) -> Iterator[None]:
        """Hold the user's write lock, one per user with a write under way or waiting (another
        user's long import never holds this one's up).

        A remember holds it from its read of what is stored (repeats, current facts, the
        session's messages for its summary) to its write; a forget holds it while it deletes,
        so a remember never stores a summary or a fact of messages deleted meanwhile.
        """
        with self.locks.users.hold(user_id):
            yield

    def drop_ledger(self, user_id: str) -> None:
        """Forget the user's ledger (see ``WriteBookkeeping.drop_ledger``)."""
        self.bookkeeping.drop_ledger(user_id)

    def catalog(self, user_id: str) -> EntityCatalog:
        """The user's entity catalog."""
        return self.catalogs.get(user_id)

    def ledger(self, user_id: str) -> UserLedger:
        """The user's write-path bookkeeping (``UserLedger``, read from the log once)."""
        return self.bookkeeping.ledger(user_id)

    def existing(self, user_id: str, session_id: str, hashes: list[str], sources: list[str]) -> dict[str, str]:
        """Ids already stored, by content hash and by ``src:<source id>`` within the session."""
        return self.bookkeeping.existing(user_id, session_id, hashes, sources)

    def session_tail(self, user_id: str, session_id: str, count: int) -> list[tuple[str, str]]:
        """(content hash, id) of a session's last ``count`` messages, oldest first."""
        return self.bookkeeping.session_tail(user_id, session_id, count)

    # -- writes ------------------------------------------------------------------------

    def append(
        self, records: list[Record], embeddings: np.ndarray, tokens: list[bytes | None] | None = None
    ) -> list[Record]:
        """Store new records (in conversation order) in the log and every overlay.

        Assigns each record its sequence number and, for messages, the previous turn of
        its session, from which its contextual BM25 text and search vector are derived.

        Returns:
            The records as stored.

        Raises:
            ReadOnlyData: The store serves reads only.
            ValueError: The records are of more than one user.
        """
        if not records:
            return []
        self.check_writable()
        user_id = records[0].user_id
        if any(r.user_id != user_id for r in records):
            raise ValueError("append() takes the records of one user")
        with self.locks.write:
            seqs = self.log.next_seqs(len(records))
            stored: list[Record] = []
            vectors = np.zeros_like(embeddings)
            prevs: list[Record | None] = []
            # Each session's last message in this batch; it becomes the session's previous turn
            # for later calls only once the log holds it.
            last: dict[tuple[str, str], LastTurn] = {}
            for i, (rec, seq) in enumerate(zip(records, seqs, strict=True)):
                prev, prev_emb = (None, None)
                if rec.kind == "message":
                    key = (rec.user_id, rec.session_id)
                    prev, prev_emb = last[key] if key in last else self.bookkeeping.previous(rec)
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
            ledger = self.bookkeeping.loaded_ledger(user_id)
            self._begin(user_id)
            try:
                self.log.add(stored, embeddings, vectors, tokens)
            except BaseException:
                self.bookkeeping.drop_ledger(user_id)
                raise  # the intent stays: repair removes whatever reached a store
            self.bookkeeping.stored(ledger, stored, embeddings, last)
            self._writes_since_compact += 1
            if self._writes_since_compact >= self.maintain_every:
                self._writes_since_compact = 0
                self._maintain_in_background()

        self.overlays.add(user_id, intent, docs, nodes)
        self._changed(user_id)
        return stored

    def supersede(self, user_id: str, old_id: str, new_id: str, at: datetime | None = None) -> None:
        """Close an old fact's validity in favour of a newer one (see ``Supersession.supersede``)."""
        self.supersession.supersede(user_id, old_id, new_id, at)

    def supersede_mentions(
        self, user_id: str, old_values: list[str], new_value: str, at: datetime, by_id: str, speakers: tuple[str, ...]
    ) -> int:
        """Close the records that stated a value now replaced or ended (see ``Supersession.mentions``)."""
        return self.supersession.mentions(user_id, old_values, new_value, at, by_id, speakers)

    def reinforce(self, user_id: str, fact_ids: list[str]) -> None:
        """Facts said again: count the mentions instead of storing copies.

        The counts reach the log at the next maintenance (or close), in one update: a row
        update per remember would contend with compaction and slow every write.
        """
        if not fact_ids:
            return
        with self.locks.write:
            ledger = self.ledger(user_id)
            for rid in fact_ids:
                count = ledger.reinforce(rid)
                if count:
                    self.counts.set_mentions(rid, count)

    def note_access(self, ids: list[str]) -> None:
        """Count one retrieval of each record (``PendingCounts.note_access``); upkeep writes the
        counts, started here when they are due."""
        if not ids or self.read_only or not self.count_accesses:  # not counted, or never writable
            return
        if self.counts.note_access(ids):
            self._maintain_in_background()

    def retract(self, user_id: str, ids: list[str], session_id: str = "") -> None:
        """Remove derived records that a fresh version replaces (summaries of a session).

        Not a forget: their text comes from records that stay, so there is nothing to purge;
        the overlays drop them in the background, after any pending write of theirs, and the
        intent stays until the BM25 delete is committed.
        """
        with self.locks.write:
            intent = self.journal.begin(Intent("delete", user_id, ids))
            self._begin(user_id)
            self.log.delete(ids, user_id)
            ledger = self.bookkeeping.loaded_ledger(user_id)
            if ledger is not None:
                ledger.drop_summaries(session_id, ids)
        self.overlays.delete(user_id, intent, ids)
        self._changed(user_id)

    # -- deletes (deletion.py) -------------------------------------------------------------

    def delete(self, user_id: str, ids: list[str]) -> DeleteReport:
        """Delete records of one user everywhere, with what was derived from them, and purge
        (see ``Deleter.delete``).

        Raises:
            ReadOnlyData: The store serves reads only.
        """
        self.check_writable()
        self._begin(user_id)
        try:
            return self.deleter.delete(user_id, ids)
        finally:
            self._changed(user_id)

    def drop_user(self, user_id: str) -> DeleteReport:
        """Delete every record of a user, the user's overlays and the user's graph secret.

        Raises:
            ReadOnlyData: The store serves reads only.
        """
        self.check_writable()
        self._begin(user_id)
        try:
            return self.deleter.drop_user(user_id)
        finally:
            self._changed(user_id)

    def unfinished_ids(self, user_id: str) -> set[str]:
        """Records of the user that a delete removed without finishing (see ``Deleter.unfinished_ids``)."""
        return self.deleter.unfinished_ids(user_id)

    # -- rebuild and repair (rebuild.py, repair.py) ----------------------------------------

    def user_records(self, user_id: str) -> list[Record]:
        """Every record of a user, in write order."""
        return self.rebuilder.user_records(user_id)

    def rebuild_bm25(self, user_id: str, records: Sequence[Record | DocRecord] | None = None) -> int:
        """Rebuild a user's BM25 index from the log (see ``Rebuilder.rebuild_bm25``)."""
        return self.rebuilder.rebuild_bm25(user_id, records)

    def rebuild(self, user_id: str | None = None, progress: Progress | None = None) -> dict[str, int]:
        """Rebuild every overlay of one user (or of all users) from the log (see ``Rebuilder.rebuild``).

        Raises:
            ReadOnlyData: The store serves reads only.
        """
        self.check_writable()
        return self.rebuilder.rebuild(user_id, progress)

    def repair(self) -> int:
        """Replay writes a crash interrupted; returns how many intents were repaired.

        A graph that refuses the repair starts afresh and is rebuilt from the log: seen once
        after a SIGKILL, when Kùzu's replay of its write-ahead log left one direction of a
        relationship table without edges the other held, and replaying a forget then failed
        ("has connected edges ... which cannot be deleted") at every start and every reindex.

        Raises:
            ReadOnlyData: The store serves reads only.
            GraphError: The graph refused the repair again once rebuilt.
        """
        self.check_writable()
        try:
            return self.repairer.repair()
        except GraphError as exc:
            log.error("the graph refused to repair an interrupted write (%s); it is rebuilt from the log", exc)
        self._note_graph_rebuild()
        self.graph.recreate()
        return self.repairer.repair()

    def _repair_intent(self, intent: Intent) -> None:
        """Reconcile the overlays with the log for an append whose overlay write failed."""
        with self.locks.write:
            self.repairer.repair_add(intent)

    # -- upkeep ----------------------------------------------------------------------------

    def wait_for_writes(self, user_id: str | None = None) -> None:
        """Read-your-writes: block until the user's (or everyone's) writes are searchable."""
        self.overlays.flush(user_id)

    def maintain(self) -> None:
        """Upkeep of the log: compact its fragments and build indexes when due (see LanceLog.maintain).

        Raises:
            ReadOnlyData: The store serves reads only.
        """
        self.check_writable()
        self.wait_for_writes()
        with self.locks.maintenance:
            self.counts.flush()
            self.log.maintain()

    def maintain_if_fragmented(self, threshold: int = FRAGMENTS_TO_COMPACT) -> bool:
        """Compact in the background when a previous run left many small fragments (a server that
        stored messages one by one and stopped before its next compaction): every read of the log
        slows with them (a by-id read, several times over).
        Also when a purge left the log without the vector index it should have."""
        if self.read_only:
            return False
        if self.log.fragments_to_compact() < threshold and not self.log.needs_vector_index():
            return False  # (a purge of a fragment deleted whole drops the vector index; maintenance builds it again)
        self._maintain_in_background()
        return True

    def _maintain_in_background(self) -> None:
        """Every ``maintain_every`` appends: small appends pile up fragments, and every filtered
        read and update slows with their number. Writes go on meanwhile; only a purge waits for
        it."""
        if self.locks.maintenance.locked():
            return

        def run() -> None:
            with self.locks.maintenance:
                if self.locks.closed:  # close() came first: the stores and the data-directory lock are gone
                    return
                try:
                    self.counts.flush()
                    self.log.maintain()
                except Exception:
                    log.exception("log maintenance failed; it will be tried again")

        threading.Thread(target=run, name="mnemoplan-maintenance", daemon=True).start()

    def close(self) -> None:
        """Flush and release every store and the data-directory lock."""
        self.overlays.close()
        with self.locks.maintenance:
            self.locks.closed = True
            try:
                self.counts.flush()
            except Exception:  # counts are bookkeeping: closing the stores matters more
                log.exception("mention and access counts could not be written at close")
        with self.locks.maintenance, self.locks.write:  # the order a purge takes them in
            with ExitStack() as closing:  # each runs, last pushed first, whatever the others raise
                closing.callback(self._dir_lock.release)
                closing.callback(self.graph.close)
                closing.callback(self.graph.checkpoint)
                closing.callback(self.bm25.close)
