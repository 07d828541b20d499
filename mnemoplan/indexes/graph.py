"""Graph overlay in Kùzu: records, sessions, entities and their edges. The only module that imports kuzu.

The graph holds topology, never content. Kùzu does not zero the pages it frees, so
anything written here could outlive a ``forget``; callers therefore pass opaque keys
(random record ids, and keyed hashes of user, session and entity names that the store
computes with a per-user secret destroyed when the user is forgotten).

Kùzu also writes memory it never initialised into its file: the unused tail of the
pages a checkpoint writes its metadata to comes straight from ``malloc``, so whatever
the process freed there before (a message, a forgotten one included) could land on
disk. The database therefore lives in a child process of its own (``GraphIndex``
starts it, ``KuzuGraph`` is what runs there) whose memory only ever holds those opaque
keys: requests and replies cross a pipe, and the child never sees a word of content.

Nodes: Record(id, user, kind, seq, ts), Session(id, user), Entity(id, user, etype).
Edges: IN_SESSION(Record->Session), NEXT(Record->Record, the following turn),
MENTIONS(Record->Entity, role), DERIVED_FROM(Record->Record),
RELATED(Entity->Entity, fact, strength, negated, valid_to).
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import kuzu

log = logging.getLogger(__name__)

UNWIND_MAX_RECORDS = 20_000  # see KuzuGraph._each

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


@dataclass(frozen=True)
class GraphMention:
    """A record's link to an entity (opaque entity key)."""

    entity: str
    etype: str = ""
    role: str = "mention"


@dataclass(frozen=True)
class GraphRelation:
    """A fact-backed edge between two entities."""

    source: str
    target: str
    fact: str
    strength: float = 1.0
    negated: bool = False


@dataclass(frozen=True)
class GraphRecord:
    """What the graph keeps of one record: ids and opaque keys only."""

    id: str
    user: str
    kind: str
    seq: int
    ts: int
    session: str = ""
    prev_id: str = ""
    derived_from: tuple[str, ...] = ()
    mentions: tuple[GraphMention, ...] = ()
    relations: tuple[GraphRelation, ...] = field(default_factory=tuple)


