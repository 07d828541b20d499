"""Second-stage rerankers: an LLM judging batches of items, a local cross-encoder, or
token-level matching with the embedding model (deep search's default without either, where
the ``token_match`` index has not already fused that signal).

The first two blend the same way. A relevance in [0, 10] multiplies the formula score by
``(0.5 + relevance / 10) ** weight`` (10 -> 1.5x, 5 -> 1x, 0 -> 0.5x), so the reranker
adjusts the ranking fusion earned instead of replacing it; an item rated below the veto
floor goes after every other item, never out of the list. Whatever fails (a batch, the
deadline) leaves the affected items with their original scores or the original order,
and says so in ``RerankOutcome``: reranking degrades, it never loses results.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from mnemoplan.errors import LLMError, MnemoError
from mnemoplan.inference.cross_encoder import CrossEncoderScorer
from mnemoplan.inference.embedder import TokenVectors
from mnemoplan.inference.token_vectors import token_weights
from mnemoplan.model import MemoryItem
from mnemoplan.model.records import spoken
from mnemoplan.inference.llm import LLMClient, LLMReply, LLMUsage

if TYPE_CHECKING:
    from mnemoplan.planner.executor import StepResult

RERANK_SYSTEM = (
    "You rate how relevant stored memories are to a query. Reply with JSON only, no prose: "
    '{"scores": {"<id>": <0-10>}} with one entry for every id listed. 10 = answers the query '
    "directly, 5 = useful context, 0 = unrelated. Judge relevance to the query, not truth."
)
_ID_CHARS = 8
_MAX_ITEM_CHARS = 300


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


class LLMReranker:
    """Scores items with the LLM in concurrent batches.

    Args:
        client: The shared LLM client; its timeout bounds each request.
        batch_size: Most items per request (batches are balanced, so 40 items make 3 of 13-14).
        max_in_flight: Most requests at the same time.
        veto_floor: Items rated below ``veto_floor * 10`` go last.
        weight: Exponent of the relevance multiplier.

    Raises:
        ValueError: If a number is out of range.
    """

    def __init__(
        self,
        client: LLMClient,
        *,
        batch_size: int = 16,
        max_in_flight: int = 6,
        veto_floor: float = 0.1,
        weight: float = 1.0,
    ) -> None:
        if batch_size < 1 or max_in_flight < 1 or not 0.0 <= veto_floor <= 1.0 or weight < 0:
            raise ValueError("need batch_size >= 1, max_in_flight >= 1, 0 <= veto_floor <= 1 and weight >= 0")
        self._client = client
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.veto_floor = veto_floor
        self.weight = weight

    def rerank(
        self, query: str, items: list[MemoryItem], *, deadline_s: float, user_id: str = ""
    ) -> RerankOutcome:
        """Rerank items, waiting no longer than ``deadline_s`` seconds for the LLM.

        Args:
            query: The user's query.
            items: Items in their current (formula) order.
            deadline_s: Wall-time budget; past it, the original order is returned at once and
                the requests still running are left to the client's own timeout.

        Returns:
            The outcome; a failed batch keeps its items' scores and is counted in ``fallbacks``.
        """
        started = time.monotonic()
        if not items:
            return RerankOutcome(items=[])
        batches = _balanced(len(items), self.batch_size)
        keyed = [_short_keys([items[i].id for i in batch]) for batch in batches]
        requests = [
            {"system": RERANK_SYSTEM, "prompt": _prompt(query, [items[i] for i in batch], keys),
             "max_tokens": 32 + 12 * len(batch), "purpose": "rerank"}
            for batch, keys in zip(batches, keyed, strict=True)
        ]  # fmt: skip
        replies = self._send(requests, deadline_s - (time.monotonic() - started))
        if replies is None:
            return _order_kept(items, deadline_s, batches=len(batches), usage=LLMUsage(calls=len(batches)))
        outcome = RerankOutcome(items=[], batches=len(batches))
        relevance: dict[int, float] = {}
        for n, (batch, keys, reply) in enumerate(zip(batches, keyed, replies, strict=True), 1):
            label = f"rerank batch {n}/{len(batches)} ({len(batch)} items)"
            if isinstance(reply, LLMError):
                outcome.usage.add(LLMUsage(calls=1, failures=1))
                outcome.fallbacks += 1
                outcome.notes.append(f"{label} failed, scores kept: {reply.message}")
                continue
            outcome.usage.add(reply.usage)
            scores = _read_scores(reply, keys)
            if not scores:
                outcome.fallbacks += 1
                outcome.notes.append(f"{label}: the reply had no usable scores, scores kept")
                continue
            if len(scores) < len(batch):
                outcome.notes.append(f"{label}: {len(batch) - len(scores)} item(s) unscored, scores kept")
            relevance.update({batch[i]: value for i, value in scores.items()})
        outcome.items = blend(items, relevance, weight=self.weight, veto_floor=self.veto_floor)
        return outcome

    def _send(self, requests: list[dict[str, Any]], budget_s: float) -> list[LLMReply | LLMError] | None:
        """The replies, or None when they did not all arrive within ``budget_s``."""
        if budget_s <= 0:
            return None
        done = threading.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["replies"] = self._client.complete_json_many(requests, max_in_flight=self.max_in_flight)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc
            finally:
                done.set()

        # A daemon thread: on a timeout the stragglers finish (bounded by the client's timeout)
        # without holding up the caller or the interpreter's exit.
        threading.Thread(target=run, name="mnemoplan-rerank", daemon=True).start()
        if not done.wait(budget_s):
            return None
        if "error" in box:
            raise box["error"]
        return box["replies"]


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
            return _order_kept(items, deadline_s, batches=1)
        relevance = {pos: 10.0 * _sigmoid(x) for pos, x in enumerate(logits)}
        return RerankOutcome(
            items=blend(items, relevance, weight=self.weight, veto_floor=self.veto_floor), batches=1
        )

    def close(self) -> None:
        """Stop the scorer's thread."""
        self._scorer.close()


