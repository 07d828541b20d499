"""A batch of a user's graph in columns, as a rebuild sends it to the graph's process.

A rebuild writes every record of a user at once (a replica's first touch, ``reindex``, repair).
Sent as ``GraphRecord`` objects, a user of 100k records cost ~3 s to build them (~30 us each),
more to pickle, and the graph's process turned them back into rows a dict at a time; as Arrow
tables, Kùzu reads them directly (``LOAD FROM`` to create nodes, ``COPY`` for edges). Only keys
and ids cross, as with ``GraphRecord``: never a word of content.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import pyarrow as pa

    from mnemoplan.storage.graph.records import GraphRecord, GraphRelation

# The edge tables a batch carries, each of the ends' keys ``a``, ``b`` (and ``role`` for MENTIONS).
EDGE_TABLES = ("IN_SESSION", "NEXT", "DERIVED_FROM", "MENTIONS")
# Records per batch: in columns, a 100k user's graph took 7.9 s in batches of 10,000, 3.2-4.2 s in
# batches of 50,000 (the graph's process at ~260 MB either way); records one by one held 850 MB at
# 50,000, 300 MB at 10,000.
COLUMNS_BATCH, RECORDS_BATCH = 50_000, 10_000


@dataclass(frozen=True)
class GraphTables:
    """A batch of new records of one user with their edges, in columns.

    Attributes:
        records: ``id``, ``user``, ``kind``, ``seq``, ``ts``: the Record nodes.
        sessions: ``id``, ``user``: each session the batch's records are in, once.
        entities: ``id``, ``user``, ``etype``: each entity they mention, once, with the last
            type a mention gives it ("" if none does).
        edges: Per table of ``EDGE_TABLES``: ``a`` and ``b``, the keys of its ends (MENTIONS: and ``role``).
        relations: A fact's edges between the entities it relates (few: written one by one).
    """

    records: pa.Table
    sessions: pa.Table
    entities: pa.Table
    edges: dict[str, pa.Table]
    relations: tuple[GraphRelation, ...] = ()


class RebuildBatch(Protocol):
    """A batch of a rebuild: its records in columns if the source has them, else one by one."""

    size: int

    def tables(self) -> GraphTables | None:
        """The batch in columns (None: only ``records``)."""
        ...

    def records(self) -> list[GraphRecord]:
        """The batch, a ``GraphRecord`` each (what a rebuild writes once a bulk write failed)."""
        ...


@runtime_checkable
class RebuildSource(Protocol):
    """A user's records in write order, in batches."""

    def batches(self, size: int) -> Iterator[RebuildBatch]:
        """Batches of at most ``size`` records."""
        ...


@dataclass(frozen=True)
class _Listed:
    held: list[GraphRecord]

    @property
    def size(self) -> int:
        return len(self.held)

    def tables(self) -> GraphTables | None:
        return None

    def records(self) -> list[GraphRecord]:
        return self.held


def batches(records: Iterable[GraphRecord] | RebuildSource, size: int | None = None) -> Iterator[RebuildBatch]:
    """A rebuild's batches of ``size`` records (by default ``COLUMNS_BATCH`` or ``RECORDS_BATCH``),
    from a source in columns or from records one by one."""
    if isinstance(records, RebuildSource):
        yield from records.batches(size or COLUMNS_BATCH)
        return
    size = size or RECORDS_BATCH
    chunk: list[GraphRecord] = []
    for rec in records:
        chunk.append(rec)
        if len(chunk) >= size:
            yield _Listed(chunk)
            chunk = []
    yield _Listed(chunk)


@functools.cache
def schemas() -> dict[str, pa.Schema]:
    """The tables' columns (made at first use: the graph's process loads pyarrow only to rebuild)."""
    import pyarrow as pa

    text, number = pa.string(), pa.int64()
    return {
        "records": pa.schema([("id", text), ("user", text), ("kind", text), ("seq", number), ("ts", number)]),
        "sessions": pa.schema([("id", text), ("user", text)]),
        "entities": pa.schema([("id", text), ("user", text), ("etype", text)]),
        "edges": pa.schema([("a", text), ("b", text)]),
        "MENTIONS": pa.schema([("a", text), ("b", text), ("role", text)]),
    }