class KuzuGraph:
    """The Kùzu database itself; runs in the graph's child process (see ``GraphIndex``).

    Args:
        path: File of the Kùzu database.
        buffer_pool_mb: Kùzu's page cache (its default is most of the machine's RAM).
        unwind_max_records: Graph size up to which edges are written in one statement (see ``_each``).
    """

    def __init__(
        self, path: Path, *, buffer_pool_mb: int = 1024, unwind_max_records: int = UNWIND_MAX_RECORDS
    ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = kuzu.Database(str(path), buffer_pool_size=buffer_pool_mb * 1024 * 1024)
        self._conn = kuzu.Connection(self._db)
        # Our queries are small; one thread each keeps Kùzu from competing with the
        # embedding and the other signals of the same recall for the two cores.
        self._conn.set_max_threads_for_exec(1)
        self._unwind_max = unwind_max_records
        for statement in _SCHEMA:
            self._conn.execute(statement)

    def _run(self, query: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        result = self._conn.execute(query, params or {})
        return result.get_all() if isinstance(result, kuzu.QueryResult) else []

    def _each(self, query: str, rows: list[dict[str, Any]], *, batched: bool) -> None:
        """Run a statement over rows of ``$a``/``$b`` parameters (inside the caller's transaction).

        Kùzu answers ``UNWIND $rows AS row MATCH (a:Record {id: row.a}), (b:Record {id: row.b})``
        with a scan of the node table per row: cheap on a small graph (the whole of a
        4-conversation ingest's edges in 1.5 s), ruinous on a large one (15 ms a row at 92k
        records, so the overlay fell ever further behind). One statement per row costs a
        steady ~0.5 ms. Below ``unwind_max_records`` records the batch wins (``batched``),
        above it the rows.
        """
        if not rows:
            return
        if batched:
            unwound = query.replace("$a", "row.a").replace("$b", "row.b")
            self._conn.execute("UNWIND $rows AS row " + unwound, {"rows": rows})
            return
        for row in rows:
            self._conn.execute(query, row)

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

    def add(self, records: list[GraphRecord], *, fresh: bool = False) -> None:
        """Insert records with their edges; re-adding a record is harmless.

        ``fresh`` promises the records and their edges are new (a first write), which lets
        them be created without the look-ups MERGE needs; repair and rebuild never pass it.
        """
        if not records:
            return
        put = "CREATE" if fresh else "MERGE"
        with self._transaction():
            # Counting nodes costs under a millisecond; it picks how the edges are written.
            batched = self._run("MATCH (r:Record) RETURN count(r)")[0][0] < self._unwind_max
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
            self._each(f"MATCH (r:Record {{id: $a}}), (s:Session {{id: $b}}) {put} (r)-[:IN_SESSION]->(s)",
                       [{"a": row["id"], "b": row["s"]} for row in sessions], batched=batched)  # fmt: skip
            self._each(f"MATCH (a:Record {{id: $a}}), (b:Record {{id: $b}}) {put} (a)-[:NEXT]->(b)",
                       [{"a": r.prev_id, "b": r.id} for r in records if r.prev_id], batched=batched)  # fmt: skip
            self._each(f"MATCH (a:Record {{id: $a}}), (b:Record {{id: $b}}) {put} (a)-[:DERIVED_FROM]->(b)",
                       [{"a": r.id, "b": src} for r in records for src in r.derived_from], batched=batched)  # fmt: skip
            entities = {(m.entity, r.user, m.etype) for r in records for m in r.mentions}
            if entities:
                self._run(
                    "UNWIND $rows AS row MERGE (e:Entity {id: row.id}) SET e.user = row.user, "
                    "e.etype = CASE WHEN row.etype = '' THEN e.etype ELSE row.etype END",
                    {"rows": [{"id": e, "user": u, "etype": t} for e, u, t in entities]},
                )
                mentions = [{"r": r.id, "e": m.entity, "role": m.role} for r in records for m in r.mentions]
                self._run(
                    "UNWIND $rows AS row MATCH (r:Record {id: row.r}), (e:Entity {id: row.e}) "
                    f"{put} (r)-[m:MENTIONS]->(e) SET m.role = row.role",
                    {"rows": mentions},
                )
            relations = [
                {"a": rel.source, "b": rel.target, "f": rel.fact, "s": rel.strength, "n": rel.negated}
                for r in records
                for rel in r.relations
            ]
            if relations:
                self._run(
                    "UNWIND $rows AS row MATCH (a:Entity {id: row.a}), (b:Entity {id: row.b}) "
                    "MERGE (a)-[x:RELATED {fact: row.f}]->(b) SET x.strength = row.s, x.negated = row.n",
                    {"rows": relations},
                )

    def close_relation(self, fact_id: str, valid_to: int | None) -> None:
        """Mark the edges a superseded fact created as no longer valid (None: valid again)."""
        self._run("MATCH ()-[x:RELATED {fact: $f}]->() SET x.valid_to = $t", {"f": fact_id, "t": valid_to})

    def delete(self, ids: list[str]) -> int:
        """Detach-delete records, then drop sessions and entities nothing points at any more."""
        if not ids:
            return 0
        with self._transaction():
            found = self._run("MATCH (r:Record) WHERE r.id IN $ids RETURN count(r)", {"ids": ids})[0][0]
            self._run("MATCH ()-[x:RELATED]->() WHERE x.fact IN $ids DELETE x", {"ids": ids})
            self._run("MATCH (r:Record) WHERE r.id IN $ids DETACH DELETE r", {"ids": ids})
            self._drop_orphans()
        return int(found)

    def _drop_orphans(self) -> None:
        self._run("MATCH (s:Session) WHERE NOT EXISTS { MATCH (:Record)-[:IN_SESSION]->(s) } DELETE s")
        self._run("MATCH (e:Entity) WHERE NOT EXISTS { MATCH (:Record)-[:MENTIONS]->(e) } DETACH DELETE e")

    def drop_user(self, user: str) -> int:
        """Delete everything of one user."""
        with self._transaction():
            found = self._run("MATCH (r:Record {user: $u}) RETURN count(r)", {"u": user})[0][0]
            self._run("MATCH (r:Record {user: $u}) DETACH DELETE r", {"u": user})
            self._run("MATCH (e:Entity {user: $u}) DETACH DELETE e", {"u": user})
            self._run("MATCH (s:Session {user: $u}) DETACH DELETE s", {"u": user})
        return int(found)

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file."""
        self._run("CHECKPOINT")

    def close(self) -> None:
        """Release the database (other processes may open it afterwards)."""
        self._conn.close()
        self._db.close()

    # -- reads -------------------------------------------------------------------------

    def ids(self, user: str) -> set[str]:
        """Every record id of a user in the graph."""
        return {row[0] for row in self._run("MATCH (r:Record {user: $u}) RETURN r.id", {"u": user})}

    def entity_records(
        self, user: str, entities: list[str], limit: int = 500, roles: list[str] | None = None
    ) -> list[tuple[str, str, str]]:
        """Records that mention (or are said by) any of the entities: (record, entity, role), newest first."""
        if not entities:
            return []
        role_filter = "AND m.role IN $roles " if roles else ""
        params: dict[str, Any] = {"es": entities, "u": user, "k": limit}
        if roles:
            params["roles"] = roles
        return [
            (row[0], row[1], row[2])
            for row in self._run(
                "MATCH (r:Record)-[m:MENTIONS]->(e:Entity) WHERE e.id IN $es AND e.user = $u "
                f"{role_filter}RETURN r.id, e.id, m.role ORDER BY r.seq DESC LIMIT $k",
                params,
            )
        ]

    def related_entities(
        self, user: str, entities: list[str], limit: int = 50
    ) -> list[tuple[str, str, float]]:
        """Entities one step away: through a valid RELATED edge, or mentioned by the same record.

        Returns (from entity, to entity, strength), strongest first.
        """
        if not entities:
            return []
        related = self._run(
            "MATCH (a:Entity)-[x:RELATED]-(b:Entity) WHERE a.id IN $es AND a.user = $u AND NOT x.negated "
            "AND (x.valid_to IS NULL) RETURN a.id, b.id, max(x.strength) AS s ORDER BY s DESC LIMIT $k",
            {"es": entities, "u": user, "k": limit},
        )
        co = self._run(
            "MATCH (a:Entity)<-[:MENTIONS]-(r:Record)-[m:MENTIONS]->(b:Entity) "
            "WHERE a.id IN $es AND a.user = $u AND m.role <> 'speaker' AND NOT b.id IN $es "
            "RETURN a.id, b.id, count(r) AS c ORDER BY c DESC LIMIT $k",
            {"es": entities, "u": user, "k": limit},
        )
        out: dict[tuple[str, str], float] = {}
        for a, b, s in related:
            out[(a, b)] = max(out.get((a, b), 0.0), float(s or 1.0))
        for a, b, c in co:
            out[(a, b)] = max(out.get((a, b), 0.0), min(1.0, 0.25 * float(c)))
        ranked = sorted(out.items(), key=lambda kv: -kv[1])[:limit]
        return [(a, b, s) for (a, b), s in ranked]

    def neighbours(self, ids: list[str]) -> dict[str, tuple[str, str]]:
        """For each record: (previous turn id, next turn id), '' where there is none."""
        if not ids:
            return {}
        out = {rid: ("", "") for rid in ids}
        for rid, prev in self._run(
            "MATCH (p:Record)-[:NEXT]->(r:Record) WHERE r.id IN $ids RETURN r.id, p.id", {"ids": ids}
        ):
            out[rid] = (prev, out[rid][1])
        for rid, nxt in self._run(
            "MATCH (r:Record)-[:NEXT]->(n:Record) WHERE r.id IN $ids RETURN r.id, n.id", {"ids": ids}
        ):
            out[rid] = (out[rid][0], nxt)
        return out

    def session_records(self, user: str, sessions: list[str], limit: int = 2_000) -> list[tuple[str, str]]:
        """Records of some sessions: (record id, session key) in conversation order."""
        if not sessions:
            return []
        return [
            (row[0], row[1])
            for row in self._run(
                "MATCH (r:Record)-[:IN_SESSION]->(s:Session) WHERE s.id IN $ss AND s.user = $u "
                "RETURN r.id, s.id ORDER BY r.seq LIMIT $k",
                {"ss": sessions, "u": user, "k": limit},
            )
        ]

    def derived_from(self, ids: list[str]) -> dict[str, list[str]]:
        """Derived records (facts, summaries) that cite any of ``ids``: source id -> derived ids."""
        if not ids:
            return {}
        out: dict[str, list[str]] = {}
        for derived, source in self._run(
            "MATCH (d:Record)-[:DERIVED_FROM]->(s:Record) WHERE s.id IN $ids RETURN d.id, s.id", {"ids": ids}
        ):
            out.setdefault(source, []).append(derived)
        return out


# -- the child process and its proxy ---------------------------------------------------

_REMOTE = frozenset({
    "add", "close_relation", "delete", "drop_user", "checkpoint", "close",
    "ids", "entity_records", "related_entities", "neighbours", "session_records", "derived_from",
})  # fmt: skip
_READS = frozenset({
    "ids", "entity_records", "related_entities", "neighbours", "session_records", "derived_from",
})  # fmt: skip
_FRAME = struct.Struct("!Q")


class GraphError(RuntimeError):
    """The graph's child process refused a request, failed to start or died."""


def _send(stream: BinaryIO, message: object) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    """The next message, or None when the other end closed the pipe."""
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(head)
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else None


def _failed(exc: Exception) -> tuple[bool, str]:
    return False, f"{type(exc).__name__}: {exc}"


def _result(reply: tuple[bool, Any]) -> Any:
    """A reply's result, or its failure raised."""
    ok, result = reply
    if not ok:
        raise GraphError(result)
    return result


def serve(path: str, buffer_pool_mb: int, unwind_max_records: int) -> None:
    """The child's loop (see ``_CHILD``): answer ``(method, args, kwargs)`` requests from stdin
    on stdout until told to close.

    Replies are ``(True, result)`` or ``(False, "exception type: message")``. The parent's
    end of the pipe closing (it exited, or was killed) closes the database too.
    """
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed by a library goes to stderr, not into the replies
    requests = sys.stdin.buffer
    try:
        graph = KuzuGraph(Path(path), buffer_pool_mb=buffer_pool_mb, unwind_max_records=unwind_max_records)
    except Exception as exc:
        _send(replies, _failed(exc))
        return
    _send(replies, (True, os.getpid()))
    while (request := _receive(requests)) is not None:
        name, args, kwargs = request
        try:
            if name not in _REMOTE:
                raise AttributeError(f"the graph has no request {name!r}")
            reply = (True, getattr(graph, name)(*args, **kwargs))
        except Exception as exc:
            reply = _failed(exc)
        _send(replies, reply)
        if name == "close":
            return
    graph.close()


# The child starts with SIGINT ignored before it imports anything (a Ctrl-C is the parent's
# to handle: it closes the child), takes no path entry from
# the working directory (-P), and finds this copy of mnemoplan even when it is not installed.
_CHILD = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; root = sys.argv[1]; "
    "root in sys.path or sys.path.insert(0, root); from mnemoplan.indexes.graph import serve; "
    "serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))"
)
# Only what Python and the dynamic loader need: the child's memory is what Kùzu leaks into
# its file, so it must not hold the parent's secrets (an API key) either.
_CHILD_ENV = ("PATH", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH",
              "SYSTEMROOT", "TMPDIR", "TEMP", "TMP", "HOME", "LANG", "LC_ALL", "LC_CTYPE")  # fmt: skip


class GraphIndex:
    """The graph overlay, served by a child process that holds the Kùzu database (see the module's doc).

    Calls are answered one at a time, in the order they arrive. If the child dies, the
    call under way raises ``GraphError`` (a read is first asked again of a new child) and
    the next one starts a new child, which opens the database where the last commit left it.

    Args:
        path: File of the Kùzu database.
        buffer_pool_mb: Kùzu's page cache (its default is most of the machine's RAM).
        unwind_max_records: Graph size up to which edges are written in one statement.
        open_wait_s: How long to wait for a database another process holds; the child of a
            server that was just killed lets go of it once it has finished its last request.
    """

    def __init__(
        self,
        path: Path,
        *,
        buffer_pool_mb: int = 1024,
        unwind_max_records: int | None = None,
        open_wait_s: float = 30.0,
    ) -> None:
        unwind = UNWIND_MAX_RECORDS if unwind_max_records is None else unwind_max_records
        self.path = path
        self._argv = [str(path), str(buffer_pool_mb), str(unwind)]
        self._open_wait_s = open_wait_s
        self._lock = threading.Lock()
        self._closed = False
        self._proc: subprocess.Popen[bytes] | None = None
        with self._lock:
            self._start()

    @property
    def pid(self) -> int | None:
        """The child process's id (None once closed)."""
        return self._proc.pid if self._proc is not None else None

    def peak_rss_mb(self) -> float | None:
        """The child's peak resident memory so far (Linux; None elsewhere or once closed)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text() if self.pid is not None else ""
        except OSError:
            return None
        line = next((ln for ln in status.splitlines() if ln.startswith("VmHWM:")), None)
        return int(line.split()[1]) / 1024 if line else None

    def _start(self) -> None:
        root = str(Path(__file__).resolve().parents[2])
        env = {k: v for k, v in os.environ.items() if k in _CHILD_ENV or k.startswith("LC_")}
        deadline = time.monotonic() + self._open_wait_s
        while True:
            argv = [sys.executable, "-P", "-c", _CHILD, root, *self._argv]
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            assert proc.stdin is not None and proc.stdout is not None
            try:
                ready = _receive(proc.stdout)
            except BaseException:
                _end(proc)
                raise
            if ready is not None and ready[0]:
                self._proc = proc
                return
            _end(proc)
            reason = ready[1] if ready else f"it exited with code {proc.returncode}"
            if ready is None or "could not set lock" not in reason.lower() or time.monotonic() >= deadline:
                raise GraphError(f"the graph database at {self.path} could not be opened ({reason})")
            log.info("the graph database is still held by another process; waiting for it")
            time.sleep(0.2)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            for attempt in (1, 2):
                if self._closed:
                    raise GraphError("the graph is closed")
                if self._proc is None or self._proc.poll() is not None:
                    if self._proc is not None:
                        log.warning("the graph process exited (code %s); starting it again",
                                    self._proc.returncode)  # fmt: skip
                        _end(self._proc)
                    self._proc = None
                    self._start()
                proc = self._proc
                assert proc is not None and proc.stdin is not None and proc.stdout is not None
                try:
                    _send(proc.stdin, (name, args, kwargs))
                    reply = _receive(proc.stdout)
                except OSError:  # the pipe broke: the child is gone
                    reply = None
                except BaseException:  # interrupted half way: the pipe is out of step, start afresh
                    self._proc = None
                    _end(proc)
                    raise
                if reply is not None:
                    break
                self._proc = None
                _end(proc)
                # A read is asked again of a new child; a write may have committed before the
                # child died, so its caller decides (the overlay writer repairs from the log).
                if name not in _READS or attempt == 2:
                    raise GraphError(f"the graph process died during {name} (code {proc.returncode})")
        return _result(reply)

    # -- writes ------------------------------------------------------------------------

    def add(self, records: list[GraphRecord], *, fresh: bool = False) -> None:
        """Insert records with their edges; re-adding a record is harmless (see ``KuzuGraph.add``)."""
        if records:
            self._call("add", records, fresh=fresh)

    def close_relation(self, fact_id: str, valid_to: int | None) -> None:
        """Mark the edges a superseded fact created as no longer valid (None: valid again)."""
        self._call("close_relation", fact_id, valid_to)

    def delete(self, ids: list[str]) -> int:
        """Detach-delete records, then drop sessions and entities nothing points at any more."""
        return self._call("delete", ids) if ids else 0

    def drop_user(self, user: str) -> int:
        """Delete everything of one user."""
        return self._call("drop_user", user)

    def rebuild(self, user: str, records: Iterable[GraphRecord], batch: int = 2_000) -> int:
        """Replace one user's graph with exactly ``records`` (in log order)."""
        self.drop_user(user)
        count = 0
        chunk: list[GraphRecord] = []
        for rec in records:
            chunk.append(rec)
            if len(chunk) >= batch:
                self.add(chunk)
                count += len(chunk)
                chunk = []
        self.add(chunk)
        return count + len(chunk)

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file."""
        self._call("checkpoint")

    def close(self) -> None:
        """Close the database and wait for the child to exit (other processes may open it afterwards)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            proc, self._proc = self._proc, None
            reply = self._close_child(proc)
        if reply is not None:
            _result(reply)

    def recreate(self) -> None:
        """Start again from an empty database file (its pages hold nothing of the old one)."""
        with self._lock:
            if self._closed:
                raise GraphError("the graph is closed")
            proc, self._proc = self._proc, None
            self._close_child(proc)
            for leftover in self.path.parent.glob(self.path.name + "*"):  # the file, its WAL, its shadow
                leftover.unlink()
            self._start()

    @staticmethod
    def _close_child(proc: subprocess.Popen[bytes] | None) -> Any:
        """Ask a child to close its database and wait for it to exit; its reply (None if it had died)."""
        if proc is None:
            return None
        reply = None
        if proc.poll() is None:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                _send(proc.stdin, ("close", (), {}))
                reply = _receive(proc.stdout)
            except OSError:
                pass
        _end(proc, grace_s=60)
        return reply

    # -- reads -------------------------------------------------------------------------

    def ids(self, user: str) -> set[str]:
        """Every record id of a user in the graph."""
        return self._call("ids", user)

    def entity_records(
        self, user: str, entities: list[str], limit: int = 500, roles: list[str] | None = None
    ) -> list[tuple[str, str, str]]:
        """Records that mention (or are said by) any of the entities: (record, entity, role), newest first."""
        return self._call("entity_records", user, entities, limit, roles) if entities else []

    def related_entities(
        self, user: str, entities: list[str], limit: int = 50
    ) -> list[tuple[str, str, float]]:
        """Entities one step away, strongest first: (from entity, to entity, strength)."""
        return self._call("related_entities", user, entities, limit) if entities else []

    def neighbours(self, ids: list[str]) -> dict[str, tuple[str, str]]:
        """For each record: (previous turn id, next turn id), '' where there is none."""
        return self._call("neighbours", ids) if ids else {}

    def session_records(self, user: str, sessions: list[str], limit: int = 2_000) -> list[tuple[str, str]]:
        """Records of some sessions: (record id, session key) in conversation order."""
        return self._call("session_records", user, sessions, limit) if sessions else []

    def derived_from(self, ids: list[str]) -> dict[str, list[str]]:
        """Derived records (facts, summaries) that cite any of ``ids``: source id -> derived ids."""
        return self._call("derived_from", ids) if ids else {}


def _end(proc: subprocess.Popen[bytes], grace_s: float = 0.0) -> None:
    """Close a child's pipes and reap it: it exits on its own within ``grace_s``, or is killed."""
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
