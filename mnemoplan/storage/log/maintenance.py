"""Upkeep of the log: compaction, indexes, and the purge that takes deleted rows off the disk.

A LanceDB delete or update (a merge too) only marks rows, in the deletion file of the fragment
that holds them; their bytes stay in its data files, and in old versions, until that fragment
is written again and the versions are dropped. A purge of some records rewrites exactly the
fragments whose deletion files mark a copy of one of them, or of a row citing or following one:
whoever marked it (this server, another sharing the log, a run that crashed before its purge),
and wherever a compaction since moved it. The old copies updates leave of other records wait
for compaction.

A purge's cost is its fragments' size, so fragments are kept small (``FRAGMENT_ROWS``):
LanceDB's own ``optimize`` compacts into fragments of up to a million rows, and forgetting one
message of a 500k-record log rewrote all 4 GB of it. Compaction, index upkeep and the
dropping of old versions therefore go through Lance itself (``pylance``, the Lance that
LanceDB bundles), which takes a target size; ``optimize`` is kept for the small side tables.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Callable, Collection
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
from lance.commit import CommitConflictError
from lancedb.index import BTree, HnswSq
from lancedb.table import LanceTable
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from mnemoplan.storage.log.schema import SCALAR_COLUMNS, UNUSED_SCALAR_INDEXES
from mnemoplan.storage.log.tables import LogTables

OLD_VERSIONS_KEPT = timedelta(minutes=5)  # past this, maintenance deletes superseded versions
# Rows a compaction writes per fragment: what one purge rewrites at most per fragment holding a
# forgotten row (~35 MB at the log's ~8 KB a row). Forgetting an old memory on the scale store
# cost 2.1 s of CPU at 16,384 rows, 0.85 s at 4,096, 0.68 s at 2,048 (bench/README.md, "Where
# a forget's CPU goes"); fewer rows, more fragments for a scan to open (245 at a million rows).
FRAGMENT_ROWS = 4_096
_CONFLICT_TRIES = 5


def _is_conflict(exc: BaseException) -> bool:
    """Whether a commit failed because another writer's commit came first. Lance raises
    ``CommitConflictError`` for some, a plain ``OSError`` ("Retryable commit conflict ... This
    Rewrite transaction was preempted by concurrent transaction Delete") for a compaction."""
    if isinstance(exc, CommitConflictError):
        return True
    message = str(exc).lower()
    return isinstance(exc, (OSError, RuntimeError, ValueError)) and ("conflict" in message or "preempted" in message)


class Maintenance:
    """Compaction, indexes and purges of the log's tables.

    Args:
        tables: The log's tables.
        path: Directory of the log, where maintenance notes what it left.
        ann_min_rows: Build an approximate vector index once the table has this many rows.
        fragment_rows: Rows per fragment that compaction writes (``FRAGMENT_ROWS``).
        ann_user_rows: Build it only once a user has more rows: the only users searched in
            LanceDB (the others are searched exactly, in memory: ``VectorCache.max_user_rows``).
    """

    def __init__(self, tables: LogTables, path: Path, *, ann_min_rows: int = 50_000,
                 fragment_rows: int = FRAGMENT_ROWS, ann_user_rows: int = 0) -> None:  # fmt: skip
        self._tables = tables
        self._ann_min_rows = ann_min_rows
        self._ann_user_rows = ann_user_rows
        self._fragment_rows = fragment_rows
        self._scalar_min_rows = max(1, ann_min_rows // 10)
        # Compaction rewrites fragments; an update or delete committed meanwhile makes it fail
        # ("Rewrite preempted by Update"), never the other way round (Lance rebases an update
        # on a compaction). Updates and deletes take this lock (``LogWriter``); a compaction
        # runs beside them and takes it only once it lost to them ``_CONFLICT_TRIES`` times
        # (``_commit``): held through a fragment's rewrite (~1 s at 16k rows), it kept every
        # write waiting, a writer holding the store's write lock while it waited.
        # Reentrant: ``LanceLog.purge`` holds it around a whole purge, whose steps may take it.
        self.rewrite_lock = threading.RLock()
        self._maintained = path / "maintenance.json"  # small fragments the last maintenance left
        # Of the records' fragments with a deletion file: its path, and what its marked rows link
        # to (``_marked_links``). Only purges use it, one at a time.
        self._marked: dict[int, tuple[str, np.ndarray]] = {}
        # The largest user's rows and the newest fragment when they were last counted (reading
        # every row's user took 0.4-0.5 s of CPU on a log of 1.6M rows, at every maintenance).
        self._counted: tuple[int, int] | None = None

    # -- purge -----------------------------------------------------------------------------

    def rewrite_deleted(self, ids: Collection[str] | None = None) -> None:
        """Rewrite the fragments that hold marked rows of these records (deleted, or replaced by
        an update; see ``_holding``; all marked rows without ``ids``), beside appends; the old versions that
        still refer to their files go at ``drop_unreferenced``, which ends a purge. The users'
        keys table is small: every marked row of it goes.

        A delete only marks rows, and compaction rewrites a fragment for its deletions alone
        once a tenth of its rows are gone: one message forgotten out of forty stayed in its
        file. So each such fragment is compacted, its deletions materialised whatever
        their share (at most ``fragment_rows`` rows written again). Only those: updates mark
        rows all over a large log (a fact superseded, a mention counted), and a purge that
        rewrote every marked fragment took ~1 s for each under load, while forgets queued
        behind it. Lance remaps the indexes to the rewritten rows, dropping the deleted ones:
        the B-trees' and the vector index's copies of them go with the old versions (and those
        of a fragment every row of which was deleted, with nothing left to rewrite:
        ``_drop_index_copies``). Updates and deletes go on meanwhile (``_commit``). Nothing
        else is compacted or indexed here (``maintain`` merges small fragments and folds new
        rows into the indexes: ~0.3 s of each purge on a 500k-record log).

        Old versions are dropped as maintenance drops them, not all: dropping the version an
        append began from, before it commits, loses the append (Lance issue #3718).
        ``drop_unreferenced`` drops the rest, with no append running.
        """
        for table in self._keyed_tables():
            table.checkout_latest()  # with what other servers sharing the log marked
            fragments = self._holding(table.to_lance(), ids if table is self._tables.records else None)
            if fragments:
                try:
                    self._rewrite_fragments(table, fragments)
                except Exception as exc:  # another server's writes kept preempting the whole: each alone
                    if not _is_conflict(exc) or len(fragments) == 1:
                        raise
                    for fragment in fragments:
                        self._rewrite_fragments(table, [fragment])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._drop_index_copies(table)
                self._drop_versions(table, OLD_VERSIONS_KEPT)

    def _holding(self, dataset: Any, ids: Collection[str] | None) -> list[int]:
        """The fragments whose deletion files mark a row holding something of ``ids`` (any marked
        row without ``ids``): a copy of one of them, a row derived from one (a session summary
        replaced since, whose words are its messages'), or the next turn's old copy (its search
        vector leaned on the forgotten turn's). Read with the deleted rows, one fragment at a
        time (a deleted row has no address to tell its fragment by), and only the fragments whose
        deletion file changed since the last purge (``_marked_links``)."""
        marked = [f for f in dataset.get_fragments() if f.metadata.deletion_file]
        if ids is None:
            return [f.fragment_id for f in marked]
        wanted = np.fromiter((hash(i) for i in ids), np.int64, len(ids))
        holding = [f.fragment_id for f in marked if np.isin(self._marked_links(dataset, f), wanted).any()]
        for gone in self._marked.keys() - {f.fragment_id for f in marked}:  # rewritten, or every row deleted
            self._marked.pop(gone, None)
        return holding

    def _marked_links(self, dataset: Any, fragment: Any) -> np.ndarray:
        """What the rows a fragment's deletion file marks hold or cite (their ids, previous turns
        and sources), as the process's string hashes: a collision only rewrites a fragment for
        nothing. Kept per deletion file, which Lance never changes in place (a delete writes
        another): on a log of 1.6M rows, 381 of its 462 fragments marked by updates, reading
        every one took most of a forget's CPU."""
        path = fragment.metadata.deletion_file.path(fragment.fragment_id)
        held = self._marked.get(fragment.fragment_id)
        if held is not None and held[0] == path:
            return held[1]
        rows = dataset.scanner(columns=["id", "prev_id", "derived_from"], fragments=[fragment],
                               with_row_id=True, include_deleted_rows=True).to_table()  # fmt: skip
        rows = rows.filter(pc.is_null(rows.column("_rowid")))  # the marked rows alone
        linked = [rows.column("id"), rows.column("prev_id"), pc.list_flatten(rows.column("derived_from"))]
        values = {v for column in linked for v in column.drop_null().to_pylist()}
        hashes = np.fromiter((hash(v) for v in values), np.int64, len(values))
        self._marked[fragment.fragment_id] = (path, hashes)
        return hashes

    def drop_unreferenced(self) -> None:
        """Drop every old version (the rewritten fragments' files go with them) and every
        file no version refers to: a failed commit's (a compaction an update preempted could
        have copied a row deleted since). Must not run beside an append: it could drop the
        version the append began from, and its files look unreferenced until it commits.

        On a log other servers share, one of theirs may be under way whatever this server
        holds: versions go once older than ``OLD_VERSIONS_KEPT`` (here, or at any server's next
        maintenance), which no commit takes."""
        with self.rewrite_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for table in self._keyed_tables():
                if self._tables.shared:
                    self._drop_versions(table, OLD_VERSIONS_KEPT)
                else:
                    self._drop_versions(table, timedelta(0), delete_unverified=True)

    def _keyed_tables(self) -> list[LanceTable]:
        """The tables a purge rewrites: the records, and the users' keys."""
        return [table for table in (self._tables.records, self._tables.keys) if table is not None]

    def _drop_index_copies(self, table: LanceTable) -> None:
        """Drop what the indexes keep of fragments that are gone. A delete of every row of a
        fragment drops the fragment at once, with nothing to rewrite, and Lance leaves its
        rows in the indexes (ids and users in the B-trees' pages, vectors in the vector index)
        until they are built again: a B-tree the reads use is rebuilt (quickly); the vector index
        (slow to build on a large log) is dropped, for the next ``maintain`` to build again, and
        so is a B-tree an earlier version built on another column (``UNUSED_SCALAR_INDEXES``).
        Meanwhile vector search scans exactly; it only serves users too large to hold in memory.
        Updates and deletes go on meanwhile: Lance commits an index built beside them, and
        them beside it (none of 600 failed beside 762 rebuilds)."""
        dataset = table.to_lance()
        present = {fragment.fragment_id for fragment in dataset.get_fragments()}
        stale = {index["name"] for index in dataset.list_indices() if set(index.get("fragment_ids") or ()) - present}
        for column in SCALAR_COLUMNS:
            if f"{column}_idx" in stale:
                self._commit(lambda c=column: table.create_index(c, config=BTree(), name=f"{c}_idx", replace=True))
        for name in stale.intersection({"vector_idx", *UNUSED_SCALAR_INDEXES}):
            table.drop_index(name)

    def _rewrite_fragments(self, table: LanceTable, wanted: list[int]) -> None:
        """Compact these fragments, their deletions materialised, in one commit (those gone or
        rewritten since: nothing to do), planned anew at each try (``_commit``). Each is written
        again alone, or with a neighbour among them. One commit for all: Lance remaps every
        index at each, ~0.2 s for a B-tree of unique ids over 1.6M rows (five fragments of such a
        log one by one 2.8-3.0 s of CPU, at once 0.6-0.8 s)."""

        def compact() -> None:
            table.checkout_latest()
            dataset = table.to_lance()
            fragments = {f.fragment_id: f for f in dataset.get_fragments()}
            chosen = [fragments[f] for f in wanted if f in fragments and fragments[f].metadata.deletion_file]
            if not chosen:
                return  # every row of them deleted, or rewritten since (their deletions materialised)
            sizes = self._sizes()
            # A fragment written again whole, not as one and a sliver left alone.
            fits = [f.physical_rows for f in chosen if f.physical_rows <= 2 * self._fragment_rows]
            sizes["target_rows_per_fragment"] = max([self._fragment_rows, *fits])
            keep = {f.fragment_id for f in chosen}
            dataset.optimize.compact_files(**sizes, materialize_deletions=True, materialize_deletions_threshold=0.0,
                                           excluded_fragment_ids=[f for f in fragments if f not in keep])  # fmt: skip

        self._commit(compact)
        table.checkout_latest()

    def _optimize(self, table: LanceTable, older_than: timedelta) -> None:
        """What LanceDB's ``optimize`` does, with fragments of ``fragment_rows``: compact the
        small fragments (and those a tenth deleted), fold new rows into the indexes, drop the
        versions older than ``older_than``."""
        self._commit(lambda: table.to_lance().optimize.compact_files(**self._sizes()))
        table.checkout_latest()
        self._fold_indexes(table)
        self._drop_versions(table, older_than)

    def _fold_indexes(self, table: LanceTable) -> None:
        """Fold the rows appended since into the indexes."""
        if table.list_indices():
            self._commit(lambda: table.to_lance().optimize.optimize_indices())
            table.checkout_latest()

    @staticmethod
    def _drop_versions(table: LanceTable, older_than: timedelta, *, delete_unverified: bool = False) -> None:
        """Drop the versions older than ``older_than``, and the files only they refer to."""
        table.to_lance().cleanup_old_versions(older_than=older_than, delete_unverified=delete_unverified)
        table.checkout_latest()

    def _sizes(self) -> dict[str, int]:
        """Compaction's sizes: fragments of ``fragment_rows``, made of row groups no larger
        (Lance's 1,024-row groups otherwise: a file holds at least one)."""
        return {"target_rows_per_fragment": self._fragment_rows, "max_rows_per_group": min(1024, self._fragment_rows)}

    def _commit(self, commit: Callable[[], object]) -> None:
        """Run a compaction or an index's upkeep beside updates and deletes, again (planned anew,
        after a short random wait) while one of theirs comes first, and at last under the
        rewrite lock, which holds theirs off: a fragment many writes touch is still rewritten.
        Other servers sharing the log commit too: conflicts with theirs are retried the same way.

        On a shared log the lock is taken first: a compaction that loses leaves its written
        files for the clean-up, which there keeps unreferenced files a week (it cannot tell
        another server's commit under way), and they may hold a row deleted meanwhile."""
        if not self._tables.shared:
            try:
                self._retry_conflicts(commit)
                return
            except Exception as exc:
                if not _is_conflict(exc):
                    raise
        with self.rewrite_lock:
            self._retry_conflicts(commit)

    @staticmethod
    def _retry_conflicts(commit: Callable[[], object]) -> None:
        """Run a commit, again (planned anew, after a short random wait) while another writer's
        commit comes first."""
        for attempt in Retrying(retry=retry_if_exception(_is_conflict), stop=stop_after_attempt(_CONFLICT_TRIES),
                                wait=wait_random_exponential(multiplier=0.05, max=2), reraise=True):  # fmt: skip
            with attempt:
                commit()

    # -- compaction and indexes --------------------------------------------------------

    def maintain(self) -> None:
        """Compact the fragments many small writes leave, and index what has grown big enough.

        Scalar (B-tree) indexes on the filtered columns past ``scalar_min_rows``, the
        approximate vector index past ``ann_min_rows``; new rows are folded into existing
        indexes. Versions older than ``OLD_VERSIONS_KEPT`` go: at LanceDB's default week,
        each compaction's superseded files stayed, and a store grew fifteen times its size
        in an hour of ingest (``purge`` drops them all at once).

        Raises:
            OSError, RuntimeError: Compaction failed (commit conflicts, five tries beside writes
                and five more holding them off).
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
        for name in names.intersection(UNUSED_SCALAR_INDEXES):
            table.drop_index(name)
        wanted = self._wants_vector_index(table, rows)
        if wanted and "vector_idx" not in names:
            table.create_index("vector", config=HnswSq(distance_type="cosine"), name="vector_idx")
        elif not wanted and "vector_idx" in names:  # built by an earlier version, at ann_min_rows alone
            table.drop_index("vector_idx")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._optimize(table, OLD_VERSIONS_KEPT)
            for side in self._tables.side:  # a version per write otherwise: every read lists them all
                try:
                    side.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                except (OSError, RuntimeError) as exc:  # another server compacting it: its turn
                    if not _is_conflict(exc):
                        raise
        left = {"small_fragments_left": self.small_fragments()}
        scratch = self._maintained.with_suffix(".tmp")
        scratch.write_text(json.dumps(left), encoding="utf-8")
        scratch.replace(self._maintained)

    def needs_vector_index(self) -> bool:
        """Whether the log wants a vector index it lacks (``maintain`` builds it)."""
        table = self._tables.records
        if table is None or "vector_idx" in {idx.name for idx in table.list_indices()}:
            return False
        return self._wants_vector_index(table, table.count_rows())

    def _wants_vector_index(self, table: LanceTable, rows: int) -> bool:
        """Whether an approximate vector index would serve a search: the log is past
        ``ann_min_rows`` and a user past ``ann_user_rows``. Without such a user it serves
        nobody, and costs: every purge remaps it (6 of the 7 s a forget took in a log of 500k
        records), every compaction folds rows into it."""
        if rows < self._ann_min_rows:
            return False
        if self._ann_user_rows <= 0:
            return True
        fragments = table.to_lance().get_fragments()
        if self._counted is not None:
            largest, last = self._counted
            # Every row written since (appended, updated or compacted: each in a fragment newer
            # than those counted, on this server or another) given to the largest user: not enough.
            if largest + sum(f.physical_rows for f in fragments if f.fragment_id > last) <= self._ann_user_rows:
                return False
        users = table.search().select(["user_id"]).limit(None).to_arrow().column("user_id")
        largest = int(pc.max(pc.value_counts(users).field("counts")).as_py()) if len(users) else 0
        self._counted = (largest, max((f.fragment_id for f in fragments), default=-1))
        return largest > self._ann_user_rows

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
