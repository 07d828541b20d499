"""How a record is represented in each overlay: its BM25 text, its search vector, its graph node.

A conversational turn rarely stands alone ("Yes, last Friday!" answers the turn
before it), so a message is indexed together with the previous turn of its session:
its BM25 text includes that turn's words, and its search vector leans towards that
turn's embedding. The BM25 text is derived from the log alone, so rebuilds reproduce it;
the search vector is stored in the log when the record is written.

A long turn (an assistant's reply, most often) carries its own context, and would
otherwise be found by the words of the short turn before it: over
``model.records.STANDALONE_WORDS`` words, a message is indexed alone; and a short turn
after it is indexed with its end only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mnemoplan.storage.bm25 import BM25Doc
from mnemoplan.storage.graph.bulk import GraphTables, RebuildBatch
from mnemoplan.storage.graph.bulk import schemas as bulk_schemas
from mnemoplan.storage.graph.client import GraphMention, GraphRecord, GraphRelation
from mnemoplan.model import DocRecord, Record
from mnemoplan.model.records import spoken
from mnemoplan.storage.log.schema import GRAPH_COLUMNS


def in_context(rec: Record | DocRecord) -> bool:
    """Whether a record is indexed with the turn before it: a message, not a long one."""
    return rec.kind == "message" and not rec.alone


TAIL_WORDS, TAIL_CHARS = 30, 200  # of a long turn, the end a short reply after it answers


def context_text(prev: Record | DocRecord) -> str:
    """What of the turn before a message its BM25 text takes: all of a short turn; of a long
    one, the end, where the question a "Yes." answers sits (not all of a 150-word reply)."""
    if not prev.alone:
        return spoken(prev)
    tail = " ".join(prev.text.split()[-TAIL_WORDS:])[-TAIL_CHARS:]
    return f"{prev.speaker}: {tail}" if prev.speaker else tail


def leans_on(rec: Record | DocRecord, prev: Record | DocRecord | None) -> bool:
    """Whether a message's vector leans towards the previous turn's: both short (a long turn's
    embedding is about the whole of it, not the end a short reply answers)."""
    return prev is not None and in_context(rec) and not prev.alone


def bm25_doc(rec: Record | DocRecord, prev: Record | DocRecord | None) -> BM25Doc:
    """The BM25 document of a record, with its conversational context."""
    body = spoken(rec)
    if prev is not None and in_context(rec):
        body = f"{context_text(prev)}\n{body}"
    return BM25Doc(
        id=rec.id,
        user_id=rec.user_id,
        body=body,
        kind=rec.kind,
        session_id=rec.session_id,
        project_id=rec.project_id,
    )


def context_vector(embedding: np.ndarray, prev_embedding: np.ndarray | None, weight: float) -> np.ndarray:
    """The search vector: the record's embedding, leaning towards the previous turn's."""
    if prev_embedding is None or weight <= 0:
        return np.asarray(embedding, dtype=np.float32)
    mixed = np.asarray(embedding, dtype=np.float32) + weight * np.asarray(prev_embedding, dtype=np.float32)
    norm = float(np.linalg.norm(mixed))
    return (mixed / norm).astype(np.float32) if norm else mixed.astype(np.float32)


class KeyHasher:
    """Keyed hashes of one user's names, for the content-free graph."""

    def __init__(self, salt: bytes) -> None:
        self._salt = salt

    def __call__(self, namespace: str, value: str) -> str:
        digest = hashlib.blake2b(f"{namespace}\x1f{value}".encode(), key=self._salt, digest_size=16)
        return digest.hexdigest()

    @property
    def user(self) -> str:
        """The user's own key."""
        return self("user", "")


class SaltSource(Protocol):
    """Where users' salts are kept (the log)."""

    def user_salt(self, user_id: str, *, create: bool = True) -> bytes | None:
        """The user's salt (made now when ``create`` is set and the user has none; else None)."""
        ...


def user_keys(salts: SaltSource, user_id: str, *, create: bool = True) -> KeyHasher | None:
    """The keyed hasher of a user's graph names (None if the user has no salt and ``create`` is not set)."""
    salt = salts.user_salt(user_id, create=create)
    return KeyHasher(salt) if salt is not None else None


