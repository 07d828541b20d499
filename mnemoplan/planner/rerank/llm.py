"""The LLM as reranker: items scored in concurrent batches, blended into the formula score."""

from __future__ import annotations

import contextvars
import math
import threading
import time
from contextlib import nullcontext
from typing import Any

from pydantic import BaseModel, model_validator

from mnemoplan.errors import LLMError
from mnemoplan.inference.llm import LLMClient, LLMReply, LLMUsage
from mnemoplan.inference.llm_calls import current_scope, llm_scope
from mnemoplan.model import MemoryItem
from mnemoplan.planner.rerank.base import RerankOutcome, blend, order_kept

RERANK_SYSTEM = (
    "You rate how relevant stored memories are to a query. Reply with JSON only, no prose: "
    '{"scores": {"<id>": <0-10>}} with one entry for every id listed. 10 = answers the query '
    "directly, 5 = useful context, 0 = unrelated. Judge relevance to the query, not truth."
)
_ID_CHARS = 8
_MAX_ITEM_CHARS = 300
# A request ends (and sends no retry or repair) this long after the rerank gave up on it: past
# the rerank's own wait, so that the rerank, not the request, says the time ran out.
_STRAGGLER_S = 1.0


class _Scores(BaseModel):
    """Scores by id; each value is read on its own (``_read_scores``), a bad one skipped."""

    scores: dict[str, Any]

    @model_validator(mode="before")
    @classmethod
    def _bare_map(cls, data: Any) -> Any:
        if isinstance(data, dict) and not isinstance(data.get("scores"), dict):
            return {"scores": data}  # the map without its envelope
        return data


class LLMReranker:
    """Scores items with the LLM in concurrent batches.

    Args:
        client: The shared LLM client; its timeout bounds each request.
        batch_size: Most items per request (batches are balanced, so 40 items make 3 of 13-14).
        max_in_flight: Most requests at the same time.
        veto_floor: Items rated below ``veto_floor * 10`` go last.
        weight: Exponent of the relevance multiplier.
        max_calls: LLM requests one rerank may send when no tool call's cap is in force (a recall's
            rerank; a deep search's counts against its own); 0 for no cap.

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
        max_calls: int = 0,
    ) -> None:
        if batch_size < 1 or max_in_flight < 1 or not 0.0 <= veto_floor <= 1.0 or weight < 0:
            raise ValueError("need batch_size >= 1, max_in_flight >= 1, 0 <= veto_floor <= 1 and weight >= 0")
        self._client = client
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.veto_floor = veto_floor
        self.weight = weight
        self.max_calls = max_calls

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
             "max_tokens": 32 + 12 * len(batch), "purpose": "rerank", "schema": _Scores,
             "deadline": started + deadline_s + _STRAGGLER_S}
            for batch, keys in zip(batches, keyed, strict=True)
        ]  # fmt: skip
        own = current_scope() is None  # a recall's rerank: a tool call of its own
        with llm_scope("recall", self.max_calls, "MNEMOPLAN_LLM_MAX_CALLS_PER_SEARCH") if own else nullcontext():
            replies = self._send(requests, deadline_s - (time.monotonic() - started))
        if replies is None:
            return order_kept(items, deadline_s, batches=len(batches), usage=LLMUsage(calls=len(batches)))
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
        # In the caller's context: its requests count against the caller's scope.
        threading.Thread(target=contextvars.copy_context().run, args=(run,), name="mnemoplan-rerank",
                         daemon=True).start()  # fmt: skip
        if not done.wait(budget_s):
            return None
        if "error" in box:
            raise box["error"]
        return box["replies"]


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
    scores = reply.value.scores if isinstance(reply.value, _Scores) else {}
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
