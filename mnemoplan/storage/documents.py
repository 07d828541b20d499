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
from datetime import UTC
from typing import Protocol

import numpy as np

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


def leans_on(rec: Record, prev: Record | None) -> bool:
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
    mentions = tuple(
        GraphMention(entity=keys("entity", m.key), etype=m.type, role=m.role) for m in rec.entities
    )
    subjects = [m for m in rec.entities if m.role == "subject"]
    objects = [m for m in rec.entities if m.role == "object"]
    relations = tuple(
        GraphRelation(
            source=keys("entity", s.key),
            target=keys("entity", o.key),
            fact=rec.id,
            strength=float(rec.metadata.get("confidence", 1.0)) if isinstance(rec.metadata, dict) else 1.0,
            negated=bool(rec.metadata.get("negated", False)) if isinstance(rec.metadata, dict) else False,
        )
        for s in subjects
        for o in objects
        if s.key != o.key
    )
    return GraphRecord(
        id=rec.id,
        user=keys.user,
        kind=rec.kind,
        seq=rec.seq,
        ts=int(rec.occurred_at.astimezone(UTC).timestamp()),
        session=keys("session", rec.session_id) if rec.session_id else "",
        prev_id=rec.prev_id,
        derived_from=tuple(rec.derived_from),
        mentions=mentions,
        relations=relations,
    )
