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
# The embedding models the cosine weight was fitted for (names as Settings gives them).
CALIBRATED_MODELS = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})
_WORD = re.compile(r"[a-z0-9]+")
_STEM = 5  # letters compared: a cheap, language-agnostic stemmer for English inflections


@dataclass(frozen=True)
class ConfidenceModel:
    """The logistic map from signals to confidence (see the module docstring)."""

    # Fitted on the fit half of LoCoMo's conversations (bench/README.md, "Confidence").
    bias: float = -12.5
    cosine: float = 31.4
    coverage: float = 6.85
    unknown: float = -3.8

    def __call__(self, cosine: float, coverage: float, unknown: float) -> float:
        z = self.bias + self.cosine * cosine + self.coverage * coverage + self.unknown * unknown
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


LEXICAL = ConfidenceModel(bias=-1.5, cosine=0.0, coverage=9.9, unknown=-3.4)  # fitted the same way


@dataclass(frozen=True)
class Signals:
    """What confidence is computed from, for one item."""

    cosine: float
    coverage: float
    unknown: float
    embedded: bool = True  # the item has a stored vector (one still waiting to be stored has none)


def coverage(keywords: Sequence[str], text: str) -> float:
    """The share of distinct query keywords (cut to their first five letters) that start a word
    of ``text`` ("live" meets "lives", "painting" meets "paint"); 1.0 with no keywords."""
    wanted = {w[:_STEM] for k in keywords for w in _WORD.findall(k.lower())}
    if not wanted:
        return 1.0
    # Every beginning of every word up to the stem's length: a set lookup per stem, not a scan
    # of the text's words (a long reply has thousands).
    starts = {w[:n] for w in set(_WORD.findall(text.lower())) for n in range(1, _STEM + 1)}
    return sum(1 for stem in wanted if stem in starts) / len(wanted)


class ConfidenceScorer:
    """Gives each item of a result its confidence.

    The cosine term is calibrated for the bundled embedding model only: with another model
    (``cosine_calibrated`` False), or while the model is still loading (``ready``), confidence
    comes from the words alone (``lexical``), fitted the same way.

    Args:
        embed_query: The query's embedding (cached by the embedder, so recall's own is reused).
        vectors: Stored vectors of some of a user's records, by id.
        cosine_calibrated: Whether the embedding model is the one the cosine weight was fitted for.
        ready: Whether the embedding model is loaded (default: always).
        model: The logistic map with the cosine term.
        lexical: The logistic map without it.
    """

    def __init__(
        self,
        embed_query: Callable[[str], np.ndarray],
        vectors: Callable[[str, list[str]], dict[str, np.ndarray]],
        *,
        cosine_calibrated: bool = True,
        ready: Callable[[], bool] | None = None,
        model: ConfidenceModel | None = None,
        lexical: ConfidenceModel | None = None,
    ) -> None:
        self.embed_query = embed_query
        self.vectors = vectors
        self.cosine_calibrated = cosine_calibrated
        self.ready = ready or (lambda: True)
        self.model = model or ConfidenceModel()
        self.lexical = lexical or LEXICAL

    def uses_cosine(self) -> bool:
        """Whether confidence includes the cosine term now."""
        return self.cosine_calibrated and self.ready()

    def signals(self, query: str, analysis: QueryAnalysis | None, items: list[MemoryItem], user_id: str,
                *, cosine: bool = True) -> list[Signals]:  # fmt: skip
        """The signals of each item, in order (cosine 0 unless ``cosine``)."""
        if not items:
            return []
        stored: dict[str, np.ndarray] = {}
        q = np.zeros(0, dtype=np.float32)
        if cosine:
            q = np.asarray(self.embed_query(query), dtype=np.float32)
            q = q / (np.linalg.norm(q) or 1.0)
            stored = self.vectors(user_id, [i.id for i in items])
        keywords = analysis.keywords if analysis is not None else _WORD.findall(query.lower())
        unknown = 1.0 if analysis is not None and any(not e.known for e in analysis.entities) else 0.0
        out = []
        for item in items:
            v = stored.get(item.id)
            embedded = v is not None and v.size == q.size
            cos = float(np.dot(q, v) / (np.linalg.norm(v) or 1.0)) if embedded else 0.0
            out.append(Signals(cosine=cos, coverage=coverage(keywords, item.text), unknown=unknown,
                               embedded=embedded or not cosine))  # fmt: skip
        return out

    def annotate(
        self, query: str, analysis: QueryAnalysis | None, items: list[MemoryItem], user_id: str
    ) -> tuple[list[MemoryItem], bool]:
        """The items with their confidence set, and whether none of them is relevant (no_match).
        An item without a stored vector (accepted, not stored yet) is judged by its words alone."""
        cosine = self.uses_cosine()
        signals = self.signals(query, analysis, items, user_id, cosine=cosine)
        scored = [
            item.model_copy(update={"confidence": round(
                (self.model if cosine and s.embedded else self.lexical)(s.cosine, s.coverage, s.unknown), 4)})
            for item, s in zip(items, signals, strict=True)
        ]  # fmt: skip
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