def graph_record(rec: Record, keys: KeyHasher) -> GraphRecord:
    """The graph node of a record and its edges, with every name replaced by a keyed hash."""
    entities = [(m.key, m.type, m.role) for m in rec.entities]
    ts = int(rec.occurred_at.astimezone(UTC).timestamp())
    return _graph_node(rec.id, rec.kind, rec.seq, ts, rec.session_id, rec.prev_id, rec.derived_from, entities,
                       lambda: rec.metadata, keys, keys.user)  # fmt: skip


class GraphRows:
    """A user's rows of the log (``OVERLAY_COLUMNS``, in write order) as what a rebuild of their
    graph reads (``bulk.RebuildSource``): each batch in columns, or a ``GraphRecord`` a row."""

    def __init__(self, data: pa.Table, keys: KeyHasher) -> None:
        self._data, self._keys = data.select(GRAPH_COLUMNS), _Hashed(keys)

    def batches(self, size: int) -> Iterator[RebuildBatch]:
        for start in range(0, self._data.num_rows, size):
            # Taken, not sliced: a slice pickles its columns' whole buffers (every batch the whole user's).
            rows = np.arange(start, min(start + size, self._data.num_rows))
            yield _RowsBatch(self._data.take(rows) if size < self._data.num_rows else self._data, self._keys)


class _Hashed:
    """A user's ``KeyHasher``, each name hashed once (a user's names recur)."""

    def __init__(self, keys: KeyHasher) -> None:
        self.keys, self.user, self._held = keys, keys.user, dict[tuple[str, str], str]()

    def __call__(self, namespace: str, value: str) -> str:
        found = self._held.get((namespace, value))
        if found is None:
            found = self._held[namespace, value] = self.keys(namespace, value)
        return found


@dataclass(frozen=True)
class _RowsBatch:
    data: pa.Table
    keys: _Hashed

    @property
    def size(self) -> int:
        return self.data.num_rows

    def tables(self) -> GraphTables:
        return graph_tables(self.data, self.keys)

    def records(self) -> list[GraphRecord]:
        return list(graph_records(self.data, self.keys))


def graph_tables(data: pa.Table, keys: KeyHasher | _Hashed) -> GraphTables:
    """The ``graph_record`` of each row in columns (``bulk.GraphTables``), built from the columns
    with pyarrow (each distinct name hashed once): a user of 100k records in 0.1-0.2 s, where a
    ``GraphRecord`` each took 2.3-3.2 s."""
    keys = keys if isinstance(keys, _Hashed) else _Hashed(keys)
    data = data.select(GRAPH_COLUMNS).combine_chunks()  # parent indices are a chunk's own
    n, user, schemas = data.num_rows, keys.user, bulk_schemas()
    ids = data.column("id")
    users = pa.array([user] * n, pa.string())
    records = pa.table([ids, users, data.column("kind"), pc.fill_null(data.column("seq"), 0).cast(pa.int64()),
                        pa.array(_seconds(data))], schema=schemas["records"])  # fmt: skip

    def hashed(namespace: str, values: pa.Array | pa.ChunkedArray) -> pa.Array:
        distinct = pc.unique(values)
        names = pa.array([keys(namespace, v) for v in distinct.to_pylist()], pa.string())
        return pc.take(names, pc.index_in(values, value_set=distinct))

    session_ids = pc.fill_null(data.column("session_id"), "")
    in_session = pc.not_equal(session_ids, "")
    sessions = hashed("session", pc.filter(session_ids, in_session))
    distinct_sessions = pc.unique(sessions)
    prev = pc.fill_null(data.column("prev_id"), "")
    follows = pc.not_equal(prev, "")
    derived = data.column("derived_from")
    mentions = pc.list_flatten(data.column("entities"))
    mentioning = ids.take(pc.list_parent_indices(data.column("entities")))
    entity_keys = hashed("entity", pc.struct_field(mentions, "key"))
    etypes = pc.fill_null(pc.struct_field(mentions, "type"), "").to_pylist()
    roles = pc.fill_null(pc.struct_field(mentions, "role"), "mention")
    entities: dict[str, str] = {}  # the last type a mention gives, else the one before
    for entity, etype in zip(entity_keys.to_pylist(), etypes, strict=True):
        entities[entity] = etype or entities.get(entity, "")
    edges = {
        "IN_SESSION": pa.table([pc.filter(ids, in_session), sessions], schema=schemas["edges"]),
        "NEXT": pa.table([pc.filter(prev, follows), pc.filter(ids, follows)], schema=schemas["edges"]),
        "DERIVED_FROM": pa.table([ids.take(pc.list_parent_indices(derived)), pc.list_flatten(derived)],
                                 schema=schemas["edges"]),  # fmt: skip
        "MENTIONS": pa.table([mentioning, entity_keys, roles], schema=schemas["MENTIONS"]),
    }
    # A fact relates its subjects to its objects: its relations are made from its row, as one by one.
    relating = pc.list_parent_indices(data.column("entities")).filter(pc.equal(roles, "subject")).to_pylist()
    facts = data.take(pa.array(sorted(set(relating)), pa.int64()))
    return GraphTables(
        records=records,
        sessions=pa.table([distinct_sessions, pa.array([user] * len(distinct_sessions), pa.string())],
                          schema=schemas["sessions"]),  # fmt: skip
        entities=pa.table([pa.array(list(entities), pa.string()), pa.array([user] * len(entities), pa.string()),
                           pa.array(list(entities.values()), pa.string())], schema=schemas["entities"]),  # fmt: skip
        edges=edges,
        relations=tuple(rel for node in graph_records(facts, keys) for rel in node.relations),
    )


