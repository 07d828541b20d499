"""Graph overlay in Kùzu: records, sessions, entities and their edges, served by a child process.

The graph holds topology, never content. Kùzu does not zero the pages it frees, so
anything written here could outlive a ``forget``; callers therefore pass opaque keys
(random record ids, and keyed hashes of user, session and entity names that the store
computes with a per-user secret destroyed when the user is forgotten).

Kùzu also writes memory it never initialised into its file: the unused tail of the
pages a checkpoint writes its metadata to comes straight from ``malloc``, so whatever
the process freed there before (a message, a forgotten one included) could land on
disk. The database therefore lives in a child process of its own (``GraphIndex``
starts it, ``kuzu_graph.KuzuGraph`` is what runs there) whose memory only ever holds
those opaque keys: requests and replies cross a pipe, and the child never sees a word of
content. This process never imports Kùzu.

Nodes: Record(id, user, kind, seq, ts), Session(id, user), Entity(id, user, etype).
Edges: IN_SESSION(Record->Session), NEXT(Record->Record, the following turn),
MENTIONS(Record->Entity, role), DERIVED_FROM(Record->Record),
RELATED(Entity->Entity, fact, strength, negated, valid_to).
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import select
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from mnemoplan.storage.graph.bulk import RECORDS_BATCH, RebuildBatch, RebuildSource, batches
from mnemoplan.storage.graph.records import GraphMention, GraphRecord, GraphRelation  # noqa: F401 (theirs to import from here)
from mnemoplan.storage.locks import ReadsFirst

log = logging.getLogger(__name__)

UNWIND_MAX_RECORDS = 20_000  # see kuzu_graph.KuzuGraph._each
COPY_MIN_EDGES = 256  # edges of one kind in one rebuild write from which they are copied (KuzuGraph._copy)
EXIT_COPY_FAILED = 75  # the child's exit code when a copy failed (KuzuGraph._copy)
CLOSE_WAIT_S = 60.0  # for the child to close its database (a checkpoint) and exit


# -- the pipe between this process and the graph's ---------------------------------------

REMOTE = frozenset({
    "add", "add_tables", "close_relation", "delete", "drop_user", "checkpoint", "close",
    "ids", "entity_records", "related_entities", "neighbours", "session_records", "derived_from",
})  # fmt: skip
_READS = frozenset({
    "ids", "entity_records", "related_entities", "neighbours", "session_records", "derived_from",
})  # fmt: skip
_FRAME = struct.Struct("!Q")


class GraphError(RuntimeError):
    """The graph's child process refused a request, failed to start or died."""


class GraphUnreadable(GraphError):
    """Kùzu could not open the database file (damaged, say, or written by another version of it)."""


class GraphCopyFailed(GraphError):
    """A rebuild's bulk copy of edges failed, which ended the graph's process (``KuzuGraph._copy``)."""


def send(stream: BinaryIO, message: object) -> None:
    """Write one length-prefixed message."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_FRAME.pack(len(data)) + data)
    stream.flush()


def receive(stream: BinaryIO) -> Any:
    """The next message, or None when the other end closed the pipe."""
    head = stream.read(_FRAME.size)
    if len(head) < _FRAME.size:
        return None
    (size,) = _FRAME.unpack(head)
    data = stream.read(size)
    return pickle.loads(data) if len(data) == size else None


def failed(exc: Exception) -> tuple[bool, str]:
    """The reply that reports a request's failure."""
    return False, f"{type(exc).__name__}: {exc}"


def _result(reply: tuple[bool, Any]) -> Any:
    """A reply's result, or its failure raised."""
    ok, result = reply
    if not ok:
        raise GraphError(result)
    return result


