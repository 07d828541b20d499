"""Users' rows in memory: their search vectors (vector search) and token vectors (token matching).

A user small enough is read once, whole, and searched exactly in memory from then on; a
larger one is searched in LanceDB (ANN past ``ann_min_rows``). The log keeps both caches in
step with its writes.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import pyarrow as pa

from mnemoplan.model import RecordHead
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.filters import HAS_TOKENS, of_user, sql
from mnemoplan.storage.log.schema import (
    EVENT_COLUMNS,
    HEAD_COLUMNS,
    TOKEN_COLUMNS,
    alone,
    asks,
    event_micros,
    requests,
    head_arrays,
    kind_code_array,
    matrix,
)
from mnemoplan.storage.log.tables import LogTables, read_again_if_dropped
from mnemoplan.storage.log.token_cache import TokenBlock, TokenCache
from mnemoplan.storage.log.vector_cache import UserVectors, VectorCache

log = logging.getLogger(__name__)
PARTITION_TRIES = 3  # a user changed (not only appended to) during each, or failing, gets no more until read again


class UserViews:
    """Vector search and token blocks of one user at a time, from memory when the user fits.

    Args:
        tables: The log's tables.
        vector_cache: Users' search vectors in memory.
        token_cache: Users' token vectors in memory.
    """

    def __init__(self, tables: LogTables, vector_cache: VectorCache, token_cache: TokenCache) -> None:
        self._tables = tables
        self.vector_cache = vector_cache
        self.token_cache = token_cache
        # A large user's rows are grouped into partitions off the caller's path, one user at a time.
        self._partitioner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="partition")
        self._partitioning: dict[str, Future[None]] = {}
        self._refused: Counter[str] = Counter()  # partitionings a change made in their time spoiled
        self._lock = threading.Lock()

    def user_view(self, user_id: str) -> UserVectors | None:
        """The user's rows in memory, loaded on first use; None for a user too large to cache.
        A user of ``partitions.PARTITION_ROWS`` rows or more is searched exactly until their rows are
        grouped into partitions, in the background (``settle`` waits for it)."""
        entry = self.vector_cache.get(user_id)
        if entry is None:
            entry = self._load(user_id)
        if entry is not None and entry.wants_partitions:
            with self._lock:
                if user_id not in self._partitioning and self._refused[user_id] < PARTITION_TRIES:
                    self._partitioning[user_id] = self._partitioner.submit(self._partition, user_id)
        return entry

    def _partition(self, user_id: str) -> None:
        """Replace a held user's rows by the same rows in partitions, with those written meanwhile;
        unless they changed otherwise (the next search asks again)."""
        spoiled = False
        try:
            revision = self.vector_cache.revision(user_id)
            entry = self.vector_cache.get(user_id)
            if entry is not None and entry.wants_partitions:
                held = self.vector_cache.replace(user_id, entry, entry.partitioned(), revision)
                # Refused for a write's append in the last moment: not a try spoiled, the next one may hold.
                spoiled = not held and self.vector_cache.revision(user_id) != revision
        except Exception:  # the user stays searched exactly
            spoiled = True
            log.exception("partitioning the vectors of a user failed")
        finally:
            with self._lock:
                if spoiled:
                    self._refused[user_id] += 1
                self._partitioning.pop(user_id, None)

    def settle(self) -> None:
        """Wait for the partitioning in flight."""
        with self._lock:
            pending = list(self._partitioning.values())
        wait(pending)

    def _load(self, user_id: str) -> UserVectors | None:
        """The user's rows read from the log and held; None for a user too large to hold."""
        table = self._tables.records
        if table is None:
            return None
        generation = self.vector_cache.generation(user_id)
        where = of_user(user_id)

        def read() -> pa.Table | None:
            newest = self._tables.newest(table)  # one version for the count and the read
            if newest.count_rows(where) > self.vector_cache.max_user_rows:
                return None
            return newest.to_table(columns=["id", *HEAD_COLUMNS, *EVENT_COLUMNS, "speaker", "text", "vector"],
                                   filter=where, with_row_address=True)  # fmt: skip

        data = read_again_if_dropped(read)
        if data is None:
            return None
        with self._lock:  # rows read afresh: their partitioning may be tried again
            self._refused.pop(user_id, None)
        columns = head_arrays(data)
        columns["asks"] = asks(data)
        columns["alone"] = alone(data)
        columns["requests"] = requests(data)
        columns["event_start"], columns["event_end"] = event_micros(data)
        columns["address"] = data.column("_rowaddr").to_numpy().astype(np.int64)
        entry = UserVectors.build(data.column("id").to_pylist(), matrix(data.column("vector")), columns)
        self.vector_cache.put(user_id, entry, generation)
        return entry

    def rows_by_id(self, user_id: str, ids: list[str], columns: list[str]) -> list[dict[str, Any]]:
        """Rows of one user by id (unknown ids are absent), read where the user's rows in memory
        say they are in the log (``_rowaddr``), checked against the user and ids asked, and by id
        for the rest. On a store of 1.6M rows, 20 rows of a 150k-record user took 14-18 ms by
        address and 30-40 ms by id (bench/README.md).

        Addresses are hints: a compaction or a rewrite moves rows, and a read by address then
        misses them (a row deleted or in a fragment gone is not returned). A row found by id
        tells where it is now; when every row asked by address had moved (a compaction moves
        them all), the user's addresses are read again (their ids and addresses only).
        """
        table = self._tables.records
        if table is None or not ids:
            return []
        entry = self.vector_cache.get(user_id)
        at = {} if entry is None else entry.addresses_of(ids)
        rows: list[dict[str, Any]] = []
        if at:
            where = f"_rowaddr IN ({', '.join(str(a) for a in at.values())})"
            rows = [row for row in self._tables.read(table, where, columns).to_pylist()
                    if row["user_id"] == user_id and row["id"] in at]  # fmt: skip
        got = {row["id"] for row in rows}
        rest = [rid for rid in ids if rid not in got]
        if not rest:
            return rows
        more = self._tables.read(table, sql(RecordFilter(user_id, ids=tuple(rest))), columns, row_addresses=True)
        found = dict(zip(more.column("id").to_pylist(), more.column("_rowaddr").to_pylist(), strict=True))
        if entry is not None and at and all(rid in found for rid in at):  # all moved: a compaction
            self._read_addresses(user_id)
        elif entry is not None and found:  # written or rewritten since the user was read
            self.vector_cache.place(user_id, found)
        return rows + more.drop_columns(["_rowaddr"]).to_pylist()

    def _read_addresses(self, user_id: str) -> None:
        """Read where a held user's rows are in the log now: their ids and addresses only."""
        table = self._tables.records
        if table is None or self.vector_cache.get(user_id) is None:
            return
        data = self._tables.read(table, of_user(user_id), ["id"], row_addresses=True)
        found = dict(zip(data.column("id").to_pylist(), data.column("_rowaddr").to_pylist(), strict=True))
        self.vector_cache.place(user_id, found, every=True)

    def heads(self, user_id: str, ids: list[str]) -> dict[str, RecordHead] | None:
        """What ranking reads of some records, from memory; None if the user is not held there
        (then read the records). Unknown ids are absent."""
        entry = self.vector_cache.get(user_id)
        return None if entry is None else entry.heads(ids)

    def records_of(self, user_id: str) -> int:
        """How many records a user has: from memory when their vectors are held."""
        entry = self.vector_cache.get(user_id)
        if entry is not None:
            return len(entry)
        table = self._tables.records
        return 0 if table is None else self._tables.count(table, of_user(user_id))

    def vector_search(
        self, where: RecordFilter, vector: np.ndarray | Callable[[], np.ndarray], k: int
    ) -> list[tuple[str, float]]:
        """Nearest records of the filter's user by cosine similarity: (id, similarity), best first.

        Exact, from memory, for users the vector cache holds; LanceDB for the others. ``vector``
        may be a function that computes it: it is called after the user's vectors are loaded, so
        on a first search the load overlaps the embedding model's (a large user's vectors load
        while the model is still loading at start).

        Raises:
            ValueError: The filter has a condition the rows in memory cannot answer (``filters.mask``).
        """
        table = self._tables.records
        if table is None:
            return []
        entry = self.user_view(where.user_id)
        vector = vector() if callable(vector) else vector
        if entry is not None:
            return entry.search(vector, k, where)
        query = (
            table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector")
            .distance_type("cosine")
            .where(sql(where), prefilter=True)
            .select(["id", "_distance"])
            .limit(k)
        )
        rows = read_again_if_dropped(lambda: query.to_arrow().to_pylist())
        return [(row["id"], 1.0 - float(row["_distance"])) for row in rows]

    def token_blocks(self, user_id: str, *, scan: bool = False, most: int = 0) -> Iterator[TokenBlock]:
        """A user's packed token vectors, in blocks: from memory, else read from the log and held
        when they fit the token cache. A user too large to hold is read a batch at a time when
        ``scan`` is set (a full read of the user per call, never all in memory at once), and
        yields nothing otherwise; nor does a user with more than ``most`` records, when ``most``
        is set (checked before anything is read)."""
        table = self._tables.records
        if table is None or (not scan and self.token_cache.too_large(user_id)):  # not read again
            return
        if most and self.records_of(user_id) > most:
            return
        held = self.token_cache.get(user_id)
        if held is not None:
            yield from held
            return
        generation, stamp = self.token_cache.generation(user_id), self.token_cache.size_stamp(user_id)
        loaded: list[TokenBlock] = []
        total = 0
        for batch in self._tables.batches(table, of_user(user_id, HAS_TOKENS), TOKEN_COLUMNS, 5_000):
            heads = head_arrays(pa.Table.from_batches([batch]), ["kind", "project_id", "occurred_at"])
            kinds = kind_code_array(heads["kind"])
            block = TokenBlock.build(batch.column("id").to_pylist(), batch.column("tokens").to_pylist(),
                                     kinds, heads["project_id"], heads["occurred_at"])  # fmt: skip
            total += block.tokens
            if total <= self.token_cache.max_user_tokens:
                loaded.append(block)
                continue
            if not scan:
                self.token_cache.mark_too_large(user_id, stamp)
                return
            yield from loaded  # too large to hold: what was read so far, then each batch as it comes
            loaded = []
            yield block
        if total <= self.token_cache.max_user_tokens:
            self.token_cache.put(user_id, tuple(loaded), generation)
            yield from self.token_cache.get(user_id) or tuple(loaded)
        else:
            self.token_cache.mark_too_large(user_id, stamp)
