"""Episodes: a session's running summaries, made as its messages arrive, and their vectors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from mnemoplan.extract.summary import SentenceCache, SessionTurn, summarize_session
from mnemoplan.ingest.derive import episode_record
from mnemoplan.model import Record

if TYPE_CHECKING:
    from mnemoplan.storage.store import MemoryStore


def episode_vector(store: MemoryStore, episode: Record, fresh: list[Record], fresh_vectors: np.ndarray) -> np.ndarray:
    """An episode's vector: the mean of its messages' vectors (no model call for a long summary)."""
    known = {r.id: v for r, v in zip(fresh, fresh_vectors, strict=True)}
    older = [rid for rid in episode.derived_from if rid not in known]
    if older:
        known.update(store.log.vectors(episode.user_id, older))
    stack = np.stack([known[rid] for rid in episode.derived_from if rid in known])
    mean = stack.mean(axis=0)
    return (mean / (np.linalg.norm(mean) or 1.0)).astype(np.float32)


def episodes_due(
store: MemoryStore, every: int, span: int, sentences: SentenceCache | None, user_id: str, session_id: str,
fresh: list[Record],
) -> tuple[list[Record], list[str]]:
    """New summaries of the session once it has ``every`` messages the last one lacks,
    each of a stretch of at most ``span`` messages (``UserLedger.to_summarise``).

    Returns the episode records and the ids of the summaries they replace.
    """
    new = [r for r in fresh if r.kind == "message"]
    if every <= 0 or not session_id or not new:
        return [], []
    ledger = store.ledger(user_id)
    stretches, replaced = ledger.to_summarise(
        session_id, [m.id for m in new], every, max(1, span)
    )
    if not stretches:
        return [], []
    known = {m.id: m for m in new}
    older = [rid for _, stretch in stretches for rid in stretch if rid not in known]
    known.update(store.log.get(user_id, older) if older else {})
    episodes = []
    now = datetime.now(UTC)
    for position, stretch in stretches:
        messages = [known[rid] for rid in stretch if rid in known]
        if messages:
            turns = [SessionTurn(m.speaker, m.text, m.occurred_at) for m in messages]
            summary = summarize_session(turns, position=position, sentences=sentences)
            episodes.append(episode_record(messages, summary, now))
    return episodes, replaced
