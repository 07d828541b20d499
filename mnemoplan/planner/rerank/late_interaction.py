"""Late interaction as reranker: the query's tokens matched one by one with the embedding model."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from mnemoplan.errors import MnemoError
from mnemoplan.inference.embedder import TokenVectors
from mnemoplan.inference.token_vectors import token_weights
from mnemoplan.model import MemoryItem
from mnemoplan.model.records import spoken
from mnemoplan.planner.rerank.base import RerankOutcome, order_kept

if TYPE_CHECKING:
    from mnemoplan.planner.executor import StepResult


class LateInteractionReranker:
    """Re-scores items by matching the query's tokens one by one, with the embedding model.

    A sentence embedding is one average, so a question's "exercises" has to survive averaging to
    meet a memory's "kickboxing". Here each query token finds its best match among an item's
    contextual token vectors (the cosine), and the matches are averaged with each word weighted
    by its rarity in the user's memory (BM25's idf; a stop word counts 0), so the words that carry
    the question decide. The match, z-scored, is added to the z-scored fused score at ``weight``:
    it reorders what fusion found, it does not replace it. The items keep the scores of the slots
    they land in, so scores stay comparable and descending; ``scores["token_match"]`` says why.

    No LLM, no network: the bundled model's own tokens. On LoCoMo (no LLM) it raised deep
    search's R@10, most on multi-hop and open-domain questions, for one forward pass over its
    ~30 items (bench/README.md). The ``token_match`` index now fuses the same signal, from token
    vectors stored at ingest, for every memory; on top of it this pass cost R@10 and time, so
    deep search skips it when it is ``redundant``. It still serves a log
    written, wholly or partly, before token vectors were stored, until ``mnemoplan reindex``.

    Args:
        token_vectors: The embedder's ``token_vectors``.
        word_idf: A user's rarity weight per word (``BM25Index.word_idf``).
        weight: The match's share against the fused score (z-scores); 0 leaves the order.
        depth: Items re-scored; those below keep their places.
        complete: Whether the ``token_match`` index has token vectors for every memory of a
            user (``TokenMatchIndex.complete``); None when there is no such index.
    """

    def __init__(
        self,
        token_vectors: Callable[[list[str]], list[TokenVectors]],
        word_idf: Callable[[str, list[str]], list[float]],
        *,
        weight: float = 0.35,
        depth: int = 30,
        complete: Callable[[str], bool] | None = None,
    ) -> None:
        if weight < 0 or depth < 2:
            raise ValueError("need weight >= 0 and depth >= 2")
        self._token_vectors = token_vectors
        self._word_idf = word_idf
        self.weight = weight
        self.depth = depth
        self._complete = complete

    def redundant(self, query: str, user_id: str, results: Sequence[StepResult]) -> bool:
        """Whether fusion already carries this signal for every item: a ``token_match`` step
        matched this very query (not a text of its own) and found something, and every memory
        of the user has token vectors for it to match."""
        fused = any(
            r.step.index == "token_match" and r.hits and r.step.params.get("query") in (None, "", query)
            for r in results
        )
        return fused and self._complete is not None and self._complete(user_id)

    def rerank(
        self, query: str, items: list[MemoryItem], *, deadline_s: float, user_id: str = ""
    ) -> RerankOutcome:
        """Reorder the first ``depth`` items by fused score plus token match.

        Args:
            query: The user's query.
            items: Items in their current (formula) order.
            deadline_s: Past it (the pass is not interrupted), the original order is kept.
            user_id: Whose memories these are: the word weights are that user's.

        Returns:
            The outcome; when the model cannot give token vectors, the original order and a note.
        """
        started = time.monotonic()
        head = items[: self.depth]
        if len(head) < 2 or self.weight == 0:
            return RerankOutcome(items=list(items))
        try:
            vectors = self._token_vectors([query, *(spoken(item) for item in head)])
        except MnemoError as exc:
            return RerankOutcome(items=list(items), notes=[f"token rerank skipped: {exc.message}"])
        match = self._match(query, vectors[0], vectors[1:], user_id)
        if time.monotonic() - started > deadline_s:
            return order_kept(items, deadline_s, batches=1)
        fused = np.array([item.score for item in head], dtype=np.float64)
        blended = _z(fused) + self.weight * _z(match)
        order = np.argsort(-blended, kind="stable")
        slots = sorted((item.score for item in head), reverse=True)
        reordered = [
            head[k].model_copy(
                update={"score": slot, "scores": {**head[k].scores, "token_match": round(match[k], 4)}}
            )
            for slot, k in zip(slots, order, strict=True)
        ]
        return RerankOutcome(items=reordered + items[self.depth :], batches=1)

    def _match(self, query: str, q: TokenVectors, docs: list[TokenVectors], user_id: str) -> np.ndarray:
        """Each item's idf-weighted mean, over the query's tokens, of the best cosine with its tokens."""
        weights = token_weights(query, q.words, lambda words: self._word_idf(user_id, words))
        out = np.zeros(len(docs), dtype=np.float64)
        for i, doc in enumerate(docs):
            if len(doc.vectors) and len(q.vectors):
                out[i] = float((q.vectors @ doc.vectors.T).max(axis=1) @ weights)
        return out


def _z(values: np.ndarray) -> np.ndarray:
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)