def graph_records(data: pa.Table, keys: KeyHasher | _Hashed) -> Iterator[GraphRecord]:
    """``graph_record`` of each row of a table of the log (``GRAPH_COLUMNS`` at least), read
    column by column: a replica's first touch of a user of 100k records spent more time building
    a ``Record`` for each (~70 us) than reading them from object storage."""
    seconds = _seconds(data)
    names = ("id", "kind", "seq", "session_id", "prev_id", "derived_from")
    columns = [data.column(c).to_pylist() for c in names]
    entities = data.column("entities").to_pylist()
    metadata = data.column("metadata").to_pylist()
    key = keys if isinstance(keys, _Hashed) else _Hashed(keys)
    user = key.user
    for i, (rid, kind, seq, session, prev, derived) in enumerate(zip(*columns, strict=True)):
        named = [(m["key"], m["type"] or "", m["role"] or "mention") for m in entities[i] or ()]
        meta = lambda i=i: json.loads(metadata[i] or "{}")  # noqa: E731
        yield _graph_node(rid, kind, seq or 0, int(seconds[i]), session or "", prev or "", derived or (),
                          named, meta, key, user)  # fmt: skip


def _seconds(data: pa.Table) -> np.ndarray:
    """``occurred_at`` of each row in whole seconds, truncated as ``int(datetime.timestamp())``."""
    micros = pc.fill_null(data.column("occurred_at").cast(pa.int64()), 0).to_numpy()
    return (micros / 1e6).astype(np.int64)


def _graph_node(
    rid: str, kind: str, seq: int, ts: int, session: str, prev_id: str, derived: Iterable[str],
    entities: list[tuple[str, str, str]], metadata: Callable[[], Any], keys: Callable[[str, str], str], user: str,
) -> GraphRecord:  # fmt: skip
    """A record's graph node from its fields; ``metadata`` is read only for a fact's edges."""
    mentions = tuple(GraphMention(entity=keys("entity", key), etype=etype, role=role)
                     for key, etype, role in entities)  # fmt: skip
    subjects = [key for key, _, role in entities if role == "subject"]
    objects = [key for key, _, role in entities if role == "object"]
    meta = metadata() if subjects and objects else {}
    strength = float(meta.get("confidence", 1.0)) if isinstance(meta, dict) else 1.0
    negated = bool(meta.get("negated", False)) if isinstance(meta, dict) else False
    relations = tuple(
        GraphRelation(source=keys("entity", s), target=keys("entity", o), fact=rid, strength=strength,
                      negated=negated)
        for s in subjects
        for o in objects
        if s != o
    )
    session_key = keys("session", session) if session else ""
    return GraphRecord(id=rid, user=user, kind=kind, seq=seq, ts=ts, session=session_key,
                       prev_id=prev_id, derived_from=tuple(derived), mentions=mentions,
                       relations=relations)  # fmt: skip
