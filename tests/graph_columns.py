"""A rebuild's batch in columns made from records one by one (``storage.graph.bulk.GraphTables``)."""

from __future__ import annotations

import pyarrow as pa

from mnemoplan.storage.graph.bulk import EDGE_TABLES, GraphTables
from mnemoplan.storage.graph.bulk import schemas as bulk_schemas
from mnemoplan.storage.graph.client import GraphRecord


def tables_of(records: list[GraphRecord]) -> GraphTables:
    """These records in columns, a record at a time: the reference ``storage.documents.graph_tables``
    (built from the log's columns) is checked against, and a source in columns for the graph's tests."""
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
        schema = bulk_schemas().get(name) or bulk_schemas()["edges"]
        tables[name] = pa.table({f: [row[i] for row in rows] for i, f in enumerate(schema.names)}, schema=schema)
    return GraphTables(records=tables["records"], sessions=tables["sessions"], entities=tables["entities"],
                       edges={name: tables[name] for name in EDGE_TABLES},
                       relations=tuple(rel for r in records for rel in r.relations))  # fmt: skip
