"""What every reranker shares: the protocol, the outcome, and the way relevance is blended in.

Second-stage rerankers: an LLM judging batches of items (``llm``), a local cross-encoder
(``cross_encoder``), or token-level matching with the embedding model (``late_interaction``,
deep search's default without either, where the ``token_match`` index has not already fused
that signal).

The first two blend the same way. A relevance in [0, 10] multiplies the formula score by
``(0.5 + relevance / 10) ** weight`` (10 -> 1.5x, 5 -> 1x, 0 -> 0.5x), so the reranker
adjusts the ranking fusion earned instead of replacing it; an item rated below the veto
floor goes after every other item, never out of the list. Whatever fails (a batch, the
deadline) leaves the affected items with their original scores or the original order,
and says so in ``RerankOutcome``: reranking degrades, it never loses results.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from mnemoplan.inference.llm import LLMUsage
from mnemoplan.model import MemoryItem

if TYPE_CHECKING:
    from mnemoplan.planner.executor import StepResult


@dataclass
class RerankOutcome:
    """What a rerank did.

    Attributes:
        items: Every input item exactly once, in the new order; scored items carry
            ``scores["rerank"]`` (their relevance, 0-10) and a blended ``score``.
        usage: Tokens and cost of the LLM calls (empty for a local model). After a timeout
            only the calls are counted; their tokens reach the client's running total alone.
        batches: Batches sent.
        fallbacks: Batches whose reply was unusable, so their items kept their scores.
        timed_out: True when the deadline passed and the original order was kept.
        notes: One line per degradation, for the caller's warnings.
    """

    items: list[MemoryItem]
    usage: LLMUsage = field(default_factory=LLMUsage)
    batches: int = 0
    fallbacks: int = 0
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)


class Reranker(Protocol):
    """Reorders retrieved items by their relevance to the query."""

    def rerank(
        self, query: str, items: list[MemoryItem], *, deadline_s: float, user_id: str = ""
    ) -> RerankOutcome:
        """Return every item, reordered, within ``deadline_s`` seconds (or in the original order);
        ``user_id`` names whose memories they are."""
        ...


@runtime_checkable
class SkippableReranker(Reranker, Protocol):
    """A reranker whose signal an index may already have fused into the results."""

    def redundant(self, query: str, user_id: str, results: Sequence[StepResult]) -> bool:
        """Whether reranking would only repeat what fusion already did for this query."""
        ...


def blend(
    items: Sequence[MemoryItem], relevance: dict[int, float], *, weight: float, veto_floor: float
) -> list[MemoryItem]:
    """Apply relevance scores to items and sort them; the inputs are not modified.

    Args:
        items: Items in their current order.
        relevance: Relevance in [0, 10] by position in ``items``; positions missing keep
            their score and are never vetoed.
        weight: Exponent of the multiplier; 0 leaves scores unchanged.
        veto_floor: Fraction of 10 below which an item goes after all the others.

    Returns:
        Copies of every item, best first; ties keep their input order.
    """
    ranked: list[tuple[bool, float, int, MemoryItem]] = []
    for pos, item in enumerate(items):
        r = relevance.get(pos)
        if r is None:
            ranked.append((False, item.score, pos, item))
            continue
        factor = (0.5 + r / 10.0) ** weight
        # A negative formula score would sink further when multiplied; dividing keeps "more relevant
        # is better" for it too.
        score = item.score * factor if item.score >= 0 else item.score / factor
        copy = item.model_copy(update={"score": score, "scores": {**item.scores, "rerank": r}})
        ranked.append((r < veto_floor * 10.0, score, pos, copy))
    ranked.sort(key=lambda entry: (entry[0], -entry[1], entry[2]))
    return [entry[3] for entry in ranked]


def order_kept(
    items: list[MemoryItem], deadline_s: float, *, batches: int, usage: LLMUsage | None = None
) -> RerankOutcome:
    """The outcome of a rerank that ran out of time: the items as they came, and a note."""
    note = f"rerank timed out after {deadline_s:g} s; original order kept"
    return RerankOutcome(
        items=list(items), usage=usage or LLMUsage(), batches=batches, timed_out=True, notes=[note]
    )
