"""Rerankers: the LLM one against a loopback Messages API, the cross-encoder's missing-model error."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mnemoplan.errors import Unavailable
from mnemoplan.inference.cross_encoder import CrossEncoderScorer
from mnemoplan.model import MemoryItem
from mnemoplan.inference.llm import LLMClient
from mnemoplan.inference.embedder import HashEmbedder
from mnemoplan.planner.rerank.base import RerankOutcome, blend
from mnemoplan.planner.rerank.cross_encoder import CrossEncoderReranker
from mnemoplan.planner.rerank.late_interaction import LateInteractionReranker
from mnemoplan.planner.rerank.llm import LLMReranker
from tests.llm_server import LoopbackMessagesServer as Server
from tests.llm_server import Reply, llm_server  # noqa: F401

HAIKU = "claude-haiku-4-5"
LINE = re.compile(r"^\[(\S+)\] \S+(?: \S+)?: memory (\d+)\b", re.M)


@pytest.fixture
def client(llm_server: Server) -> Iterator[LLMClient]:
    made = LLMClient(api_key="sk-ant-test", model=HAIKU, base_url=llm_server.url, timeout_s=5.0,
                     max_retries=1)
    yield made
    made.close()


def make_items(n: int, *, prefix: str = "") -> list[MemoryItem]:
    """Items ``memory 0..n-1`` with falling scores; ids are unique in their first 8 characters."""
    start = datetime(2023, 5, 1, tzinfo=UTC)
    return [
        MemoryItem(id=f"{prefix}{k:04d}{'ab' * 14}", kind="message", text=f"memory {k} about the lake",
                   speaker="Caroline" if k % 2 else "", occurred_at=start + timedelta(hours=k),
                   score=round(1.0 - k / 100, 4))
        for k in range(n)
    ]  # fmt: skip


def prompt_of(body: dict[str, Any]) -> str:
    return body["messages"][0]["content"]


def scorer(relevance: Callable[[int], float]) -> Callable[[dict[str, Any]], Reply]:
    """A responder that rates each listed memory by its number."""

    def respond(body: dict[str, Any]) -> Reply:
        found = LINE.findall(prompt_of(body))
        return Reply(text=json.dumps({"scores": {key: relevance(int(n)) for key, n in found}}),
                     input_tokens=400, output_tokens=60)  # fmt: skip

    return respond


def order(outcome: RerankOutcome) -> list[str]:
    return [item.text.split()[1] for item in outcome.items]


def assert_same_items(outcome: RerankOutcome, items: list[MemoryItem]) -> None:
    assert sorted(i.id for i in outcome.items) == sorted(i.id for i in items)


def test_scores_reorder_items_and_blend_multiplicatively(llm_server: Server, client: LLMClient) -> None:
    items = make_items(3)  # scores 1.0, 0.99, 0.98
    llm_server.responder = scorer({0: 2, 1: 10, 2: 6}.__getitem__)
    outcome = LLMReranker(client).rerank("where is the lake?", items, deadline_s=5)
    assert order(outcome) == ["1", "2", "0"]
    by_text = {i.text.split()[1]: i for i in outcome.items}
    assert by_text["1"].score == pytest.approx(0.99 * 1.5)
    assert by_text["2"].score == pytest.approx(0.98 * 1.1)
    assert by_text["0"].score == pytest.approx(1.0 * 0.7)
    assert by_text["0"].scores["rerank"] == 2
    assert items[0].score == 1.0 and "rerank" not in items[0].scores  # the inputs are not modified
    assert outcome.batches == 1 and outcome.fallbacks == 0 and not outcome.timed_out and outcome.notes == []
    assert outcome.usage.calls == 1 and outcome.usage.cost_usd == pytest.approx((400 * 1 + 60 * 5) / 1e6)
    [body] = llm_server.requests
    assert "where is the lake?" in prompt_of(body) and '"scores"' in body["system"]
    assert f"[{items[0].id[:8]}] 2023-05-01: memory 0" in prompt_of(body)
    assert f"[{items[1].id[:8]}] 2023-05-01 Caroline: memory 1" in prompt_of(body)


def test_veto_floor_moves_an_item_last(llm_server: Server, client: LLMClient) -> None:
    items = make_items(4)
    items[3] = items[3].model_copy(update={"score": 0.01})
    # Item 0 would still lead on score (1.0 * 0.5 > 0.01 * 1.5); the veto puts it after everything.
    llm_server.responder = scorer({0: 0.5, 1: 5, 2: 5, 3: 10}.__getitem__)
    outcome = LLMReranker(client, veto_floor=0.1).rerank("q", items, deadline_s=5)
    assert order(outcome) == ["1", "2", "3", "0"]
    assert_same_items(outcome, items)


def test_a_malformed_batch_keeps_its_scores_and_counts_a_fallback(
    llm_server: Server, client: LLMClient
) -> None:
    items = make_items(20)
    good = scorer(lambda n: 10.0 if n == 15 else 5.0)

    def respond(body: dict[str, Any]) -> Reply:
        # The repair request repeats the first prompt, so both get the same bad answer.
        return Reply(text="These all look relevant to me!") if "memory 0 " in prompt_of(body) else good(body)

    llm_server.responder = respond
    outcome = LLMReranker(client, batch_size=10).rerank("q", items, deadline_s=5)
    assert outcome.batches == 2 and outcome.fallbacks == 1
    assert len(llm_server.requests) == 3  # batch 1 twice (client repair), batch 2 once
    assert "rerank batch 1/2" in outcome.notes[0] and "malformed" in outcome.notes[0]
    first_batch = {i.id for i in items[:10]}
    for item in outcome.items:
        if item.id in first_batch:
            assert "rerank" not in item.scores and item.score == items[int(item.text.split()[1])].score
    assert order(outcome)[0] == "15"  # 0.85 * 1.5 beats 1.0 unchanged
    assert_same_items(outcome, items)


def test_a_batch_failing_with_500_keeps_its_scores(llm_server: Server, client: LLMClient) -> None:
    items = make_items(20)
    good = scorer(lambda n: 5.0)

    def respond(body: dict[str, Any]) -> Reply:
        if "memory 10 " in prompt_of(body):
            return Reply(status=500, headers={"retry-after": "0"})
        return good(body)

    llm_server.responder = respond
    outcome = LLMReranker(client, batch_size=10).rerank("q", items, deadline_s=5)
    assert outcome.fallbacks == 1 and "500" in outcome.notes[0] and "batch 2/2" in outcome.notes[0]
    assert outcome.usage.calls == 2 and outcome.usage.failures == 1
    assert [i.score for i in outcome.items] == [i.score for i in items]  # 5/10 -> x1.0; the rest kept
    assert sum("rerank" in i.scores for i in outcome.items) == 10


def test_a_slow_server_past_the_deadline_keeps_the_original_order(
    llm_server: Server, client: LLMClient
) -> None:
    items = make_items(5)
    reversed_scores = scorer(lambda n: float(n * 2))
    release, answered = threading.Event(), threading.Event()

    def respond(body: dict[str, Any]) -> Reply:
        release.wait(60)  # the reply comes only once the rerank has returned
        answered.set()
        return reversed_scores(body)

    llm_server.responder = respond
    outcome = LLMReranker(client).rerank("q", items, deadline_s=0.3)
    assert not answered.is_set()  # it returned without waiting for the straggler
    assert outcome.timed_out and outcome.items == items
    assert outcome.notes == ["rerank timed out after 0.3 s; original order kept"]
    # Let the straggler land before the server stops, so it ends quietly rather than in an error.
    release.set()
    for thread in threading.enumerate():
        if thread.name == "mnemoplan-rerank":
            thread.join(timeout=5)


def test_forty_items_go_in_three_concurrent_batches(llm_server: Server, client: LLMClient) -> None:
    items = make_items(40)
    changed = threading.Condition()
    in_flight = [0, 0]  # now, peak
    rate = scorer(lambda n: float(n % 11))

    def respond(body: dict[str, Any]) -> Reply:
        with changed:
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])
            changed.notify_all()
            # Each request is held until two are in flight at once: sent one after the other,
            # they never would be (and the test fails after the wait, however fast the machine).
            changed.wait_for(lambda: in_flight[1] >= 2, timeout=60)
            in_flight[0] -= 1
        return rate(body)

    llm_server.responder = respond
    outcome = LLMReranker(client, batch_size=16, max_in_flight=6).rerank("q", items, deadline_s=5)
    sizes = [len(LINE.findall(prompt_of(body))) for body in llm_server.requests]
    assert len(sizes) == 3 and sum(sizes) == 40 and max(sizes) <= 16
    assert in_flight[1] >= 2
    assert outcome.batches == 3 and outcome.fallbacks == 0
    assert_same_items(outcome, items)
    assert all("rerank" in item.scores for item in outcome.items)
    assert outcome.usage.calls == 3 and outcome.usage.cost_usd == pytest.approx(3 * (400 + 60 * 5) / 1e6)


def test_ids_sharing_a_prefix_are_told_apart(llm_server: Server, client: LLMClient) -> None:
    items = [i.model_copy(update={"id": "samesame" + i.id}) for i in make_items(3)]
    llm_server.responder = scorer({0: 0, 1: 4, 2: 10}.__getitem__)
    outcome = LLMReranker(client, veto_floor=0).rerank("q", items, deadline_s=5)
    assert order(outcome) == ["2", "1", "0"]
    assert [i.scores["rerank"] for i in outcome.items] == [10, 4, 0]


def test_blend_is_stable_for_ties_and_leaves_unscored_items_alone() -> None:
    items = make_items(4)
    items = [i.model_copy(update={"score": 1.0}) for i in items]
    ranked = blend(items, {1: 5.0, 3: 5.0}, weight=1.0, veto_floor=0.1)
    assert [i.text.split()[1] for i in ranked] == ["0", "1", "2", "3"]
    assert "rerank" not in ranked[0].scores and ranked[1].scores["rerank"] == 5.0


def test_empty_input_sends_nothing(llm_server: Server, client: LLMClient) -> None:
    outcome = LLMReranker(client).rerank("q", [], deadline_s=1)
    assert outcome.items == [] and llm_server.requests == []


def test_cross_encoder_with_a_missing_model_is_unavailable(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(Unavailable, match="does not exist") as info:
        CrossEncoderScorer(missing).score([("q", "text")])
    assert "never downloaded" in info.value.hint
    reranker = CrossEncoderReranker(missing)
    try:
        with pytest.raises(Unavailable):
            reranker.rerank("q", make_items(2), deadline_s=1)
    finally:
        reranker.close()


def token_items(*texts: str) -> list[MemoryItem]:
    start = datetime(2023, 5, 1, tzinfo=UTC)
    return [MemoryItem(id=f"m{k}", kind="message", text=t, occurred_at=start, score=round(1.0 - k / 10, 2))
            for k, t in enumerate(texts)]  # fmt: skip


def rarity(table: dict[str, float]) -> Callable[[str, list[str]], list[float]]:
    return lambda user_id, words: [table.get(w.lower(), 0.0) for w in words]


def test_token_rerank_lets_the_rare_words_of_the_query_decide() -> None:
    # One token per word (the hash embedder): a word matches itself and nothing else.
    items = token_items("Ann said hello to Ann", "we went to the market", "Ann and Ann again", "nothing here")
    reranker = LateInteractionReranker(
        HashEmbedder(64).token_vectors, rarity({"market": 3.0, "ann": 0.2}), weight=1.0
    )  # fmt: skip
    outcome = reranker.rerank("What did Ann buy at the market?", items, deadline_s=5, user_id="u")
    assert [i.id for i in outcome.items][0] == "m1"  # "market", the rare word, outweighs a common name
    assert sorted(i.id for i in outcome.items) == ["m0", "m1", "m2", "m3"]
    assert [i.score for i in outcome.items] == [1.0, 0.9, 0.8, 0.7]  # the slots keep their scores
    assert all("token_match" in i.scores for i in outcome.items)


def test_token_rerank_weight_zero_and_short_lists_keep_the_order() -> None:
    items = token_items("a market", "the market", "markets")
    idf = rarity({"market": 3.0})
    embed = HashEmbedder(64).token_vectors
    assert LateInteractionReranker(embed, idf, weight=0.0).rerank("market", items, deadline_s=5).items == items
    assert LateInteractionReranker(embed, idf).rerank("market", items[:1], deadline_s=5).items == items[:1]
    # Only the first `depth` items are re-scored; the rest stay where they were.
    deep = LateInteractionReranker(embed, idf, weight=5.0, depth=2)
    outcome = deep.rerank("markets", items, deadline_s=5)
    assert outcome.items[2] == items[2] and "token_match" not in outcome.items[2].scores


def test_token_rerank_without_token_vectors_keeps_the_order_and_says_so() -> None:
    def unavailable(texts: list[str]) -> list[Any]:
        raise Unavailable("The embedding model is still loading.")

    items = token_items("one", "two")
    outcome = LateInteractionReranker(unavailable, rarity({})).rerank("one", items, deadline_s=5)
    assert outcome.items == items
    assert outcome.notes == ["token rerank skipped: The embedding model is still loading."]


def test_token_rerank_past_its_deadline_keeps_the_order() -> None:
    items = token_items("a market", "the market stall")
    outcome = LateInteractionReranker(HashEmbedder(64).token_vectors, rarity({"stall": 3.0}), weight=9.0).rerank(
        "stall", items, deadline_s=0.0
    )  # fmt: skip
    assert outcome.items == items and outcome.timed_out
