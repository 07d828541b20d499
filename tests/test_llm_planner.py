"""LLM planner, evaluator and replanner against a loopback Messages API and a real registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mnemoplan.errors import LLMError
from mnemoplan.search.base import Hit, SearchIndex, SearchRequest
from mnemoplan.search.registry import IndexRegistry
from mnemoplan.model import (
    EntityRef,
    IndexDescriptor,
    MemoryItem,
    ParamSpec,
    PlanStep,
    QueryAnalysis,
    QueryPlan,
    StepReport,
    TimeWindow,
)
from mnemoplan.inference.llm import LLMClient
from mnemoplan.planner.evaluate import Evaluation
from mnemoplan.planner.fingerprint import plan_fingerprint
from mnemoplan.planner.llm.evaluator import LLMEvaluator
from mnemoplan.planner.llm.planner import LLMPlanner, LLMReplanner
from tests.llm_server import LoopbackMessagesServer as Server
from tests.llm_server import Reply, llm_server  # noqa: F401

HAIKU = "claude-haiku-4-5"  # $1 / $5 per million input / output tokens
QUERY = "When did Melanie paint the sunrise?"
NO_RETRY_WAIT = {"retry-after": "0"}


class _Toy(SearchIndex):
    """An index that finds nothing: only its descriptor matters to planning."""

    def __init__(self, descriptor: IndexDescriptor) -> None:
        self.descriptor = descriptor

    def search(self, req: SearchRequest) -> list[Hit]:
        return []


@pytest.fixture
def registry() -> IndexRegistry:
    reg = IndexRegistry()
    top_k = ParamSpec(name="top_k", type="integer", default=50, description="How many records.")
    reg.register(_Toy(IndexDescriptor(
        name="bm25", description="Keyword relevance.", stores="an inverted index", best_for=["names"],
        query_params=[ParamSpec(name="query", type="string", description="Words to match."), top_k],
        returns="records with a BM25 score", examples=[{"query": "adoption", "params": {"top_k": 20}}],
    )))  # fmt: skip
    reg.register(_Toy(IndexDescriptor(
        name="temporal", description="Records in a time window.", stores="dates",
        query_params=[ParamSpec(name="start", type="datetime"), ParamSpec(name="end", type="datetime"),
                      top_k],
    )))  # fmt: skip
    return reg


@pytest.fixture
def client(llm_server: Server) -> Iterator[LLMClient]:
    made = LLMClient(api_key="sk-ant-test", model=HAIKU, base_url=llm_server.url, timeout_s=5.0,
                     max_retries=1)
    yield made
    made.close()


ANALYSIS = QueryAnalysis(
    query=QUERY, intent="temporal", keywords=["melanie", "paint", "sunrise"], answer_type="date",
    entities=[EntityRef(key="melanie", name="Melanie", known=True, participant=True)],
    time_window=TimeWindow(start=datetime(2023, 5, 1, tzinfo=UTC), end=datetime(2023, 6, 1, tzinfo=UTC),
                           expression="in May 2023"),
)  # fmt: skip
BASELINE = QueryPlan(
    name="deep", query=QUERY, analysis=ANALYSIS, expected_answer_type="date",
    steps=[PlanStep(step_id="bm25", index="bm25", params={"top_k": 100}, rationale="keywords")],
)  # fmt: skip


def plan_json(*steps: dict[str, Any], **top: Any) -> str:
    fields = {"steps": list(steps), "combination_strategy": "rrf", "expected_answer_type": "date"}
    return json.dumps({**fields, **top})


GOOD = plan_json(
    {"step_id": "kw", "index": "bm25", "params": {"query": "Melanie sunrise painting", "top_k": 60},
     "rationale": "names and rare words"},
    {"step_id": "may", "index": "temporal", "params": {"start": "2023-05-01", "end": "2023-06-01"},
     "depends_on": ["kw"], "combine": "filter_by", "weight": 0.5},
    max_results=40,
)  # fmt: skip
UNKNOWN_INDEX = plan_json({"step_id": "x", "index": "foo", "params": {}})


def prompt_of(request: dict[str, Any]) -> str:
    return request["messages"][0]["content"]


def cost(*calls: tuple[int, int]) -> float:
    return sum(i * 1.0 + o * 5.0 for i, o in calls) / 1_000_000


def plan_with(client: LLMClient, registry: IndexRegistry, max_results: int = 10) -> Any:
    return LLMPlanner(client).plan(QUERY, ANALYSIS, registry.descriptors("u1"), BASELINE, registry.validate,
                                   max_results)  # fmt: skip


# --- planner ----------------------------------------------------------------------------------


def test_planner_returns_the_scripted_plan_validated(
    llm_server: Server, client: LLMClient, registry: IndexRegistry
) -> None:
    llm_server.script(Reply(text=f"Here you go:\n```json\n{GOOD}\n```", input_tokens=1200, output_tokens=300))
    outcome = plan_with(client, registry)
    plan = outcome.plan
    assert plan is not None and outcome.fallback_reason == "" and outcome.attempts == 1
    assert plan.source == "llm" and plan.query == QUERY and plan.analysis == ANALYSIS
    assert [(s.step_id, s.index) for s in plan.steps] == [("kw", "bm25"), ("may", "temporal")]
    assert plan.steps[1].params["start"] == datetime(2023, 5, 1, tzinfo=UTC)  # coerced by validate
    assert plan.steps[1].depends_on == ["kw"] and plan.steps[1].combine == "filter_by"
    assert plan.combination_strategy == "rrf" and plan.max_results == 10  # 40 capped
    assert outcome.usage.calls == 1 and outcome.usage.cost_usd == pytest.approx(cost((1200, 300)))
    [request] = llm_server.requests
    assert request["model"] == HAIKU
    prompt = prompt_of(request)
    expected = (QUERY, '"name":"temporal"', '"best_for":["names"]', '"default":50', "Melanie", "2023-05-01",
                "deep_plan (baseline)", '"top_k":100', '"max_results": <1-10>')  # fmt: skip
    assert [e for e in expected if e not in prompt] == []
    assert "JSON" in request["system"] and "Rules:" in request["system"]


def test_planner_falls_back_when_the_reply_is_malformed_twice(
    llm_server: Server, client: LLMClient, registry: IndexRegistry
) -> None:
    llm_server.script(Reply(text="I would search everything."), Reply(text="Sorry, no JSON today."))
    outcome = plan_with(client, registry)
    assert outcome.plan is None
    assert outcome.fallback_reason.startswith("LLM planner failed") and "malformed" in outcome.fallback_reason
    assert len(llm_server.requests) == 2  # the client's own repair; no third request
    assert outcome.usage.failures == 1


def test_invalid_plan_is_repaired_with_the_validation_error(
    llm_server: Server, client: LLMClient, registry: IndexRegistry
) -> None:
    llm_server.script(Reply(text=UNKNOWN_INDEX, input_tokens=1000, output_tokens=100),
                      Reply(text=GOOD, input_tokens=1100, output_tokens=200))  # fmt: skip
    outcome = plan_with(client, registry)
    assert outcome.plan is not None and outcome.attempts == 2
    assert [s.index for s in outcome.plan.steps] == ["bm25", "temporal"]
    second = prompt_of(llm_server.requests[1])
    assert "Unknown index 'foo'" in second and "Valid indexes: bm25, temporal" in second
    assert '"index":"foo"' in second  # the bad JSON is shown back
    assert outcome.usage.calls == 2
    assert outcome.usage.cost_usd == pytest.approx(cost((1000, 100), (1100, 200)))


def test_schema_errors_are_repaired_too(
    llm_server: Server, client: LLMClient, registry: IndexRegistry
) -> None:
    llm_server.script(Reply(text='{"steps": [{"step_id": "a", "params": {}}]}'), Reply(text=GOOD))
    outcome = plan_with(client, registry)
    assert outcome.plan is not None and outcome.attempts == 2
    assert "steps.0.index" in prompt_of(llm_server.requests[1])


def test_still_invalid_after_repair_falls_back_with_the_reason(
    llm_server: Server, client: LLMClient, registry: IndexRegistry
) -> None:
    llm_server.script(Reply(text=UNKNOWN_INDEX), Reply(text=UNKNOWN_INDEX))
    outcome = plan_with(client, registry)
    assert outcome.plan is None and outcome.attempts == 2
    assert outcome.fallback_reason == "LLM plan invalid after repair: Unknown index 'foo'."
    assert len(llm_server.requests) == 2


def test_timeout_falls_back_without_a_retry(llm_server: Server, registry: IndexRegistry) -> None:
    llm_server.script(Reply(text=GOOD, delay_s=600))  # answered only when the server stops
    slow = LLMClient(api_key="sk-ant-test", model=HAIKU, base_url=llm_server.url, timeout_s=0.3)
    try:
        outcome = plan_with(slow, registry)
    finally:
        slow.close()
    assert outcome.plan is None and outcome.fallback_reason.startswith("LLM planner timed out")
    assert len(llm_server.requests) == 1


def test_http_500_twice_falls_back(llm_server: Server, client: LLMClient, registry: IndexRegistry) -> None:
    llm_server.script(Reply(status=500, headers=NO_RETRY_WAIT), Reply(status=500, headers=NO_RETRY_WAIT))
    outcome = plan_with(client, registry)
    assert outcome.plan is None and "500" in outcome.fallback_reason
    assert outcome.usage.failures == 1 and len(llm_server.requests) == 2


# --- evaluator --------------------------------------------------------------------------------


def items(n: int) -> list[MemoryItem]:
    start = datetime(2023, 5, 1, tzinfo=UTC)
    return [
        MemoryItem(id=f"{k:08d}deadbeef", kind="message", text=f"memory number {k} " + "x" * (k == 0) * 600,
                   speaker="Melanie", occurred_at=start + timedelta(days=k), score=1.0 - k / 100,
                   provenance=["bm25"])
        for k in range(n)
    ]  # fmt: skip


RAN = QueryPlan(
    query=QUERY, steps=[PlanStep(step_id="bm25", index="bm25"), PlanStep(step_id="time", index="temporal")]
)
REPORTS = [StepReport(round=1, step_id="bm25", index="bm25", count=12),
           StepReport(round=1, step_id="time", index="temporal", error="index offline")]  # fmt: skip


def test_evaluator_parses_a_sufficient_verdict(llm_server: Server, client: LLMClient) -> None:
    llm_server.script(Reply(text=json.dumps({
        "sufficient": True, "confidence": 0.9, "diagnosis": "The painting date is in item 00000003.",
        "step_assessments": [{"step_id": "bm25", "useful": True, "quality": 0.8, "issue": ""},
                             {"step_id": "ghost", "useful": True, "quality": 1.0}],
        "suggested_changes": [],
    }), input_tokens=2000, output_tokens=100))  # fmt: skip
    evaluation = LLMEvaluator(client).evaluate(QUERY, ANALYSIS, RAN, REPORTS, items(25), round_no=1)
    assert evaluation.sufficient and evaluation.confidence == 0.9 and evaluation.source == "llm"
    assert evaluation.step_assessments == [{"step_id": "bm25", "useful": True, "quality": 0.8, "issue": ""}]
    assert evaluation.usage.cost_usd == pytest.approx(cost((2000, 100)))
    prompt = prompt_of(llm_server.requests[0])
    assert "[00000019] message 2023-05-20 Melanie via bm25: memory number 19" in prompt
    assert "[00000020]" not in prompt  # at most 20 items shown
    assert "x" * 300 not in prompt and "x" * 250 in prompt  # text cut to 300 characters
    assert "bm25 {} -> 12 found" in prompt and "error: index offline" in prompt
    assert evaluation.as_dict()["sufficient"] is True


def test_evaluator_parses_an_insufficient_verdict_and_clamps(llm_server: Server, client: LLMClient) -> None:
    llm_server.script(Reply(text=json.dumps({
        "sufficient": False, "confidence": 1.7, "diagnosis": "No item mentions a sunrise painting.",
        "steps": [{"step_id": "time", "useful": False, "quality": -2, "issue": "failed"}],
        "suggested_changes": ["search bm25 for 'sunrise'", " "],
    })))  # fmt: skip
    evaluation = LLMEvaluator(client).evaluate(QUERY, ANALYSIS, RAN, REPORTS, items(3), round_no=1)
    assert not evaluation.sufficient and evaluation.confidence == 1.0
    [assessment] = evaluation.step_assessments
    assert assessment == {"step_id": "time", "useful": False, "quality": 0.0, "issue": "failed"}
    assert evaluation.suggested_changes == ["search bm25 for 'sunrise'"]


def test_evaluator_raises_on_an_unusable_reply(llm_server: Server, client: LLMClient) -> None:
    """A reply off the schema gets the one repair a reply that is no JSON gets, then an LLMError."""
    off = Reply(text='{"verdict": "looks fine"}')
    llm_server.script(off, off, Reply(text="no"), Reply(text="still no"))
    evaluator = LLMEvaluator(client)
    with pytest.raises(LLMError, match="schema"):
        evaluator.evaluate(QUERY, ANALYSIS, RAN, REPORTS, items(3), round_no=1)
    assert "sufficient" in llm_server.requests[1]["messages"][-1]["content"]  # the repair names what is missing
    with pytest.raises(LLMError, match="malformed"):
        evaluator.evaluate(QUERY, ANALYSIS, RAN, REPORTS, items(3), round_no=1)
    assert len(llm_server.requests) == 4


# --- replanner and fingerprints ---------------------------------------------------------------

VERDICT = Evaluation(sufficient=False, confidence=0.3, diagnosis="Nothing dated in May.",
                     suggested_changes=["add a temporal step for May 2023"])  # fmt: skip


def revise(client: LLMClient, registry: IndexRegistry, previous: list[QueryPlan]) -> Any:
    return LLMReplanner(client).revise(QUERY, ANALYSIS, registry.descriptors("u1"), previous, VERDICT,
                                       registry.validate, 10)  # fmt: skip


def test_replanner_returns_a_new_plan(llm_server: Server, client: LLMClient, registry: IndexRegistry) -> None:
    previous = registry.validate(BASELINE)
    llm_server.script(Reply(text=GOOD, input_tokens=1500, output_tokens=250))
    outcome = revise(client, registry, [previous])
    assert outcome.plan is not None and outcome.plan.source == "replan"
    assert plan_fingerprint(outcome.plan) != plan_fingerprint(previous)
    prompt = prompt_of(llm_server.requests[0])
    assert "Nothing dated in May." in prompt and "add a temporal step for May 2023" in prompt
    assert "Plans already run" in prompt and '"top_k":100' in prompt
    assert outcome.usage.cost_usd == pytest.approx(cost((1500, 250)))


def test_replanner_gives_up_when_the_llm_repeats_the_previous_plan(
    llm_server: Server, client: LLMClient, registry: IndexRegistry
) -> None:
    previous = registry.validate(BASELINE)
    # The same plan under another step id and rationale is still the same plan.
    same = plan_json({"step_id": "again", "index": "bm25", "params": {"top_k": 100}, "rationale": "retry"},
                     combination_strategy="weighted_union")  # fmt: skip
    llm_server.script(Reply(text=same), Reply(text=same))
    outcome = revise(client, registry, [previous])
    assert outcome.plan is None and outcome.attempts == 2
    reason = "LLM replan invalid after repair: The plan repeats one already run"
    assert outcome.fallback_reason.startswith(reason)
    assert "repeats one already run" in prompt_of(llm_server.requests[1])


def test_fingerprint_ignores_wording_and_order_but_not_what_runs() -> None:
    a = QueryPlan(query="q", steps=[
        PlanStep(step_id="s1", index="bm25", params={"top_k": 10, "query": "x"}, rationale="one"),
        PlanStep(step_id="s2", index="temporal", depends_on=["s1"], combine="filter_by"),
    ])  # fmt: skip
    renamed = QueryPlan(query="other", source="llm", steps=[
        PlanStep(step_id="t", index="temporal", depends_on=["k"], combine="filter_by", rationale="two"),
        PlanStep(step_id="k", index="bm25", params={"query": "x", "top_k": 10.0}),
    ])  # fmt: skip
    assert plan_fingerprint(a) == plan_fingerprint(renamed)
    assert plan_fingerprint(a) != plan_fingerprint(a.model_copy(update={"combination_strategy": "rrf"}))
    more = a.steps[0].model_copy(update={"params": {"top_k": 11}})
    changed = a.model_copy(update={"steps": [more, a.steps[1]]})
    assert plan_fingerprint(a) != plan_fingerprint(changed)
