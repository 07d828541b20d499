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
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from mnemoplan.storage.graph.client import GraphRecord, GraphRelation

# The edge tables a batch carries, each of the ends' keys ``a``, ``b`` (and ``role`` for MENTIONS).
EDGE_TABLES = ("IN_SESSION", "NEXT", "DERIVED_FROM", "MENTIONS")


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


def batches(records: Iterable[GraphRecord] | RebuildSource, size: int) -> Iterator[RebuildBatch]:
    """A rebuild's batches, from a source in columns or from records one by one."""
    if hasattr(records, "batches"):
        yield from records.batches(size)
        return
    chunk: list[GraphRecord] = []
    for rec in records:
        chunk.append(rec)
        if len(chunk) >= size:
            yield _Listed(chunk)
            chunk = []
    yield _Listed(chunk)


def tables_of(records: list[GraphRecord]) -> GraphTables:
    """These records in columns, a record at a time (``storage.documents.graph_tables`` builds
    the same from the log's columns)."""
    import pyarrow as pa

    entities: dict[str, tuple[str, str]] = {}  # the last type a mention gives, else the one before
    for r in records:
        for m in r.mentions:
            entities[m.entity] = (r.user, m.etype or entities.get(m.entity, ("", ""))[1])
    columns = {
        "records": [(r.id, r.user, r.kind, r.seq, r.ts) for r in records],
        "sessions": list({r.session: r.user for r in records if r.session}.items()),
        "entities": [(e, user, etype) for e, (user, etype) in entities.items()],
        "IN_SESSION": [(r.id, r.session) for r in records if r.session],
        "NEXT": [(r.prev_id, r.id) for r in records if r.prev_id],
        "DERIVED_FROM": [(r.id, src) for r in records for src in r.derived_from],
        "MENTIONS": [(r.id, m.entity, m.role) for r in records for m in r.mentions],
    }
    tables = {}
    for name, rows in columns.items():
        schema = schemas().get(name) or schemas()["edges"]
        tables[name] = pa.table({f: [row[i] for row in rows] for i, f in enumerate(schema.names)}, schema=schema)
    return GraphTables(records=tables["records"], sessions=tables["sessions"], entities=tables["entities"],
                       edges={name: tables[name] for name in EDGE_TABLES},
                       relations=tuple(rel for r in records for rel in r.relations))  # fmt: skip


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
