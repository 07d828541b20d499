"""A local cross-encoder as reranker: (query, text) pairs scored on this machine, never the network."""

from __future__ import annotations

import math
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from mnemoplan.inference.cross_encoder import CrossEncoderScorer
from mnemoplan.model import MemoryItem
from mnemoplan.planner.rerank.base import RerankOutcome, blend, order_kept


class CrossEncoderReranker:
    """Scores (query, text) pairs with a local cross-encoder; never touches the network.

    The model loads on first use, on its own thread; a first call that outlives its deadline
    returns the original order while loading goes on, and later calls use the loaded model.

    Args:
        model_path: Directory of a sentence-transformers cross-encoder.
        weight: Exponent of the relevance multiplier.
        veto_floor: Items whose sigmoid(logit) is below this go last.
    """

    def __init__(self, model_path: Path, *, weight: float = 1.0, veto_floor: float = 0.1) -> None:
        self._scorer = CrossEncoderScorer(model_path)
        self.weight = weight
        self.veto_floor = veto_floor

    def rerank(
        self, query: str, items: list[MemoryItem], *, deadline_s: float, user_id: str = ""
    ) -> RerankOutcome:
        """Rerank items by the cross-encoder's relevance.

        Args:
            query: The user's query.
            items: Items in their current (formula) order.
            deadline_s: Wall-time budget, loading included; past it the original order is kept.

        Returns:
            The outcome (its usage is empty: no LLM is called).

        Raises:
            Unavailable: The model directory does not exist or the model cannot be loaded.
        """
        if not items:
            return RerankOutcome(items=[])
        future = self._scorer.submit([(query, item.text) for item in items])
        try:
            logits = future.result(timeout=max(deadline_s, 0.0))
        except FutureTimeout:
            return order_kept(items, deadline_s, batches=1)
        relevance = {pos: 10.0 * _sigmoid(x) for pos, x in enumerate(logits)}
        return RerankOutcome(
            items=blend(items, relevance, weight=self.weight, veto_floor=self.veto_floor), batches=1
        )

    def close(self) -> None:
        """Stop the scorer's thread."""
        self._scorer.close()


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)  # the other branch would overflow for very negative logits
    return z / (1.0 + z)
