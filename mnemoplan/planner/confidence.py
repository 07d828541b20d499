"""How sure a search is that a memory bears on the query: a confidence in [0, 1] per item.

Ranking scores are relative (fused, normalised per query), so a list of unrelated memories
scores as high as a real answer. Confidence is read from signals whose scale is the same for
every query and every user:

- ``cosine``: the query's embedding against the memory's stored vector (MiniLM's cosine is an
  absolute similarity);
- ``coverage``: the share of the query's content words that the memory contains (a word
  counts if its first five letters match, so "painting" meets "paint");
- ``unknown``: 1 when the query names someone or something this user's memory has never
  mentioned (the analyzer resolves names against the user's entities), else 0.

A logistic map turns them into a probability-like number. Its four weights were fitted once,
by ``mnemoplan bench --mode abstain``, on questions asked of their own conversation (the
evidence is there) and of another conversation (it is not), using half of the benchmark's
conversations; bench/README.md gives the figures on the other half and on a second dataset.
A result whose best item is below ``NO_MATCH_BELOW`` says ``no_match``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mnemoplan.model import MemoryItem, QueryAnalysis

NO_MATCH_BELOW = 0.5
_WORD = re.compile(r"[a-z0-9]+")
_STEM = 5  # letters compared: a cheap, language-agnostic stemmer for English inflections


@dataclass(frozen=True)
class ConfidenceModel:
    """The logistic map from signals to confidence (see the module docstring)."""

    bias: float = -5.5
    cosine: float = 9.0
    coverage: float = 3.0
    unknown: float = -2.5

    def __call__(self, cosine: float, coverage: float, unknown: float) -> float:
        z = self.bias + self.cosine * cosine + self.coverage * coverage + self.unknown * unknown
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


@dataclass(frozen=True)
class Signals:
    """What confidence is computed from, for one item."""

    cosine: float
    coverage: float
    unknown: float


def _stems(text: str) -> set[str]:
    return {w[:_STEM] for w in _WORD.findall(text.lower())}


def coverage(keywords: Sequence[str], text: str) -> float:
    """The share of distinct query keywords whose stem occurs in ``text`` (1.0 with no keywords)."""
    wanted = {w[:_STEM] for k in keywords for w in _WORD.findall(k.lower())}
    if not wanted:
        return 1.0
    return len(wanted & _stems(text)) / len(wanted)


class ConfidenceScorer:
    """Gives each item of a result its confidence.

    Args:
        embed_query: The query's embedding (cached by the embedder, so recall's own is reused).
        vectors: Stored vectors of some of a user's records, by id.
        model: The logistic map.
    """

    def __init__(
        self,
        embed_query: Callable[[str], np.ndarray],
        vectors: Callable[[str, list[str]], dict[str, np.ndarray]],
        model: ConfidenceModel | None = None,
    ) -> None:
        self.embed_query = embed_query
        self.vectors = vectors
        self.model = model or ConfidenceModel()

    def signals(self, query: str, analysis: QueryAnalysis | None, items: list[MemoryItem], user_id: str) -> list[Signals]:
        """The signals of each item, in order."""
        if not items:
            return []
        q = np.asarray(self.embed_query(query), dtype=np.float32)
        q = q / (np.linalg.norm(q) or 1.0)
        stored = self.vectors(user_id, [i.id for i in items])
        keywords = analysis.keywords if analysis is not None else _WORD.findall(query.lower())
        unknown = 1.0 if analysis is not None and any(not e.known for e in analysis.entities) else 0.0
        out = []
        for item in items:
            v = stored.get(item.id)
            cos = float(np.dot(q, v) / (np.linalg.norm(v) or 1.0)) if v is not None and v.size == q.size else 0.0
            out.append(Signals(cosine=cos, coverage=coverage(keywords, item.text), unknown=unknown))
        return out

    def annotate(
        self, query: str, analysis: QueryAnalysis | None, items: list[MemoryItem], user_id: str
    ) -> tuple[list[MemoryItem], bool]:
        """The items with their confidence set, and whether none of them is relevant (no_match)."""
        signals = self.signals(query, analysis, items, user_id)
        scored = [
            item.model_copy(update={"confidence": round(self.model(s.cosine, s.coverage, s.unknown), 4)})
            for item, s in zip(items, signals, strict=True)
        ]
        return scored, no_match(scored)


def no_match(items: list[MemoryItem]) -> bool:
    """True when no item reaches ``NO_MATCH_BELOW`` (or there is none)."""
    return not items or max(i.confidence for i in items) < NO_MATCH_BELOW


NO_MATCH_CONTEXT = "Memory holds nothing relevant to this query (best confidence {best:.2f})."


def no_match_context(items: list[MemoryItem]) -> str:
    """What the context says when nothing relevant was found."""
    if not items:
        return "Memory holds nothing relevant to this query."
    return NO_MATCH_CONTEXT.format(best=max(i.confidence for i in items))
