"""The log: every record, in LanceDB, with its vectors. Only storage/log/ imports lancedb.

The ``records`` table is the source of truth; every overlay is rebuilt from it. It also
serves the vector search (``vector`` holds the contextual embedding of each record) and
the scalar look-ups the temporal, fact and working-memory indexes need.

``LanceLog`` is the one door: reads are here; writes (``writes.py``), upkeep and purges
(``maintenance.py``), users' secrets (``keys.py``) and users' rows in memory (``views.py``)
are its collaborators. Reads take a ``RecordFilter`` (``filters.py`` writes its SQL).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mnemoplan.model import DocRecord, Record, RecordHead
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.filters import HAS_TOKENS, LACKS_TOKENS, Where, of_user, sql, sql_in
from mnemoplan.storage.log.keys import UserKeys
from mnemoplan.storage.log.maintenance import FRAGMENT_ROWS, Maintenance
from mnemoplan.storage.log.record_cache import RecordCache
from mnemoplan.storage.log.schema import (
    DOC_COLUMNS, EPOCH, META_COLUMNS, MICROSECOND, NO_EVENT, OVERLAY_COLUMNS, doc_records, mention_counts,
    row_to_record, table_schema,
)  # fmt: skip
from mnemoplan.storage.log.tables import LogTables
from mnemoplan.storage.log.token_cache import TokenBlock, TokenCache
from mnemoplan.storage.log.vector_cache import UserVectors, VectorCache
from mnemoplan.storage.log.views import UserViews
from mnemoplan.storage.log.writes import LogWriter


class LanceLog:
    """The record log in one LanceDB database.

    Args:
        path: Directory of the LanceDB database.
        ann_min_rows: Build an approximate vector index once the table has this many rows (and a
            user more than ``cache_vectors_per_user``: the others are searched in memory).
        cache_records: Records held as objects, by id (0 disables the cache, users read whole
            included). Few: each is a dozen objects every full collection of the garbage collector
            scans (20,000 made a busy server's collections ~150 ms); users read whole are held
            as Arrow rows besides (``RecordCache``), a record built from them when asked for.
        cache_vectors_per_user: Users with at most this many records are searched in memory.
        cache_tokens_per_user: Users with at most this many token vectors have them held in memory.
        read_only: Open the log without writing to it (a data directory that cannot be written):
            the schema is taken as it is, and a log that lacks a table reads as empty.
        uri: Where the tables are, when not in ``path``: object storage (``s3://bucket/prefix``), shared
            by several servers; ``path`` then holds this server's notes of what a purge must rewrite.
        storage_options: LanceDB's options for ``uri``.
        fragment_rows: Rows per fragment that compaction writes: a purge rewrites at most this
            many per fragment holding a deleted row.
    """

    def __init__(
        self, path: Path, *, ann_min_rows: int = 50_000, cache_records: int = 2_000,
        cache_vectors_per_user: int = 200_000, cache_tokens_per_user: int = 2_000_000,
        read_only: bool = False, uri: str | None = None, storage_options: dict[str, str] | None = None,
        fragment_rows: int = FRAGMENT_ROWS,
    ) -> None:  # fmt: skip
        if not read_only:
            path.mkdir(parents=True, exist_ok=True)
        self.cache = RecordCache(cache_records)
        self.vector_cache = VectorCache(max_user_rows=cache_vectors_per_user)
        self.token_cache = TokenCache(max_user_tokens=cache_tokens_per_user)
        self.tables = LogTables(uri or path, storage_options=storage_options, read_only=read_only)
        self.maintenance = Maintenance(self.tables, path, ann_min_rows=ann_min_rows, fragment_rows=fragment_rows,
                                       ann_user_rows=cache_vectors_per_user)  # fmt: skip
        self.user_keys = UserKeys(self.tables, self.maintenance)
        self.views = UserViews(self.tables, self.vector_cache, self.token_cache)
        self.writer = LogWriter(
            self.tables, self.maintenance, self.cache, self.vector_cache, self.token_cache, self.scan
        )

    @property
    def dim(self) -> int | None:
        """Vector dimension, or None before the first write."""
        return self.tables.dim

    # -- reads -------------------------------------------------------------------------

    def count(self, where: Where | None = None) -> int:
        """Rows matching ``where`` (all rows when None)."""
        table = self.tables.records
        if table is None:
            return 0
        return self.tables.count(table, None if where is None else sql(where))

    def select(
        self, where: Where, columns: list[str] | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Rows matching a filter, as dicts of the given columns."""
        table = self.tables.records
        if table is None:
            return []
        return self.tables.read(table, sql(where), columns or META_COLUMNS, limit).to_pylist()

    def first(self, where: RecordFilter, limit: int) -> list[tuple[str, bool, int]]:
        """The first ``limit`` records passing a filter (in the log's order): (id, whether it has
        an event time, seq). From memory when the user's rows are held there: on a store of 1.6M
        records a read of the log took 70-400 ms, whatever the user's size."""
        entry = self.views.user_view(where.user_id)
        if entry is not None:
            try:
                return entry.first(where, limit)
            except (ValueError, OverflowError):  # a condition the rows in memory cannot answer
                pass
        rows = self.select(where, ["id", "event_start", "seq"], limit)
        return [(r["id"], r["event_start"] is not None, r["seq"]) for r in rows]

    def events(self, user_id: str, ids: list[str]) -> dict[str, tuple[datetime, datetime]]:
        """The event (start, end) of those records that have one; from memory when the user's
        rows are held there."""
        entry = self.vector_cache.get(user_id)
        held = entry.events(ids) if entry is not None else None
        if held is None:
            records = self.get(user_id, ids).values()
            return {r.id: (r.event_start, r.event_end) for r in records
                    if r.event_start is not None and r.event_end is not None}  # fmt: skip
        at = lambda t: EPOCH + t * MICROSECOND  # noqa: E731
        return {rid: (at(s), at(e)) for rid, (s, e) in held.items() if s != NO_EVENT and e != NO_EVENT}

    def ids(self, where: RecordFilter) -> list[str]:
        """The ids of the records matching a filter."""
        return [row["id"] for row in self.select(where, ["id"])]

    def columns(self, where: Where, columns: list[str]) -> dict[str, list[Any]]:
        """Rows matching a filter, column by column (a list per column, rows in the same order):
        no dict per row, for reads of a large user's every row."""
        table = self.tables.records
        if table is None:
            return {c: [] for c in columns}
        return self.tables.read(table, sql(where), columns).to_pydict()

    def mention_counts(self, user_id: str) -> tuple[list[tuple[str, str, str, str, int]], int]:
        """How often each distinct (key, name, type, role) occurs among a user's entity mentions,
        in the order each first occurs in the log; and the last seq of the user's records read.

        Counted in Arrow: turning a large user's mentions into Python objects one by one was
        most of the first recall's time.
        """
        return mention_counts(self.mention_rows(user_id))

    def mention_rows(self, user_id: str) -> pa.Table:
        """What a user's entity catalog is read from (``seq``, ``id``, ``entities``), in write order
        (whatever a purge's rewrite did to the file order)."""
        return self._read_sorted(of_user(user_id), ["seq", "id", "entities"])

    def records(self, where: Where, limit: int | None = None) -> list[Record]:
        """Records matching a filter."""
        return [row_to_record(row) for row in self.select(where, META_COLUMNS, limit)]

    def iter_records(self, where: Where | None) -> Iterator[Record]:
        """Stream every record matching a filter (unordered)."""
        for rows in self.scan(where, META_COLUMNS):
            for row in rows:
                yield row_to_record(row)

    def iter_stored(self, where: Where) -> Iterator[tuple[Record, np.ndarray, bytes | None]]:
        """Stream every record matching a filter with its stored embedding and packed token vectors
        (unordered): what an export with vectors holds."""
        for rows in self.scan(where, [*META_COLUMNS, "embedding", "tokens"]):
            for row in rows:
                yield row_to_record(row), np.asarray(row["embedding"], dtype=np.float32), row["tokens"]

    def doc_records(self, where: Where) -> list[DocRecord]:
        """What the BM25 documents of the records matching a filter read, in write order (with
        ``alone`` computed by pyarrow, as when a user is loaded into memory)."""
        return doc_records(self._read_sorted(where, DOC_COLUMNS))

    def overlay_rows(self, user_id: str) -> pa.Table:
        """What rebuilding a user's BM25 index and graph entries reads of their records
        (``OVERLAY_COLUMNS``), in write order: ``doc_records`` and ``graph_records`` of it."""
        return self._read_sorted(RecordFilter(user_id), OVERLAY_COLUMNS)

    def _read_sorted(self, where: Where, columns: list[str]) -> pa.Table:
        table = self.tables.records
        if table is None:
            return table_schema(1).empty_table().select(columns)
        return self.tables.read(table, sql(where), columns).sort_by("seq")

    def get(self, user_id: str, ids: list[str]) -> dict[str, Record]:
        """Records of one user by id; unknown ids are absent from the result."""
        if not ids:
            return {}
        found, missing = self.cache.get_many(user_id, ids)
        if not missing:
            return found
        epoch = self.cache.epoch()
        if self._load_whole(user_id):
            # One scan of the whole user costs about what reading these ids does (the filter,
            # not the rows, is the cost), and every later query is then served from memory,
            # which made a fresh server's first recalls several times faster.
            rows = self.user_rows(user_id)
            self.cache.put_user(user_id, rows, epoch)
            wanted = rows.filter(pc.is_in(rows.column("id"), pa.array(missing, rows.column("id").type)))
            read = [row_to_record(row) for row in wanted.to_pylist()]
        else:
            read = [row_to_record(row) for row in self.views.rows_by_id(user_id, missing, META_COLUMNS)]
        self.cache.put(read, epoch)
        found.update({rec.id: rec for rec in read})
        return found

    def user_rows(self, user_id: str) -> pa.Table:
        """All of a user's rows, as Arrow (``META_COLUMNS``)."""
        table = self.tables.records
        if table is None:
            return table_schema(1).empty_table().select(META_COLUMNS)
        return self.tables.read(table, sql(RecordFilter(user_id)), META_COLUMNS)

    def _load_whole(self, user_id: str) -> bool:
        """Whether to read a user's records whole into the cache: a user of known size (the vector
        cache holds them) small enough to leave room for others, and not already there."""
        if self.cache.holds_whole(user_id):
            return False
        vectors = self.vector_cache.get(user_id)
        return vectors is not None and 0 < len(vectors) <= self.cache.whole_user_max

    def vectors(self, user_id: str, ids: list[str], column: str = "embedding") -> dict[str, np.ndarray]:
        """Stored vectors of some records: their embeddings, or (``column="vector"``) their search
        vectors, from memory when the user's are held there (the search vectors alone are)."""
        if self.tables.records is None or not ids:
            return {}
        cached = self.vector_cache.get(user_id) if column == "vector" else None
        if cached is not None:
            rows = {rid: cached.row(rid) for rid in ids}
            if all(r is not None for r in rows.values()):
                return {rid: cached.matrix[r] for rid, r in rows.items() if r is not None}
        rows = self.select(RecordFilter(user_id, ids=tuple(ids)), ["id", column])
        return {row["id"]: np.asarray(row[column], dtype=np.float32) for row in rows}

    def user_counts(self, kinds: tuple[str, ...] = ()) -> dict[str, tuple[int, int]]:
        """Every user in the log, with their records (of ``kinds``, if given) and sessions (distinct
        non-empty session ids), counted in Arrow over two columns."""
        table = self.tables.records
        if table is None:
            return {}
        rows = self.tables.read(table, sql_in("kind", kinds) if kinds else None, ["user_id", "session_id"])
        records = rows.group_by("user_id").aggregate([("user_id", "count")])
        named = rows.filter(pc.not_equal(rows["session_id"], ""))
        sessions = named.group_by("user_id").aggregate([("session_id", "count_distinct")])
        out = {u: (n, 0) for u, n in zip(records["user_id"].to_pylist(), records["user_id_count"].to_pylist())}
        for u, n in zip(sessions["user_id"].to_pylist(), sessions["session_id_count_distinct"].to_pylist()):
            out[u] = (out[u][0], n)
        return dict(sorted(out.items()))

    def scan(
        self, where: Where | None, columns: list[str], batch_rows: int = 5_000
    ) -> Iterator[list[dict[str, Any]]]:
        """Stream rows matching a filter in batches (for rebuilds)."""
        table = self.tables.records
        if table is None:
            return
        for batch in self.tables.batches(table, sql(where) if where else None, columns, batch_rows):
            yield batch.to_pylist()

    def user_ids(self) -> list[str]:
        """Every user with at least one record."""
        table = self.tables.records
        if table is None:
            return []
        col = self.tables.read(table, None, ["user_id"]).column("user_id")
        return sorted(set(col.to_pylist()))

    def count_with_tokens(self, user_id: str) -> int:
        """How many of a user's records have token vectors."""
        return self.count(of_user(user_id, HAS_TOKENS))

    def count_lacking_tokens(self, user_id: str) -> int:
        """How many of a user's records could have token vectors and have none (written before
        the log had them; summaries never have their own)."""
        return self.count(of_user(user_id, LACKS_TOKENS))

    def records_lacking_tokens(self, user_id: str) -> list[Record]:
        """The records ``count_lacking_tokens`` counts."""
        return self.records(of_user(user_id, LACKS_TOKENS))

    # -- users' rows in memory (views.py) ------------------------------------------------

    def user_view(self, user_id: str) -> UserVectors | None:
        """A user's rows in memory (ids, vectors, kinds, sessions, order), if small enough to hold."""
        return self.views.user_view(user_id)

    def heads(self, user_id: str, ids: list[str]) -> dict[str, RecordHead] | None:
        """What ranking reads of some records, from memory (see ``UserViews.heads``)."""
        return self.views.heads(user_id, ids)

    def vector_search(
        self, where: RecordFilter, vector: np.ndarray | Callable[[], np.ndarray], k: int
    ) -> list[tuple[str, float]]:
        """Nearest records passing a filter (see ``UserViews.vector_search``).

        Raises:
            ValueError: The filter has a condition the rows in memory cannot answer (``filters.mask``).
        """
        return self.views.vector_search(where, vector, k)

    def token_blocks(self, user_id: str, *, scan: bool = False, most: int = 0) -> Iterator[TokenBlock]:
        """A user's packed token vectors, in blocks (see ``UserViews.token_blocks``)."""
        return self.views.token_blocks(user_id, scan=scan, most=most)

    # -- writes (writes.py) --------------------------------------------------------------

    def next_seqs(self, n: int) -> list[int]:
        """Reserve ``n`` consecutive sequence numbers (write order across the whole log)."""
        return self.writer.next_seqs(n)

    def add(
        self, records: list[Record], embeddings: np.ndarray, vectors: np.ndarray,
        tokens: list[bytes | None] | None = None,
    ) -> None:  # fmt: skip
        """Append records with their vectors (see ``LogWriter.add``).

        Raises:
            ValueError: The log holds vectors of another dimension.
        """
        self.writer.add(records, embeddings, vectors, tokens)

    def update_vectors(
        self, ids_to_vectors: dict[str, tuple[str, np.ndarray]], user_id: str | None = None
    ) -> None:
        """Set ``prev_id`` and the search vector of some records (see ``LogWriter.update_vectors``)."""
        self.writer.update_vectors(ids_to_vectors, user_id)

    def set_superseded(
        self, rids: list[str], by_id: str, valid_to: datetime | None, user_id: str | None = None
    ) -> None:
        """Close records' validity, or reopen them, in one update (see ``LogWriter.set_superseded``)."""
        self.writer.set_superseded(rids, by_id, valid_to, user_id)

    def set_tokens(self, user_id: str, tokens: dict[str, bytes]) -> None:
        """Store packed token vectors for some of a user's records."""
        self.writer.set_tokens(user_id, tokens)

    def set_vectors(self, user_id: str, vectors: dict[str, np.ndarray]) -> None:
        """Set the search vectors of some of a user's records, in one merge."""
        self.writer.set_vectors(user_id, vectors)

    def set_mention_counts(self, counts: dict[str, int]) -> None:
        """Set mention counts (facts said again)."""
        self.writer.set_mention_counts(counts)

    def add_accesses(self, counts: dict[str, int], when: datetime) -> None:
        """Add ``counts[id]`` retrievals to each record and stamp ``when`` as its last access."""
        self.writer.add_accesses(counts, when)

    def delete(self, ids: list[str], user_id: str | None = None) -> int:
        """Delete records by id; returns how many existed (see ``LogWriter.delete``)."""
        return self.writer.delete(ids, user_id)

    def delete_user(self, user_id: str) -> None:
        """Delete every record of a user."""
        self.writer.delete_user(user_id)

    # -- upkeep (maintenance.py) ---------------------------------------------------------

    def maintain(self) -> None:
        """Compact and index (see ``Maintenance.maintain``).

        Raises:
            RuntimeError: Compaction failed (a commit conflict, after three tries).
        """
        self.maintenance.maintain()

    def rewrite_deleted(self, ids: Collection[str] | None = None) -> None:
        """Rewrite the fragments holding marked rows of these records, or every marked row
        (see ``Maintenance.rewrite_deleted``)."""
        self.maintenance.rewrite_deleted(ids)

    def drop_unreferenced(self) -> None:
        """Drop old versions and unreferenced files (see ``Maintenance.drop_unreferenced``);
        must not run beside an append."""
        self.maintenance.drop_unreferenced()

    def purge(self, ids: Collection[str] | None = None) -> None:
        """Take the bytes of these deleted records (of every deleted row, without ``ids``) off
        the disk (``rewrite_deleted``, then ``drop_unreferenced``); must not run beside an append."""
        with self.maintenance.rewrite_lock:
            self.rewrite_deleted(ids)
            self.drop_unreferenced()

    def needs_vector_index(self) -> bool:
        """Whether the log wants a vector index it lacks: past ``ann_min_rows``, with a user past
        ``cache_vectors_per_user`` (``maintain`` builds it)."""
        return self.maintenance.needs_vector_index()

    def small_fragments(self) -> int:
        """How many small fragments the log holds (each small append or update leaves one)."""
        return self.maintenance.small_fragments()

    def fragments_to_compact(self) -> int:
        """Small fragments beyond those the last maintenance left (``Maintenance.fragments_to_compact``)."""
        return self.maintenance.fragments_to_compact()

    # -- per-user secrets (keys.py) ------------------------------------------------------

    def user_salt(self, user_id: str, *, create: bool = True) -> bytes | None:
        """The random secret that keys this user's hashed names in the graph."""
        return self.user_keys.salt(user_id, create=create)

    def forget_cached(self, user_id: str) -> None:
        """Drop everything held in memory of a user (records, vectors, token vectors, salt): the
        next read takes them from the log (another server of a shared log changed them)."""
        self.cache.evict(None, user_id)
        self.vector_cache.invalidate(user_id)
        self.token_cache.invalidate(user_id)
        self.user_keys.forget_cached(user_id)

    @property
    def shared(self) -> bool:
        """Whether the log is in object storage, which other servers may write too."""
        return self.tables.shared

    def drop_user_salt(self, user_id: str) -> None:
        """Destroy a user's secret: what the graph kept of them can no longer be linked to names."""
        self.user_keys.drop(user_id)
