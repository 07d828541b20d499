"""Upkeep of the log: compaction, indexes, and the purge that takes deleted rows off the disk.

A LanceDB delete or update only marks rows; their bytes stay in the fragment that held them,
and in old versions, until that fragment is written again and the versions are dropped.
Every delete and update notes the fragments it marks (``purge.json``), so a purge rewrites
exactly those, even after a crash.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from datetime import timedelta
from pathlib import Path

import pyarrow.compute as pc
from lancedb.index import BTree, HnswSq
from lancedb.table import LanceTable

from mnemoplan.storage.log.schema import SCALAR_COLUMNS
from mnemoplan.storage.log.tables import LogTables

OLD_VERSIONS_KEPT = timedelta(minutes=5)  # past this, maintenance deletes superseded versions


class Maintenance:
    """Compaction, indexes and purges of the log's tables, and the fragments deletes left behind.

    Args:
        tables: The log's tables.
        path: Directory of the log, where the notes of fragments are kept.
        ann_min_rows: Build an approximate vector index once the table has this many rows.
    """

    def __init__(self, tables: LogTables, path: Path, *, ann_min_rows: int = 50_000) -> None:
        self._tables = tables
        self._ann_min_rows = ann_min_rows
        self._scalar_min_rows = max(1, ann_min_rows // 10)
        # Compaction rewrites fragments; an update or delete committed meanwhile makes it fail
        # ("Rewrite preempted by Update"). Appends commute with it and never take this lock.
        # Reentrant: a purge holds it and rewrites fragments, each batch of which takes it.
        self.rewrite_lock = threading.RLock()
        self._maintained = path / "maintenance.json"  # small fragments the last maintenance left
        # Per table, the fragments holding rows deleted since the last purge.
        self._rewrites = path / "purge.json"
        try:
            saved = json.loads(self._rewrites.read_text(encoding="utf-8"))
            self._to_rewrite: dict[str, set[int]] = {name: set(frags) for name, frags in saved.items()}
        except (OSError, ValueError, AttributeError, TypeError):
            self._to_rewrite = {}

    # -- deletes and updates -------------------------------------------------------------

    def delete(self, table: LanceTable, where: str) -> None:
        """Delete rows, first noting the fragments that hold them."""
        self.note_fragments(table, where)
        table.delete(where)

    def note_fragments(self, table: LanceTable, where: str) -> None:
        """Note the fragments holding these rows, before a delete or an update leaves a marked
        copy of them there (kept on disk until ``purge`` has rewritten those fragments, so a
        crash in between does not lose them)."""
        rows = table.search().where(where).with_row_id(True).select([]).limit(None).to_arrow()
        fragments = {int(r) >> 32 for r in rows.column("_rowid").to_pylist()}
        noted = self._to_rewrite.setdefault(table.name, set())
        if not fragments <= noted:
            noted |= fragments
            self._save_to_rewrite()

    def _save_to_rewrite(self) -> None:
        scratch = self._rewrites.with_suffix(".tmp")
        scratch.write_text(json.dumps({k: sorted(v) for k, v in self._to_rewrite.items()}), encoding="utf-8")
        os.replace(scratch, self._rewrites)

    # -- purge -----------------------------------------------------------------------------

    def rewrite_deleted(self) -> None:
        """Rewrite the fragments that hold rows deleted so far, beside appends; the old
        versions that still refer to their files go at ``drop_unreferenced``, which ends a purge.

        A delete only marks rows. Compaction rewrites a fragment for its deletions alone once
        a tenth of its rows are gone, and never merges fragments under different deltas of the
        vector index: one message forgotten out of forty, or out of a 100k-record log, stayed
        in its file. So each such fragment's remaining rows are written again, unchanged (a
        merge on the key, in batches: every batch is one commit, no reader misses a row), and
        a fragment left with no rows leaves the table. Updates and deletes wait for one batch
        at a time, or for the closing compaction, not for the whole. Fragments noted meanwhile
        wait for the next purge: what they hold was not yet deleted when this one began.

        Old versions are dropped as maintenance drops them, not all: dropping the version an
        append began from, before it commits, loses the append (Lance issue #3718).
        ``drop_unreferenced`` drops the rest, with no append running.
        """
        with self.rewrite_lock:
            noted = {name: sorted(fragments) for name, fragments in self._to_rewrite.items()}
        for table, key in self._keyed_tables():
            fragments = noted.get(table.name, [])
            for fragment in fragments:
                self._rewrite_fragment(table, key, fragment)
            with self.rewrite_lock, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if table is self._tables.records and fragments:
                    self._drop_index_copies(table)
                table.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                self._to_rewrite[table.name] = self._to_rewrite.get(table.name, set()) - set(fragments)
                self._save_to_rewrite()

    def drop_unreferenced(self) -> None:
        """Drop every old version (the rewritten fragments' files go with them) and every
        file no version refers to: a failed commit's (a compaction an update preempted could
        have copied a row deleted since). Must not run beside an append: it could drop the
        version the append began from, and its files look unreferenced until it commits.

        On a log other servers share, one of theirs may be under way whatever this server
        holds: versions go once older than ``OLD_VERSIONS_KEPT`` (here, or at any server's next
        maintenance), which no commit takes. (Through ``optimize``, as the rest of maintenance:
        LanceDB's ``cleanup_old_versions`` needs the ``pylance`` package, which is not installed.)"""
        with self.rewrite_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for table, _ in self._keyed_tables():
                if self._tables.shared:
                    table.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                else:
                    table.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)

    def _keyed_tables(self) -> list[tuple[LanceTable, str]]:
        """The tables a purge rewrites, with the column that keys their rows."""
        pairs = ((self._tables.records, "id"), (self._tables.keys, "user_id"))
        return [(table, key) for table, key in pairs if table is not None]

    @staticmethod
    def _drop_index_copies(table: LanceTable) -> None:
        """Indexes keep their own copies of what they index: the ids and session ids of deleted
        rows stayed in the B-tree pages, their vectors in the vector index. The B-trees are
        rebuilt (quickly); the vector index (slow to build on a large log) is dropped, for the
        next ``maintain`` (after more writes, or at start) to build again.
        Meanwhile vector search scans exactly; it only serves users too large to hold in memory."""
        names = {idx.name for idx in table.list_indices()}
        for column in SCALAR_COLUMNS:
            if f"{column}_idx" in names:
                table.create_index(column, config=BTree(), name=f"{column}_idx", replace=True)
        if "vector_idx" in names:
            table.drop_index("vector_idx")

    def _rewrite_fragment(self, table: LanceTable, key: str, fragment: int, batch: int = 20_000) -> None:
        """Write a fragment's rows again: the old copies are marked, the fragment goes when
        all are. Row ids here are row addresses: the fragment in the high 32 bits. Each batch
        is read and written under the rewrite lock; an update between two moves its row out
        of the fragment, and the next batch does not see it."""
        base = fragment << 32
        here = f"_rowid >= {base} AND _rowid < {base + (1 << 32)}"
        offsets = table.search().where(here).with_row_id(True).select([]).limit(None).to_arrow()
        if offsets.num_rows == 0:
            return
        end = int(pc.max(offsets.column("_rowid")).as_py()) + 1
        for start in range(base, end, batch):
            with self.rewrite_lock:
                within = f"_rowid >= {start} AND _rowid < {min(start + batch, end)}"
                rows = table.search().where(within).limit(None).to_arrow()
                if rows.num_rows:
                    table.merge_insert(key).when_matched_update_all().execute(rows)

    # -- compaction and indexes --------------------------------------------------------

    def maintain(self) -> None:
        """Compact the fragments many small writes leave, and index what has grown big enough.

        Scalar (B-tree) indexes on the filtered columns past ``scalar_min_rows``, the
        approximate vector index past ``ann_min_rows``; new rows are folded into existing
        indexes. Versions older than ``OLD_VERSIONS_KEPT`` go: at LanceDB's default week,
        each compaction's superseded files stayed, and a store grew fifteen times its size
        in an hour of ingest (``purge`` drops them all at once).

        Raises:
            RuntimeError: Compaction failed (a commit conflict, after three tries).
        """
        table = self._tables.records
        if table is None:
            return
        rows = table.count_rows()
        names = {idx.name for idx in table.list_indices()}
        if rows >= self._scalar_min_rows:
            for column in SCALAR_COLUMNS:
                if f"{column}_idx" not in names:
                    table.create_index(column, config=BTree(), name=f"{column}_idx")
        if rows >= self._ann_min_rows and "vector_idx" not in names:
            table.create_index("vector", config=HnswSq(distance_type="cosine"), name="vector_idx")
        with self.rewrite_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for attempt in range(3):
                try:
                    table.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                    break
                except RuntimeError as exc:  # a commit conflict is retryable; anything else is not
                    if "conflict" not in str(exc).lower() or attempt == 2:
                        raise
            for side in self._tables.side:  # a version per write otherwise: every read lists them all
                try:
                    side.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                except RuntimeError as exc:  # another server compacting it: its turn
                    if "conflict" not in str(exc).lower():
                        raise
        left = {"small_fragments_left": self.small_fragments()}
        scratch = self._maintained.with_suffix(".tmp")
        scratch.write_text(json.dumps(left), encoding="utf-8")
        scratch.replace(self._maintained)

    def needs_vector_index(self) -> bool:
        """Whether the log is past ``ann_min_rows`` without its vector index (``maintain`` builds it)."""
        table = self._tables.records
        if table is None or table.count_rows() < self._ann_min_rows:
            return False
        return "vector_idx" not in {idx.name for idx in table.list_indices()}

    def small_fragments(self) -> int:
        """How many small fragments the log holds (each small append or update leaves one)."""
        table = self._tables.records
        if table is None:
            return 0
        return int(table.stats()["fragment_stats"]["num_small_fragments"])

    def fragments_to_compact(self) -> int:
        """Small fragments beyond those the last maintenance left.

        Compaction does not merge fragments covered by different deltas of the vector index
        (a large log kept dozens through every compaction): without this, each start of
        such a store ran a compaction that changed nothing.
        """
        try:
            left = int(json.loads(self._maintained.read_text(encoding="utf-8"))["small_fragments_left"])
        except (OSError, ValueError, KeyError, TypeError):
            left = 0
        return max(0, self.small_fragments() - left)
