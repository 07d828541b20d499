"""Final ranking: conversational-context expansion and priors on top of the fused scores."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from mnemoplan.model import Record
from mnemoplan.planner.fusion import Candidate


@dataclass(frozen=True)
class RankingConfig:
    """Knobs of the final ranking.

    Attributes:
        context_propagation: Share of the next turn's score a turn inherits (the answer
            often sits one turn before the words that match the question).
        recency_half_life_days: Half-life of the recency prior; 0 turns it off.
        recency_weight: Weight of the recency prior.
        importance_weight: Weight of the stored importance.
        superseded_factor: Multiplier of a fact that a newer fact replaced.
    """

    context_propagation: float = 0.3
    recency_half_life_days: float = 0.0
    recency_weight: float = 0.1
    importance_weight: float = 0.0
    superseded_factor: float = 0.5


def rank(
    cands: dict[str, Candidate], records: dict[str, Record], config: RankingConfig, now: datetime
) -> list[Candidate]:
    """Score and order candidates whose records are known; the others are dropped."""
    live = {rid: c for rid, c in cands.items() if rid in records}
    base = {rid: c.score for rid, c in live.items()}
    if config.context_propagation > 0:
        for rid, cand in live.items():
            prev = records[rid].prev_id
            if prev in live:
                bonus = config.context_propagation * base[rid]
                if bonus > live[prev].scores.get("context", 0.0):
                    old = live[prev].scores.get("context", 0.0)
                    live[prev].scores["context"] = round(bonus, 4)
                    live[prev].score += bonus - old
    for rid, cand in live.items():
        rec = records[rid]
        if config.recency_half_life_days > 0:
            age_days = max(0.0, (now - rec.occurred_at).total_seconds() / 86400)
            prior = math.pow(0.5, age_days / config.recency_half_life_days)
            cand.scores["recency"] = round(prior, 4)
            cand.score += config.recency_weight * prior
        if config.importance_weight > 0:
            cand.scores["importance"] = round(rec.importance, 4)
            cand.score += config.importance_weight * rec.importance
        if rec.superseded_by:
            cand.score *= config.superseded_factor
    return sorted(live.values(), key=lambda c: (-c.score, -records[c.id].seq))
