"""The graph's Kùzu database, as it runs in the graph's child process. The only module that imports kuzu.

Only the child imports this (see ``graph._CHILD``): the server's own process never loads
Kùzu, whose checkpoints write memory it never initialised into the database file (see
``graph``). ``serve`` answers ``GraphIndex``'s requests with a ``KuzuGraph``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kuzu
from cachetools import LRUCache

from mnemoplan.storage.graph.client import (
    COPY_MIN_EDGES,
    EXIT_COPY_FAILED,
    REMOTE,
    GraphRecord,
    GraphRelation,
    failed,
    receive,
    send,
)
from mnemoplan.storage.graph.kuzu_reads import BY_KEY_MAX, GraphReads

if TYPE_CHECKING:
    from mnemoplan.storage.graph.bulk import GraphTables

log = logging.getLogger(__name__)

PREPARED_HELD = 128  # distinct statement texts kept prepared (the code has a few dozen)
COPIES_PER_OPEN = 256  # COPY statements after which the database is opened again (``_copy``)
# Orphans: a session or an entity no record points at any more (``.format``: "" for all, or a key).
_ORPHAN_SESSIONS = "MATCH (s:Session{}) WHERE NOT EXISTS {{ MATCH (:Record)-[:IN_SESSION]->(s) }} DELETE s"
_ORPHAN_ENTITIES = "MATCH (e:Entity{}) WHERE NOT EXISTS {{ MATCH (:Record)-[:MENTIONS]->(e) }} DETACH DELETE e"
_BY_KEY = " {id: $id}"

# A rebuild's edges one statement each (``_each``), ``put`` CREATE or MERGE: ends' keys ``a``, ``b``.
_EDGES = {
    "IN_SESSION": "MATCH (r:Record {{id: $a}}), (s:Session {{id: $b}}) {put} (r)-[:IN_SESSION]->(s)",
    "NEXT": "MATCH (a:Record {{id: $a}}), (b:Record {{id: $b}}) {put} (a)-[:NEXT]->(b)",
    "DERIVED_FROM": "MATCH (a:Record {{id: $a}}), (b:Record {{id: $b}}) {put} (a)-[:DERIVED_FROM]->(b)",
    "MENTIONS": "MATCH (r:Record {{id: $a}}), (e:Entity {{id: $b}}) {put} (r)-[m:MENTIONS]->(e) SET m.role = $role",
}

_SCHEMA = [
    "CREATE NODE TABLE IF NOT EXISTS Record(id STRING, user STRING, kind STRING, seq INT64, ts INT64, PRIMARY KEY(id))",
    "CREATE NODE TABLE IF NOT EXISTS Session(id STRING, user STRING, PRIMARY KEY(id))",
    "CREATE NODE TABLE IF NOT EXISTS Entity(id STRING, user STRING, etype STRING, PRIMARY KEY(id))",
    "CREATE REL TABLE IF NOT EXISTS IN_SESSION(FROM Record TO Session)",
    "CREATE REL TABLE IF NOT EXISTS NEXT(FROM Record TO Record)",
    "CREATE REL TABLE IF NOT EXISTS MENTIONS(FROM Record TO Entity, role STRING)",
    "CREATE REL TABLE IF NOT EXISTS DERIVED_FROM(FROM Record TO Record)",
    "CREATE REL TABLE IF NOT EXISTS RELATED(FROM Entity TO Entity, fact STRING, strength DOUBLE, "
    "negated BOOLEAN, valid_to INT64)",
]


def _without(rows: Any, ids: Collection[str]) -> Any:
    """The rows of an Arrow table whose ``id`` is not among ``ids``."""
    if not ids:
        return rows
    import pyarrow as pa
    import pyarrow.compute as pc

    return rows.filter(pc.invert(pc.is_in(rows.column("id"), value_set=pa.array(list(ids), pa.string()))))


class KuzuGraph(GraphReads):
    """The Kùzu database itself; runs in the graph's child process (see ``GraphIndex``).

    Kùzu 0.11.3 crashes (SIGSEGV) in a checkpoint that follows one where a node group of a
    relationship table had edges inserted *and* deleted since the checkpoint before, and no
    other change: that checkpoint takes an early return (``CSRNodeGroup::checkpointInMemAndOnDisk``
    with no region to write) that leaves the deleted edges' rows in its in-memory index marked
    invalid instead of clearing them, and the next checkpoint of the table reads a chunk at that
    invalid row index. Remembering a few turns and forgetting them did exactly that every round,
    from the third on. So no edge is ever deleted before a checkpoint has made it persistent
    (``_settle``); and a database opened with a write-ahead log, which may replay such edges (a
    process killed meanwhile, or one that crashed so), is checkpointed and opened again first.

    Args:
        path: File of the Kùzu database.
        buffer_pool_mb: Kùzu's page cache (its default is most of the machine's RAM).
        unwind_max_records: Graph size up to which edges are written in one statement (see ``_each``).
        read_only: Open the database to read only (its schema is then taken as it is).
    """

    def __init__(
        self, path: Path, *, buffer_pool_mb: int, unwind_max_records: int, read_only: bool = False
    ) -> None:
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._path, self._buffer_pool, self._read_only = path, buffer_pool_mb * 1024 * 1024, read_only
        self._unwind_max = unwind_max_records
        self._open()
        wal = path.with_name(f"{path.name}.wal")
        if not read_only and wal.exists() and wal.stat().st_size:
            # The first checkpoint after opening never crashes; the edges the log replayed
            # leave the memory with the process's copy of the database (see the class's doc).
            self.checkpoint()
            self.close()
            self._open()
        # Edges inserted since the last checkpoint, as far as this process knows (Kùzu may
        # checkpoint on its own as well, which only makes a ``_settle`` do needless work).
        self._unsettled = False
        for statement in _SCHEMA if not read_only else ():
            self._conn.execute(statement)

    def _open(self) -> None:
        self._db = kuzu.Database(str(self._path), buffer_pool_size=self._buffer_pool, read_only=self._read_only)
        self._conn = kuzu.Connection(self._db)
        # Our queries are small; one thread each keeps Kùzu from competing with the
        # embedding and the other signals of the same recall for the two cores.
        self._conn.set_max_threads_for_exec(1)
        self._prepared: LRUCache[str, Any] = LRUCache(PREPARED_HELD)
        self._copies = 0

    def _execute(self, query: str, params: dict[str, Any] | None = None) -> Any:
        """Run a statement; one with parameters through a statement prepared once per text.

        Kùzu 0.11 keeps ~25 KB for every ``execute(text, parameters)`` until the process ends
        (2,500 one-edge statements: +63 MB, however their results are closed): one statement
        per edge grew the graph's process to 20 GB on a 300k-record store. A prepared statement
        executed again keeps nothing (and runs in half the time). Kùzu calls separate prepare
        and execute deprecated; they are its only way around this.
        """
        if not params:
            return self._conn.execute(query)
        prepared = self._prepared.get(query)
        if prepared is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                prepared = self._prepared[query] = self._conn.prepare(query)
        return self._conn.execute(prepared, params)

    def _run(self, query: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        result = self._execute(query, params)
        return result.get_all() if isinstance(result, kuzu.QueryResult) else []

    def _each(self, query: str, rows: list[dict[str, Any]], *, batched: bool) -> None:
        """Run a statement over rows of its ``$name`` parameters (inside the caller's transaction).

        Kùzu answers ``UNWIND $rows AS row MATCH (a:Record {id: row.a}), (b:Record {id: row.b})``
        with a scan of the node table per row: cheap on a small graph, ruinous on a large one
        (the overlay fell ever further behind). One statement per row costs the same at any
        size. Below ``unwind_max_records`` records the batch wins (``batched``), above it the
        rows.
        """
        if not rows:
            return
        if batched:
            unwound = re.sub(r"\$(\w+)", r"row.\1", query)
            self._execute("UNWIND $rows AS row " + unwound, {"rows": rows})
            return
        for row in rows:
            self._execute(query, row)

    def _copy(self, table: str, rows: list[dict[str, Any]] | Any) -> None:
        """Create edges of ``table`` from rows (or an Arrow table) of their ends' keys (``a``, ``b``)
        and properties, with Kùzu's COPY from an Arrow table, in a transaction of its own: 2,000 edges took 39 ms on a
        graph of 5k records and ~80 ms on one of 200k, where a statement per edge took ~1.5 s. An
        edge whose end is missing is skipped (``IGNORE_ERRORS``), as a MATCH skips it.

        Kùzu 0.11.3 empties the whole table, every user's edges, when a COPY into a table holding
        checkpointed edges does not commit: rolled back after it, or failing half way (its buffer
        pool full, say). Only the process's memory is wrong then: the file and the write-ahead log
        hold just what committed. So a failed COPY ends the process at once, before anything can
        checkpoint that memory; the parent starts a new child, which opens what committed, and
        ``GraphIndex.rebuild`` writes that batch again without COPY. A COPY that commits also
        checkpoints the database (its time is in the figures above). Each keeps ~0.4 MB until the
        database closes, so the database is opened again after ``COPIES_PER_OPEN`` of them.
        """
        import pyarrow as pa  # only here: a child that never rebuilds a large user never loads it

        if isinstance(rows, pa.Table):
            edges = rows  # noqa: F841 (read by name)
        else:
            edges = pa.table({key: [row[key] for row in rows] for key in rows[0]})  # noqa: F841
        try:
            # Named, not a parameter (a prepared COPY takes no table): Kùzu finds ``edges`` in this frame.
            self._conn.execute(f"COPY {table} FROM edges (IGNORE_ERRORS=true)")
        except BaseException:
            log.critical("copying %s edges into the graph failed; its process ends so that nothing "
                         "it holds in memory is checkpointed", len(rows), exc_info=True)  # fmt: skip
            os._exit(EXIT_COPY_FAILED)
        self._copies += 1

    def _reopen_after_copies(self) -> None:
        """Open the database again once COPY statements kept enough memory (see ``_copy``); a
        child that cannot ends (the parent starts another) rather than serve a closed database."""
        if self._copies >= COPIES_PER_OPEN:
            self.checkpoint()
            self.close()
            try:
                self._open()
            except BaseException:
                log.critical("the graph database could not be opened again; its process ends", exc_info=True)
                os._exit(1)

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction for several statements (one commit instead of one per statement)."""
        self._conn.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            try:
                self._conn.execute("ROLLBACK")
            except RuntimeError:  # Kùzu already rolled back (e.g. after running out of buffer pool)
                log.warning("graph transaction was already rolled back", exc_info=True)
            raise
        self._conn.execute("COMMIT")

    # -- writes ------------------------------------------------------------------------

    def add(self, records: list[GraphRecord], *, fresh: bool = False, bulk: bool = False) -> None:
        """Insert records with their edges; re-adding a record is harmless.

        ``fresh`` promises the records and their edges are new (a first write), which lets
        them be created without the look-ups MERGE needs (a first write, or a user's rebuild after
        ``drop_user``); repair passes it only for records missing from the graph. ``bulk`` (with
        ``fresh``: a rebuild, done again as a whole if cut short) lets ``COPY_MIN_EDGES`` or more
        edges of a kind be copied (``_copy``), each kind in a transaction of its own after the
        nodes': a batch cut short may then leave records without some of their edges.
        """
        assert fresh or not bulk, "only fresh records are written in bulk"
        if not records:
            return
        put = "CREATE" if fresh else "MERGE"
        self._unsettled = True
        copies: list[tuple[str, list[dict[str, Any]]]] = []
        with self._transaction():
            # Counting nodes is cheap beside the writes; it picks how the edges are written.
            batched = self._run("MATCH (r:Record) RETURN count(r)")[0][0] < self._unwind_max

            def write_edges(query: str, table: str, rows: list[dict[str, Any]]) -> None:
                if bulk and len(rows) >= COPY_MIN_EDGES:  # bulk is fresh (asserted above)
                    copies.append((table, rows))  # once the nodes are committed
                else:
                    self._each(query, rows, batched=batched)

            rows = [{"id": r.id, "user": r.user, "kind": r.kind, "seq": r.seq, "ts": r.ts} for r in records]
            if fresh:
                self._run(
                    "UNWIND $rows AS row CREATE (:Record {id: row.id, user: row.user, kind: row.kind, "
                    "seq: row.seq, ts: row.ts})",
                    {"rows": rows},
                )
            else:
                self._run(
                    "UNWIND $rows AS row MERGE (r:Record {id: row.id}) "
                    "SET r.user = row.user, r.kind = row.kind, r.seq = row.seq, r.ts = row.ts",
                    {"rows": rows},
                )
            sessions = [{"id": r.id, "s": r.session, "user": r.user} for r in records if r.session]
            if sessions:
                distinct = list({row["s"]: row for row in sessions}.values())
                self._run(
                    "UNWIND $rows AS row MERGE (s:Session {id: row.s}) SET s.user = row.user",
                    {"rows": distinct},
                )
            write_edges(_EDGES["IN_SESSION"].format(put=put), "IN_SESSION",
                        [{"a": row["id"], "b": row["s"]} for row in sessions])  # fmt: skip
            write_edges(_EDGES["NEXT"].format(put=put), "NEXT",
                        [{"a": r.prev_id, "b": r.id} for r in records if r.prev_id])  # fmt: skip
            write_edges(_EDGES["DERIVED_FROM"].format(put=put), "DERIVED_FROM",
                        [{"a": r.id, "b": src} for r in records for src in r.derived_from])  # fmt: skip
            if any(r.mentions for r in records):
                if bulk:
                    self._put_entities(records)
                else:
                    entities = {(m.entity, r.user, m.etype) for r in records for m in r.mentions}
                    self._run(
                        "UNWIND $rows AS row MERGE (e:Entity {id: row.id}) SET e.user = row.user, "
                        "e.etype = CASE WHEN row.etype = '' THEN e.etype ELSE row.etype END",
                        {"rows": [{"id": e, "user": u, "etype": t} for e, u, t in entities]},
                    )
                # The mention and relation edges too: unwound, each row scanned the node tables
                # (100 mentions took 3.1 s on a graph of 150k records, 0.04 s one by one).
                write_edges(_EDGES["MENTIONS"].format(put=put), "MENTIONS",
                            [{"a": r.id, "b": m.entity, "role": m.role} for r in records for m in r.mentions])  # fmt: skip
            self._relate([rel for r in records for rel in r.relations], batched=batched)
        for table, edge_rows in copies:
            self._copy(table, edge_rows)
        self._reopen_after_copies()

    def _relate(self, relations: list[GraphRelation], *, batched: bool) -> None:
        rows = [{"a": r.source, "b": r.target, "f": r.fact, "s": r.strength, "n": r.negated} for r in relations]
        self._each("MATCH (a:Entity {id: $a}), (b:Entity {id: $b}) MERGE (a)-[x:RELATED {fact: $f}]->(b) "
                   "SET x.strength = $s, x.negated = $n", rows, batched=batched)  # fmt: skip

    def add_tables(self, tables: GraphTables) -> None:
        """Insert a rebuild's batch of new records given in columns (``bulk``), as ``add`` with
        ``fresh`` and ``bulk`` does from records: in one transaction, the nodes created from the
        tables by ``LOAD FROM`` (50k records in 0.23 s, against 1.9 s unwound from parameters),
        the sessions and entities the graph lacks created and changed entity types set; then each
        kind of edges copied in a transaction of its own (``_copy``), or below ``COPY_MIN_EDGES``
        written a statement per edge."""
        self._unsettled = True
        copies: list[tuple[str, Any]] = []
        with self._transaction():
            batched = self._run("MATCH (r:Record) RETURN count(r)")[0][0] < self._unwind_max
            self._load("LOAD FROM rows CREATE (:Record {id: id, user: user, kind: kind, seq: seq, ts: ts})",
                       tables.records)  # fmt: skip
            held = [row[0] for row in self._load("LOAD FROM rows MATCH (s:Session {id: id}) RETURN s.id",
                                                 tables.sessions)]  # fmt: skip
            self._load("LOAD FROM rows CREATE (:Session {id: id, user: user})", _without(tables.sessions, held))
            typed = dict(self._load("LOAD FROM rows MATCH (e:Entity {id: id}) RETURN e.id, e.etype",
                                    tables.entities))  # fmt: skip
            self._load("LOAD FROM rows CREATE (:Entity {id: id, user: user, etype: etype})",
                       _without(tables.entities, typed))  # fmt: skip
            entities = tables.entities.select(["id", "etype"]).to_pylist()
            retyped = [e for e in entities if e["id"] in typed and e["etype"] and e["etype"] != typed[e["id"]]]
            if retyped:
                self._run("UNWIND $rows AS row MATCH (e:Entity {id: row.id}) SET e.etype = row.etype",
                          {"rows": retyped})  # fmt: skip
            for name, edges in tables.edges.items():
                if edges.num_rows >= COPY_MIN_EDGES:
                    copies.append((name, edges))  # once the nodes are committed
                else:
                    self._each(_EDGES[name].format(put="CREATE"), edges.to_pylist(), batched=batched)
            self._relate(list(tables.relations), batched=batched)
        for table, edges in copies:
            self._copy(table, edges)
        self._reopen_after_copies()

    def _load(self, query: str, rows: Any) -> list[list[Any]]:
        """Run a ``LOAD FROM rows`` statement over an Arrow table (nothing for none)."""
        if not rows.num_rows:
            return []
        # Kùzu finds ``rows`` by name in this frame. Unlike a COPY it keeps next to nothing: 1,000
        # of them grew the process by 4 MB.
        result = self._conn.execute(query)
        return result.get_all() if isinstance(result, kuzu.QueryResult) else []

    def _put_entities(self, records: list[GraphRecord]) -> None:
        """Write the entities the records mention, each with the last type they give it (an
        untyped mention keeps the type): the ones the graph lacks created at once, the others'
        types set where they change (their user is theirs already: an entity's key is the
        user's). An unwound MERGE took 0.94 s for the 2,400 entities of 2,000 records on a graph
        of 48k; a look-up by key, 11-37 ms, and a CREATE of them all, 67 ms (a rebuild's
        entities are mostly new: its user was dropped). That MERGE also left some typed
        entities untyped; nothing reads the type yet."""
        latest: dict[str, tuple[str, str]] = {}  # entity -> (user, type)
        for r in records:
            for m in r.mentions:
                latest[m.entity] = (r.user, m.etype or latest.get(m.entity, ("", ""))[1])
        held = dict(self._run("UNWIND $ids AS i MATCH (e:Entity {id: i}) RETURN e.id, e.etype",
                              {"ids": list(latest)}))  # fmt: skip
        new = [{"id": e, "user": u, "etype": t} for e, (u, t) in latest.items() if e not in held]
        if new:
            self._run("UNWIND $rows AS row CREATE (:Entity {id: row.id, user: row.user, etype: row.etype})",
                      {"rows": new})  # fmt: skip
        retyped = [{"id": e, "etype": t} for e, (_, t) in latest.items() if e in held and t and t != held[e]]
        if retyped:
            self._run("UNWIND $rows AS row MATCH (e:Entity {id: row.id}) SET e.etype = row.etype",
                      {"rows": retyped})  # fmt: skip

    def close_relation(self, fact_id: str, valid_to: int | None) -> None:
        """Mark the edges a superseded fact created as no longer valid (None: valid again). They
        start at its subjects (``graph_record``): sought from the fact by key, not among every
        relation of the graph (a scan of them all at each superseded fact)."""
        self._unsettled = True
        self._run("MATCH (r:Record {id: $f})-[:MENTIONS]->(:Entity)-[x:RELATED]->(:Entity) WHERE x.fact = $f "
                  "SET x.valid_to = $t", {"f": fact_id, "t": valid_to})  # fmt: skip

    def _settle(self) -> None:
        """Checkpoint before deleting edges if some may not be persistent yet (see the class's doc)."""
        if self._unsettled:
            self.checkpoint()

    def delete(self, ids: list[str]) -> int:
        """Detach-delete records, with the relations their facts made, then drop the sessions and
        entities nothing points at any more.

        A few records are sought by key, and only their own sessions and entities are checked:
        the statements over the whole graph cost ~0.5 s at 500k records whatever was deleted,
        most of a forget's time, and every other call waited behind it. Many records at once
        (a session, a user's memories) take the whole-graph statements, whose cost does not
        grow with their number."""
        if not ids:
            return 0
        self._settle()
        with self._transaction():
            if len(ids) > BY_KEY_MAX:
                found = self._run("MATCH (r:Record) WHERE r.id IN $ids RETURN count(r)", {"ids": ids})[0][0]
                self._run("MATCH ()-[x:RELATED]->() WHERE x.fact IN $ids DELETE x", {"ids": ids})
                self._run("MATCH (r:Record) WHERE r.id IN $ids DETACH DELETE r", {"ids": ids})
                self._run(_ORPHAN_SESSIONS.format(""))
                self._run(_ORPHAN_ENTITIES.format(""))
                return int(found)
            found, sessions, entities = 0, set(), set()
            for rid in ids:
                key = {"id": rid}
                found += self._run("MATCH (r:Record {id: $id}) RETURN count(r)", key)[0][0]
                entities.update(row[0] for row in self._run(
                    "MATCH (r:Record {id: $id})-[:MENTIONS]->(e:Entity) RETURN e.id", key))  # fmt: skip
                sessions.update(row[0] for row in self._run(
                    "MATCH (r:Record {id: $id})-[:IN_SESSION]->(s:Session) RETURN s.id", key))  # fmt: skip
                # A fact's relations join its subjects to its objects (``graph_record``): from its subjects.
                self._run("MATCH (r:Record {id: $id})-[:MENTIONS]->(:Entity)-[x:RELATED]->(:Entity) "
                          "WHERE x.fact = $id DELETE x", key)  # fmt: skip
                self._run("MATCH (r:Record {id: $id}) DETACH DELETE r", key)
            for sid in sorted(sessions):
                self._run(_ORPHAN_SESSIONS.format(_BY_KEY), {"id": sid})
            for eid in sorted(entities):
                self._run(_ORPHAN_ENTITIES.format(_BY_KEY), {"id": eid})
        return int(found)

    def drop_user(self, user: str) -> int:
        """Delete everything of one user."""
        self._settle()
        with self._transaction():
            found = self._run("MATCH (r:Record {user: $u}) RETURN count(r)", {"u": user})[0][0]
            self._run("MATCH (r:Record {user: $u}) DETACH DELETE r", {"u": user})
            self._run("MATCH (e:Entity {user: $u}) DETACH DELETE e", {"u": user})
            self._run("MATCH (s:Session {user: $u}) DETACH DELETE s", {"u": user})
        return int(found)

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file."""
        self._run("CHECKPOINT")
        self._unsettled = False

    def close(self) -> None:
        """Release the database (other processes may open it afterwards)."""
        self._conn.close()
        self._db.close()


def serve(path: str, buffer_pool_mb: int, unwind_max_records: int, read_only: bool = False) -> None:
    """The child's loop (see ``graph._CHILD``): answer ``(method, args, kwargs)`` requests from stdin
    on stdout until told to close.

    Replies are ``(True, result)`` or ``(False, "exception type: message")``. The parent's
    end of the pipe closing (it exited, or was killed) closes the database too.
    """
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by a library goes to stderr, not into the replies
    requests = sys.stdin.buffer
    try:
        graph = KuzuGraph(Path(path), buffer_pool_mb=buffer_pool_mb, unwind_max_records=unwind_max_records,
                          read_only=read_only)  # fmt: skip
    except Exception as exc:
        send(replies, failed(exc))
        return
    send(replies, (True, os.getpid()))
    while (request := receive(requests)) is not None:
        name, args, kwargs = request
        try:
            if name not in REMOTE:
                raise AttributeError(f"the graph has no request {name!r}")
            reply = (True, getattr(graph, name)(*args, **kwargs))
        except Exception as exc:
            reply = failed(exc)
        send(replies, reply)
        if name == "close":
            return
    graph.close()
