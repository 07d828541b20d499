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
from datetime import UTC
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mnemoplan.storage.bm25 import BM25Doc
from mnemoplan.storage.graph.client import GraphMention, GraphRecord, GraphRelation
from mnemoplan.model import DocRecord, Record
from mnemoplan.model.records import spoken


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


def graph_records(data: pa.Table, keys: KeyHasher) -> Iterator[GraphRecord]:
    """``graph_record`` of each row of a table of the log (``OVERLAY_COLUMNS`` at least), read
    column by column: a replica's first touch of a user of 100k records spent more time building
    a ``Record`` for each (~70 us) than reading them from object storage."""
    micros = pc.fill_null(data.column("occurred_at").cast(pa.int64()), 0).to_numpy()
    seconds = (micros / 1e6).astype(np.int64)  # as ``datetime.timestamp`` truncated
    names = ("id", "kind", "seq", "session_id", "prev_id", "derived_from")
    columns = [data.column(c).to_pylist() for c in names]
    entities = data.column("entities").to_pylist()
    metadata = data.column("metadata").to_pylist()
    hashed: dict[tuple[str, str], str] = {}  # a user's names recur: each hashed once (~2 us each)

    def key(namespace: str, value: str) -> str:
        found = hashed.get((namespace, value))
        if found is None:
            found = hashed[namespace, value] = keys(namespace, value)
        return found

    user = keys.user
    for i, (rid, kind, seq, session, prev, derived) in enumerate(zip(*columns, strict=True)):
        named = [(m["key"], m["type"], m["role"]) for m in entities[i] or ()]
        meta = lambda i=i: json.loads(metadata[i] or "{}")  # noqa: E731
        yield _graph_node(rid, kind, seq or 0, int(seconds[i]), session or "", prev or "", derived or (),
                          named, meta, key, user)  # fmt: skip


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