class LateInteractionReranker:
    """Re-scores items by matching the query's tokens one by one, with the embedding model.

    A sentence embedding is one average, so a question's "exercises" has to survive averaging to
    meet a memory's "kickboxing". Here each query token finds its best match among an item's
    contextual token vectors (the cosine), and the matches are averaged with each word weighted
    by its rarity in the user's memory (BM25's idf; a stop word counts 0), so the words that carry
    the question decide. The match, z-scored, is added to the z-scored fused score at ``weight``:
    it reorders what fusion found, it does not replace it. The items keep the scores of the slots
    they land in, so scores stay comparable and descending; ``scores["token_match"]`` says why.

    No LLM, no network: the bundled model's own tokens. On LoCoMo (no LLM) it took deep search's
    R@10 from 80.2 to 81.2 (multi-hop +2.9, open-domain +3.9) for one forward pass over the
    ~30 items (~105 ms; bench/README.md). The ``token_match`` index now fuses the same signal,
    from token vectors stored at ingest, for every memory; on top of it this pass cost 0.6 R@10
    and ~115 ms of p50, so deep search skips it when it is ``redundant``. It still serves a log
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
        fused = any(r.step.index == "token_match" and r.hits and r.step.params.get("query") in (None, "", query)
                    for r in results)  # fmt: skip
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
            return _order_kept(items, deadline_s, batches=1)
        fused = np.array([item.score for item in head], dtype=np.float64)
        blended = _z(fused) + self.weight * _z(match)
        order = np.argsort(-blended, kind="stable")
        slots = sorted((item.score for item in head), reverse=True)
        reordered = [
            head[k].model_copy(update={"score": slot, "scores": {**head[k].scores, "token_match": round(match[k], 4)}})
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


def _order_kept(
    items: list[MemoryItem], deadline_s: float, *, batches: int, usage: LLMUsage | None = None
) -> RerankOutcome:
    """The outcome of a rerank that ran out of time: the items as they came, and a note."""
    note = f"rerank timed out after {deadline_s:g} s; original order kept"
    return RerankOutcome(items=list(items), usage=usage or LLMUsage(), batches=batches, timed_out=True, notes=[note])


def _z(values: np.ndarray) -> np.ndarray:
    spread = values.std()
    return (values - values.mean()) / spread if spread > 0 else np.zeros_like(values)


def _balanced(n: int, size: int) -> list[list[int]]:
    # Even batches finish together; 16 + 16 + 1 would leave one request mostly idle overhead.
    count = -(-n // size)
    bounds = [round(k * n / count) for k in range(count + 1)]
    return [list(range(bounds[k], bounds[k + 1])) for k in range(count)]


def _short_keys(ids: list[str]) -> list[str]:
    """Short, unique labels for ids: 8 characters, longer only where prefixes collide."""
    length = _ID_CHARS
    longest = max((len(i) for i in ids), default=0)
    while length < longest and len({i[:length] for i in ids}) < len(ids):
        length += 4
    keys: list[str] = []
    for i in ids:
        key, n = i[:length], 1
        while key in keys:  # the same id twice in the input: still one label each
            n += 1
            key = f"{i[:length]}~{n}"
        keys.append(key)
    return keys


def _prompt(query: str, items: list[MemoryItem], keys: list[str]) -> str:
    lines = [f"Query: {query}", "Memories:"]
    for key, item in zip(keys, items, strict=True):
        text = " ".join(item.text.split())
        if len(text) > _MAX_ITEM_CHARS:
            text = text[: _MAX_ITEM_CHARS - 1] + "…"
        speaker = f" {item.speaker}" if item.speaker else ""
        lines.append(f"[{key}] {item.occurred_at.date().isoformat()}{speaker}: {text}")
    return "\n".join(lines)


def _read_scores(reply: LLMReply, keys: list[str]) -> dict[int, float]:
    """Relevance by position in the batch, from ``{"scores": {...}}`` or a bare id map."""
    data = reply.data
    scores = data.get("scores", data) if isinstance(data, dict) else None
    if not isinstance(scores, dict):
        return {}
    position = {key: pos for pos, key in enumerate(keys)}
    out: dict[int, float] = {}
    for raw_key, raw_value in scores.items():
        pos = position.get(str(raw_key).strip().strip("[]"))
        if pos is None or isinstance(raw_value, bool):
            continue
        try:
            value = float(raw_value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            out[pos] = min(10.0, max(0.0, value))
    return out


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)  # the other branch would overflow for very negative logits
    return z / (1.0 + z)