# The child starts with SIGINT ignored before it imports anything (a Ctrl-C is the parent's
# to handle: it closes the child), takes no path entry from
# the working directory (-P), and finds this copy of mnemoplan even when it is not installed.
_CHILD = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; root = sys.argv[1]; "
    "root in sys.path or sys.path.insert(0, root); from mnemoplan.storage.graph.kuzu_child import serve; "
    "serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), *(sys.argv[5:6] == ['ro'],))"
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
        read_timeout_s: How long a read may take (they take milliseconds) before the child is
            taken for hung, stopped, and the read fails. Writes may legitimately take long
            (a rebuild) and have no limit.
        fresh: Delete the database's files first and start from an empty graph.
        read_only: Open the database to read only (a data directory that cannot be written); a
            write then fails in the child, and ``checkpoint`` does nothing.
    """

    def __init__(
        self,
        path: Path,
        *,
        buffer_pool_mb: int = 1024,
        unwind_max_records: int | None = None,
        open_wait_s: float = 30.0,
        read_timeout_s: float = 30.0,
        fresh: bool = False,
        read_only: bool = False,
    ) -> None:
        unwind = UNWIND_MAX_RECORDS if unwind_max_records is None else unwind_max_records
        self.path = path
        self.read_only = read_only
        self._argv = [str(path), str(buffer_pool_mb), str(unwind), *(["ro"] if read_only else [])]
        self._open_wait_s = open_wait_s
        self._read_timeout_s = read_timeout_s
        self._lock = ReadsFirst()
        self._closed = False
        self._proc: subprocess.Popen[bytes] | None = None
        with self._lock.hold():
            if fresh:
                self._remove_files()
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
                ready = receive(proc.stdout)
            except BaseException:
                _end(proc)
                raise
            if ready is not None and ready[0]:
                self._proc = proc
                return
            _end(proc)
            reason = ready[1] if ready else f"it exited with code {proc.returncode}"
            failure = f"the graph database at {self.path} could not be opened ({reason})"
            if ready is None:  # the child failed before it tried (no Kùzu, say)
                raise GraphError(failure)
            if "could not set lock" not in reason.lower():
                raise GraphUnreadable(failure)
            if time.monotonic() >= deadline:
                raise GraphError(failure)
            log.info("the graph database is still held by another process; waiting for it")
            time.sleep(0.2)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock.hold(read=name in _READS):
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
                hung = False
                try:
                    send(proc.stdin, (name, args, kwargs))
                    if name in _READS and not _answers(proc.stdout, self._read_timeout_s):
                        hung, reply = True, None
                    else:
                        reply = receive(proc.stdout)
                except OSError:  # the pipe broke: the child is gone
                    reply = None
                except BaseException:  # interrupted half way: the pipe is out of step, start afresh
                    self._proc = None
                    _end(proc)
                    raise
                if reply is not None:
                    break
                self._proc = None
                _end(proc)  # a hung child is killed: the next call starts a new one
                if hung:
                    raise GraphError(f"the graph process did not answer {name} within "
                                     f"{self._read_timeout_s:g} s and was stopped")  # fmt: skip
                # A read is asked again of a new child; a write may have committed before the
                # child died, so its caller decides (the overlay writer repairs from the log).
                if proc.returncode == EXIT_COPY_FAILED:
                    raise GraphCopyFailed(f"the graph process ended during {name}: a bulk copy failed")
                if name not in _READS or attempt == 2:
                    raise GraphError(f"the graph process died during {name} (code {proc.returncode})")
        return _result(reply)

    # -- writes ------------------------------------------------------------------------

    def add(self, records: list[GraphRecord], *, fresh: bool = False, bulk: bool = False) -> None:
        """Insert records with their edges; re-adding a record is harmless (see ``KuzuGraph.add``)."""
        if records:
            self._call("add", records, fresh=fresh, bulk=bulk)

    def close_relation(self, fact_id: str, valid_to: int | None) -> None:
        """Mark the edges a superseded fact created as no longer valid (None: valid again)."""
        self._call("close_relation", fact_id, valid_to)

    def delete(self, ids: list[str]) -> int:
        """Detach-delete records, then drop sessions and entities nothing points at any more."""
        return self._call("delete", ids) if ids else 0

    def drop_user(self, user: str) -> int:
        """Delete everything of one user."""
        return self._call("drop_user", user)

    def rebuild(self, user: str, records: Iterable[GraphRecord] | RebuildSource, batch: int | None = None, *,
                dropped: bool = False) -> int:  # fmt: skip
        """Replace one user's graph with exactly ``records`` (in log order, each once), given one
        by one or in columns (``bulk.RebuildSource``: sent as Arrow tables, see ``bulk``).

        The user's nodes are gone before the first is written, so each is created without
        the look-ups MERGE needs (``fresh``): on a graph of 500k records, MERGE per edge made
        rebuilding it an hour's work; large batches of edges are copied in bulk (``bulk``, see
        ``KuzuGraph._copy``). Should a copy fail (it ends the graph's process), that batch is
        written again with MERGE and the rest an edge at a time. Each batch commits on its own
        (its nodes, then each kind of copied edges; ``batch`` records, by default as many as
        ``bulk.COLUMNS_BATCH`` or ``bulk.RECORDS_BATCH`` say): a rebuild that fails otherwise
        leaves the user part-written until it is done again (a replica rebuilds the user at its
        next call, a journaled rebuild at the next start).
        ``dropped``: the graph holds nothing of the user (a graph just recreated), so the
        drop, a checkpoint and scans of the node tables, is skipped."""
        if not dropped:
            self.drop_user(user)
        count, bulk = 0, True
        for part in batches(records, batch):
            bulk = self._add_rebuilt(part, bulk)
            count += part.size
        return count

    def _add_rebuilt(self, part: RebuildBatch, bulk: bool) -> bool:
        """Write one batch of a rebuild; returns whether the next may be copied in bulk."""
        if not bulk:
            self._add_in_parts(part.records(), fresh=True)
            return False
        try:
            tables = part.tables()
            if tables is None:
                self.add(part.records(), fresh=True, bulk=True)
            elif tables.records.num_rows:
                self._call("add_tables", tables)
            return True
        except GraphCopyFailed:
            # Its nodes, and edges of other kinds, may have committed: merged, not created again,
            # in batches records one by one are written in (a large one held the graph's memory).
            log.warning("copying a rebuild's edges into the graph failed; the rest goes an edge at a time")
            self._add_in_parts(part.records(), fresh=False)
            return False

    def _add_in_parts(self, records: list[GraphRecord], *, fresh: bool) -> None:
        for start in range(0, len(records), RECORDS_BATCH):
            self.add(records[start : start + RECORDS_BATCH], fresh=fresh)

    def checkpoint(self) -> None:
        """Fold the write-ahead log into the database file."""
        if not self.read_only:  # nothing was written, and nothing may be
            self._call("checkpoint")

    def close(self) -> None:
        """Close the database and wait for the child to exit (other processes may open it afterwards)."""
        with self._lock.hold():
            if self._closed:
                return
            self._closed = True
            proc, self._proc = self._proc, None
            reply = self._close_child(proc)
        if reply is not None:
            _result(reply)

    def recreate(self) -> None:
        """Start again from an empty database file (its pages hold nothing of the old one)."""
        with self._lock.hold():
            if self._closed:
                raise GraphError("the graph is closed")
            proc, self._proc = self._proc, None
            self._close_child(proc)
            self._remove_files()
            self._start()

    def _remove_files(self) -> None:
        for leftover in _database_files(self.path):
            leftover.unlink(missing_ok=True)

    @classmethod
    def opens_afresh(cls, path: Path, buffer_pool_mb: int) -> bool:
        """Whether Kùzu opens a new, empty database beside ``path`` with the same settings. If
        not, what kept ``path`` from opening is the machine's (memory, permissions), not the file's."""
        probe = path.with_name(f"{path.name}.probe-{os.getpid()}")
        try:
            cls(probe, buffer_pool_mb=buffer_pool_mb, open_wait_s=0).close()
            return True
        except (GraphError, OSError):
            return False
        finally:
            for leftover in _database_files(probe):
                leftover.unlink(missing_ok=True)

    @staticmethod
    def _close_child(proc: subprocess.Popen[bytes] | None) -> Any:
        """Ask a child to close its database and wait for it to exit; its reply (None if it had died)."""
        if proc is None:
            return None
        reply = None
        try:
            if proc.poll() is None:
                assert proc.stdin is not None and proc.stdout is not None
                try:
                    send(proc.stdin, ("close", (), {}))
                    if _answers(proc.stdout, CLOSE_WAIT_S):
                        reply = receive(proc.stdout)
                    else:
                        log.warning("the graph process did not close its database within %g s; "
                                    "stopping it (its write-ahead log keeps what it committed)",
                                    CLOSE_WAIT_S)  # fmt: skip
                except OSError:
                    pass
            _end(proc, grace_s=CLOSE_WAIT_S if reply is not None else 0)
        except BaseException:  # interrupted (Ctrl-C): stop it rather than leave it holding the database
            _end(proc)
            raise
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


def _database_files(path: Path) -> list[Path]:
    """The files Kùzu keeps a database in: the file, its write-ahead log, shadow and temporary files."""
    return [path, *(path.with_name(f"{path.name}.{suffix}") for suffix in ("wal", "shadow", "tmp"))]


def _answers(stream: BinaryIO, timeout_s: float) -> bool:
    """Whether the child starts a reply (or closes the pipe) within ``timeout_s``. The reader's
    buffer is empty between replies (one reply a request, each read whole), so the pipe shows it."""
    poller = select.poll()  # not select.select: it fails on descriptors numbered 1024 and up
    poller.register(stream.fileno(), select.POLLIN)
    return bool(poller.poll(math.ceil(timeout_s * 1000)))


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
