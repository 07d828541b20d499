"""The write path of ``remember``: validate, de-duplicate, extract, embed, store.

Deterministic extraction runs inline (names, resolved time expressions); it is cheap.
The raw text is always stored verbatim: extraction only adds to it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from mnemoplan.extract.names import mentions_for
from mnemoplan.extract.sentences import split_sentences
from mnemoplan.extract.times import event_span, find_times
from mnemoplan.indexes.store import MemoryStore
from mnemoplan.model import Record

IMPORTANCE = {"message": 0.5, "fact": 0.7, "procedure": 0.7, "episode": 0.6}


@dataclass
class NewMemory:
    """One validated input of remember."""

    text: str
    kind: str = "message"
    speaker: str = ""
    occurred_at: datetime | None = None
    source_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    derived_from: list[str] = field(default_factory=list)


@dataclass
class IngestResult:
    """What an ingest call stored."""

    ids: list[str]
    stored: list[Record]
    duplicates: int


def content_hash(user_id: str, project_id: str, session_id: str, mem: NewMemory) -> str:
    """The identity of a memory's content: a repeat with the same hash is not stored again."""
    when = mem.occurred_at.isoformat() if mem.occurred_at else ""
    parts = [user_id, project_id, session_id, mem.kind, mem.speaker, mem.text, when]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


class Ingestor:
    """Turns validated inputs into stored records.

    Args:
        store: The memory store.
        embed: Embeds a batch of texts.
    """

    def __init__(self, store: MemoryStore, embed: Callable[[list[str]], np.ndarray]) -> None:
        self.store = store
        self.embed = embed

    def embed_records(self, records: list[Record]) -> np.ndarray:
        """One vector per record: the normalised mean of its sentences' embeddings."""
        texts: list[str] = []
        owner: list[int] = []
        for i, rec in enumerate(records):
            prefix = f"{rec.speaker}: " if rec.speaker else ""
            for sentence in split_sentences(rec.text):
                texts.append(prefix + sentence)
                owner.append(i)
        vectors = self.embed(texts)
        sums = np.zeros((len(records), vectors.shape[1]), dtype=np.float32)
        np.add.at(sums, np.asarray(owner), vectors)
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return sums / norms

    def ingest(
        self, user_id: str, memories: list[NewMemory], *, session_id: str = "", project_id: str = ""
    ) -> IngestResult:
        """Store new memories of one user (in order), skipping repeats."""
        now = datetime.now(UTC)
        hashes = [content_hash(user_id, project_id, session_id, m) for m in memories]
        sources = [m.source_id for m in memories if m.source_id]
        existing = self.store.existing(user_id, session_id, hashes, sources)
        known = list(self.store.catalog(user_id).entities)
        ids: list[str] = []
        fresh: list[Record] = []
        duplicates = 0
        for mem, digest in zip(memories, hashes, strict=True):
            prior = existing.get(digest) or (existing.get(f"src:{mem.source_id}") if mem.source_id else None)
            if prior:
                ids.append(prior)
                duplicates += 1
                continue
            when = mem.occurred_at or now
            times = find_times(mem.text, when)
            start, end = event_span(times)
            rec = Record(
                id=uuid.uuid4().hex,
                user_id=user_id,
                project_id=project_id,
                session_id=session_id,
                kind=mem.kind,  # type: ignore[arg-type]
                speaker=mem.speaker,
                text=mem.text,
                occurred_at=when,
                created_at=now,
                source_id=mem.source_id,
                content_hash=digest,
                derived_from=mem.derived_from,
                metadata=mem.metadata,
                importance=IMPORTANCE.get(mem.kind, 0.5),
                entities=mentions_for(mem.text, mem.speaker, known),
                event_start=start,
                event_end=end,
            )
            existing[digest] = rec.id
            if mem.source_id:
                existing[f"src:{mem.source_id}"] = rec.id
            ids.append(rec.id)
            fresh.append(rec)
        if not fresh:
            return IngestResult(ids, [], duplicates)
        stored = self.store.append(fresh, self.embed_records(fresh))
        return IngestResult(ids, stored, duplicates)
