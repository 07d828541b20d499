"""Writes to the log: appends, column updates and deletes, with the caches kept in step."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mnemoplan.model import Record
from mnemoplan.storage.log.filters import of_user, sql_in
from mnemoplan.storage.log.maintenance import Maintenance
from mnemoplan.storage.log.record_cache import RecordCache
from mnemoplan.storage.log.schema import HEAD_COLUMNS, META_COLUMNS, row_to_record, table_schema
from mnemoplan.storage.log.tables import LogTables
from mnemoplan.storage.log.token_cache import TokenBlock, TokenCache
from mnemoplan.storage.log.vector_cache import UserVectors, VectorCache

# Reads a column of some records by id (in batches): the log's ``scan``.
Scan = Callable[[str, list[str]], Iterator[list[dict[str, Any]]]]


def _of_user(where: str, user_id: str | None) -> str:
    """``where``, confined to one user's rows when a user is named."""
    return where if user_id is None else of_user(user_id, f"({where})")


class LogWriter:
    """Every change to the records table. Each drops the cached copies of the rows it changes
    (before and after, under the rewrite lock, which a compaction that kept losing to updates
    takes to hold them off); appends extend the caches instead. An update or delete leaves the
    old copy marked in its fragment: a purge of that record (or of one it cites or follows)
    rewrites it (``Maintenance.rewrite_deleted``), else compaction once a tenth of the fragment
    is marked.

    Args:
        tables: The log's tables.
        maintenance: Its rewrite lock.
        cache: Records in memory.
        vector_cache: Users' search vectors in memory.
        token_cache: Users' token vectors in memory.
        scan: Reads rows matching a filter in batches (``LanceLog.scan``).
    """

    def __init__(
        self, tables: LogTables, maintenance: Maintenance, cache: RecordCache, vector_cache: VectorCache,
        token_cache: TokenCache, scan: Scan,
    ) -> None:  # fmt: skip
        self._tables = tables
        self._maintenance = maintenance
        self._cache = cache
        self._vector_cache = vector_cache
        self._token_cache = token_cache
        self._scan = scan
        self._lock = threading.Lock()
        self._seq = self._load_max_seq()

    def _load_max_seq(self) -> int:
        table = self._tables.records
        if self._tables.shared or table is None or table.count_rows() == 0:
            return 0
        seqs = table.search().select(["seq"]).limit(None).to_arrow().column("seq")
        return int(pc.max(seqs).as_py() or 0)

    def next_seqs(self, n: int) -> list[int]:
        """Reserve ``n`` consecutive sequence numbers (write order across the whole log). On a log
        several servers write, they count microseconds since 1970, so that each server's numbers
        grow and different servers' follow their clocks, without a counter to share."""
        with self._lock:
            start = self._seq + 1
            if self._tables.shared:
                start = max(start, time.time_ns() // 1_000)
            self._seq = start + n - 1
        return list(range(start, start + n))

    def add(
        self, records: list[Record], embeddings: np.ndarray, vectors: np.ndarray,
        tokens: list[bytes | None] | None = None,
    ) -> None:  # fmt: skip
        """Append records with their raw embeddings, their search vectors and, when given,
        their packed token vectors (``token_cache.pack``; None for a record without).

        Raises:
            ValueError: The log holds vectors of another dimension.
        """
        if not records:
            return
        dim = int(vectors.shape[1])
        table = self._tables.ensure(dim)
        schema = table_schema(dim)
        columns: dict[str, list[Any]] = {name: [] for name in META_COLUMNS}
        for rec in records:
            data = rec.model_dump()
            for name in META_COLUMNS:
                columns[name].append(data[name])
        columns["metadata"] = [json.dumps(m, ensure_ascii=False, default=str) for m in columns["metadata"]]
        arrays = [pa.array(columns[name], type=schema.field(name).type) for name in META_COLUMNS]
        flat_e = pa.array(np.ascontiguousarray(embeddings, dtype=np.float32).ravel())
        flat_v = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
        arrays.append(pa.FixedSizeListArray.from_arrays(flat_e, dim))
        arrays.append(pa.FixedSizeListArray.from_arrays(flat_v, dim))
        tokens = tokens if tokens is not None else [None] * len(records)
        arrays.append(pa.array(tokens, type=pa.binary()))
        written = pa.Table.from_arrays(arrays, schema=schema)
        table.add(written)
        if any(self._cache.holds_whole(u) for u in {r.user_id for r in records}):  # read back as a read would
            self._cache.put_new([row_to_record(row) for row in written.select(META_COLUMNS).to_pylist()])
        for user_id in {r.user_id for r in records}:
            rows = [i for i, r in enumerate(records) if r.user_id == user_id]
            mine = [records[i] for i in rows]
            heads = {name: [getattr(r, name) for r in mine] for name in HEAD_COLUMNS}
            more = UserVectors.build(
                [r.id for r in mine], vectors[rows],
                heads | {"asks": [r.asks for r in mine], "alone": [r.alone for r in mine],
                         "requests": [r.requests for r in mine], "event_start": [r.event_start for r in mine],
                         "event_end": [r.event_end for r in mine]},
            )  # fmt: skip
            self._vector_cache.extend(user_id, more)
            # The filter columns: the snapshot's.
            packed = [j for j, i in enumerate(rows) if tokens[i] is not None]
            self._token_cache.extend(user_id, TokenBlock.build(
                [more.ids[j] for j in packed], [tokens[rows[j]] for j in packed],  # type: ignore[misc]
                more.kinds[packed], more.projects[packed], more.occurred[packed]))  # fmt: skip

    @contextmanager
    def _changing(
        self, ids: list[str] | None, *, vectors: bool = False, user_id: str | None = None
    ) -> Iterator[None]:
        """Rewrite rows under the rewrite lock, dropping their cached copies before and after:
        a read between the two could otherwise cache the old rows again. With ``vectors``,
        the in-memory vectors go too: ``user_id``'s alone when the rewrite is confined to
        that user's rows, else every user's."""
        with self._maintenance.rewrite_lock:
            self._drop_cached(ids, vectors, user_id)
            try:
                yield
            finally:
                self._drop_cached(ids, vectors, user_id)
        if ids:
            self._refill(ids)

    def _refill(self, ids: list[str]) -> None:
        """Read rewritten records back into the cache for the users it holds whole: the writer
        pays the read once, not the next recall (a read by id is ~10 ms on a store of many small
        appends, most of a recall right after a remember)."""
        if not self._cache.holds_any_whole() or self._tables.records is None:
            return
        epoch = self._cache.epoch()
        rows = [row for start in range(0, len(ids), 500)
                for batch in self._scan(sql_in("id", ids[start : start + 500]), META_COLUMNS) for row in batch]  # fmt: skip
        self._cache.put_new([row_to_record(row) for row in rows], epoch)

    def _drop_cached(self, ids: list[str] | None, vectors: bool, user_id: str | None) -> None:
        self._cache.evict(ids, user_id if ids is None else None)  # no ids: all of that user's, or everyone's
        if vectors:
            self._vector_cache.invalidate(user_id)
            self._token_cache.invalidate(user_id)

    def update_vectors(
        self, ids_to_vectors: dict[str, tuple[str, np.ndarray]], user_id: str | None = None
    ) -> None:
        """Set ``prev_id`` and the search vector of some records (after a neighbour was forgotten),
        in one merge (an update per record, its vector written out as SQL, took up to twice as long).
        Naming their user patches their rows in memory (before and after, as ``_changing`` drops
        records) instead of dropping every user's vectors; the tokens do not change."""
        with self._changing(list(ids_to_vectors), vectors=user_id is None, user_id=user_id):
            table = self._tables.records
            if table is None or not ids_to_vectors:
                return
            if user_id is not None:
                self._vector_cache.patch_rows(user_id, ids_to_vectors)
            self._set_columns({"id": list(ids_to_vectors), "prev_id": [p for p, _ in ids_to_vectors.values()],
                               "vector": [np.asarray(v, np.float32) for _, v in ids_to_vectors.values()]})  # fmt: skip
            if user_id is not None:
                self._vector_cache.patch_rows(user_id, ids_to_vectors)

    def set_superseded(
        self, rids: list[str], by_id: str, valid_to: datetime | None, user_id: str | None = None
    ) -> None:
        """Close records' validity: ``valid_to`` and the id of the fact that replaced them (or
        reopen them: "" and None), in one update."""
        if not rids:
            return
        with self._changing(rids):
            table = self._tables.records
            if table is not None:
                where = _of_user(sql_in("id", rids), user_id)
                table.update(where=where, values={"superseded_by": by_id, "valid_to": valid_to})
                for rid in rids:
                    self._vector_cache.mark_superseded(rid, by_id, user_id)

    def set_tokens(self, user_id: str, tokens: dict[str, bytes]) -> None:
        """Store packed token vectors for some of a user's records (a backfill of records
        written before the column)."""
        with self._changing(list(tokens), vectors=True, user_id=user_id):
            if self._tables.records is None or not tokens:
                return
            self._set_columns({"id": list(tokens), "tokens": list(tokens.values())})

    def set_vectors(self, user_id: str, vectors: dict[str, np.ndarray]) -> None:
        """Set the search vectors of some of a user's records, in one merge."""
        with self._changing(list(vectors), vectors=True, user_id=user_id):
            if self._tables.records is None or not vectors:
                return
            values = [np.asarray(v, np.float32) for v in vectors.values()]
            self._set_columns({"id": list(vectors), "vector": values})

    def set_mention_counts(self, counts: dict[str, int]) -> None:
        """Set mention counts (facts said again)."""
        with self._changing(list(counts)):
            if self._tables.records is None or not counts:
                return
            self._set_columns({"id": list(counts), "mention_count": list(counts.values())})

    def add_accesses(self, counts: dict[str, int], when: datetime) -> None:
        """Add ``counts[id]`` retrievals to each record and stamp ``when`` as its last access."""
        with self._changing(list(counts)):
            if self._tables.records is None or not counts:
                return
            ids = list(counts)
            current = {row["id"]: row["access_count"] or 0
                       for start in range(0, len(ids), 500)
                       for rows in self._scan(sql_in("id", ids[start : start + 500]), ["id", "access_count"])
                       for row in rows}  # fmt: skip
            found = list(current)
            self._set_columns({"id": found, "access_count": [current[rid] + counts[rid] for rid in found],
                               "last_accessed_at": [when] * len(found)})  # fmt: skip

    def _set_columns(self, columns: dict[str, list[Any]]) -> None:
        """Set some columns of the rows with these ids, in one merge: an update per distinct value
        rewrote the table once per value (a well-used store has hundreds of distinct access
        counts: a flush ran for minutes, where one merge takes a moment). Ids no longer in the
        log are skipped."""
        table = self._tables.records
        assert table is not None
        schema = table_schema(self._tables.dim or 1)
        types = {name: schema.field(name).type for name in columns}
        source = pa.table({name: pa.array(col, type=types[name]) for name, col in columns.items()})
        table.merge_insert("id").when_matched_update_all().execute(source)

    def delete(self, ids: list[str], user_id: str | None = None) -> int:
        """Delete records by id; returns how many existed. Naming their user confines the
        delete to that user's rows, and takes them out of the user's vectors and tokens in
        memory (before and after, as ``_changing`` drops records), which the user's next search
        would otherwise read again whole; without, every user's are dropped."""
        with self._changing(ids, vectors=user_id is None, user_id=user_id):
            table = self._tables.records
            if table is None or not ids:
                return 0
            self._drop_rows(ids, user_id)
            deleted = 0
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                deleted += table.delete(_of_user(sql_in("id", chunk), user_id)).num_deleted_rows
            self._drop_rows(ids, user_id)
            return deleted

    def _drop_rows(self, ids: list[str], user_id: str | None) -> None:
        if user_id is not None:
            self._vector_cache.drop_rows(user_id, ids)
            self._token_cache.drop_rows(user_id, ids)

    def delete_user(self, user_id: str) -> None:
        """Delete every record of a user."""
        with self._changing(None, vectors=True, user_id=user_id):
            table = self._tables.records
            if table is not None:
                table.delete(of_user(user_id))
