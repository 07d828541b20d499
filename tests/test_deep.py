"""deep_memory_search: rules, caller plans, and the LLM paths against a loopback Messages API."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from mnemoplan.errors import InvalidInput
from mnemoplan.search.base import TOP_K_MAX, Hit
from mnemoplan.model import MessageIn, PlanStep, QueryPlan
from mnemoplan.planner.executor import StepResult
from mnemoplan.planner.fingerprint import plan_fingerprint
from mnemoplan.service.service import MemoryService
from tests.conftest import make_service
from tests.llm_server import LoopbackMessagesServer, Reply

HAIKU = "claude-haiku-4-5"  # $1 / $5 per million input / output tokens

CHAT = [
    ("Ann", "I started pottery classes at the Riverside studio last week"),
    ("Ben", "Nice! What did you make first?"),
    ("Ann", "A lopsided blue bowl, but I love it"),
    ("Ben", "My sister Mia moved to Lisbon in May"),
    ("Ann", "Lisbon is lovely, is she teaching there?"),
    ("Ben", "Yes, she teaches chemistry at an international school"),
]


def seed(service: MemoryService) -> None:
    msgs = [MessageIn(content=text, speaker=who) for who, text in CHAT]
    service.remember(messages=msgs, user_id="u", session_id="s1")


class Roles:
    """Answers each LLM role from its own queue; records which roles were asked."""

    def __init__(self) -> None:
        self.queues: dict[str, deque[Reply]] = defaultdict(deque)
        self.asked: list[str] = []

    @staticmethod
    def role(request: dict[str, Any]) -> str:
        system = request.get("system", "")
        system = system if isinstance(system, str) else json.dumps(system)
        if "You revise a retrieval plan" in system:
            return "replan"
        if "You plan retrieval" in system:
            return "plan"
        if "You judge whether memories" in system:
            return "evaluate"
        if "You help search a person's long-term memory" in system:
            return "expand"
        return "rerank"

    def __call__(self, request: dict[str, Any]) -> Reply:
        role = self.role(request)
        self.asked.append(role)
        if self.queues[role]:
            return self.queues[role].popleft()
        if role == "rerank":  # score every listed id 5
            ids = re.findall(r"\[([0-9a-f]{8,})\]", request["messages"][-1]["content"])
            return Reply(json.dumps({"scores": {i: 5 for i in ids}}))
        if role == "evaluate":
            return Reply(json.dumps({"sufficient": True, "confidence": 0.9, "diagnosis": "ok"}))
        if role == "expand":  # nothing to add
            return Reply(json.dumps({"rewrite": "", "hypothetical": ""}))
        return Reply("not json at all")


@pytest.fixture
def llm() -> Iterator[tuple[LoopbackMessagesServer, Roles]]:
    roles = Roles()
    server = LoopbackMessagesServer(responder=roles).start()
    yield server, roles
    server.stop()


@contextmanager
def llm_service(tmp_path: Path, server: LoopbackMessagesServer, **extra: Any) -> Iterator[MemoryService]:
    """A service whose LLM is the loopback server, holding the seed conversation."""
    service = make_service(tmp_path / "data", ANTHROPIC_API_KEY="test-key", ANTHROPIC_BASE_URL=server.url,
                           llm_model=HAIKU, **extra)  # fmt: skip
    try:
        seed(service)
        yield service
    finally:
        service.close()


def plan_reply(*steps: dict[str, Any], tokens: tuple[int, int] = (1000, 200)) -> Reply:
    body = {"steps": list(steps), "combination_strategy": "weighted_union", "expected_answer_type": "text",
            "max_results": 10}  # fmt: skip
    return Reply(json.dumps(body), input_tokens=tokens[0], output_tokens=tokens[1])


def test_rules_only_deep_search_reports_plans_steps_and_stats(service: MemoryService) -> None:
    seed(service)
    result = service.deep_search("Where does Ben's sister teach chemistry?", user_id="u")
    assert "Yes, she teaches chemistry at an international school" in [i.text for i in result.items]
    assert result.plans and result.plans[0].source == "deterministic"
    assert {s.index for s in result.steps} >= {"bm25", "semantic", "fact_store"}
    assert all(s.useful is not None for s in result.steps)
    assert result.stats.rounds == len(result.plans) and result.stats.llm_calls == 0
    assert set(result.stats.durations_ms) >= {"plan", "execute", "rank", "evaluate", "total"}
    fingerprints = [plan_fingerprint(p) for p in result.plans]
    assert len(fingerprints) == len(set(fingerprints))  # never the same plan twice


def test_deep_starts_from_what_recall_found_and_adds_below_it(tmp_path: Path) -> None:
    """Without a judge or a reranker of its own, deep keeps recall's first ten in recall's order,
    and what its own steps found comes after them (deep never ranks below recall)."""
    from mnemoplan.planner.deep_merge import start_from_recall

    service = make_service(tmp_path / "data")
    try:
        notes = [MessageIn(content=f"note {i}: the {w} of the old harbour", speaker="Ann")
                 for i, w in enumerate("lamp boat crane rope net gull pier buoy dock tide mast sail keel".split())]
        service.remember(messages=[*notes, *(MessageIn(content=t, speaker=w) for w, t in CHAT)], user_id="u",
                         session_id="s1")  # fmt: skip
        for query in ("Where does Ben's sister teach chemistry?", "what is at the old harbour?", "pottery bowl"):
            recalled = [i.id for i in service.recall(query, user_id="u", limit=30).items]
            deep = [i.id for i in service.deep_search(query, user_id="u", max_results=30).items]
            assert recalled and deep[: min(10, len(recalled))] == recalled[:10], query
            assert set(recalled) <= set(deep), query  # nothing recall found is dropped
    finally:
        service.close()
    # below the kept ones: recall's order and deep's own, by reciprocal ranks
    from mnemoplan.model import MemoryItem

    def items(*ids: str) -> list[MemoryItem]:
        return [MemoryItem(id=i, kind="message", text=i, occurred_at=datetime(2024, 1, 1, tzinfo=UTC), score=0.0)
                for i in ids]  # fmt: skip

    merged = start_from_recall(items("a", "b", "c", "d"), items("x", "d", "c", "a"), keep=2, share=1.0)
    assert [i.id for i in merged] == ["a", "b", "d", "c", "x"]


def test_without_an_llm_deep_search_re_scores_token_by_token_what_the_token_index_cannot(
    tmp_path: Path,
) -> None:
    question = "Where does Ben's sister teach chemistry?"
    on = make_service(tmp_path / "on")
    off = make_service(tmp_path / "off", deep_token_rerank=0.0)
    try:
        for svc in (on, off):
            seed(svc)
        fused, plain = on.deep_search(question, user_id="u"), off.deep_search(question, user_id="u")
        assert any(s.index == "token_match" and s.count for s in fused.steps)
        assert "rerank" not in fused.stats.durations_ms and not fused.warnings  # the index matched them all
        assert [i.text for i in fused.items] == [i.text for i in plain.items]
        for svc in (on, off):  # a log written before token vectors...
            svc.store.log.tables.records.drop_columns(["tokens"])
            svc.close()
        on, off = make_service(tmp_path / "on"), make_service(tmp_path / "off", deep_token_rerank=0.0)
        for svc in (on, off):  # ...and written to since: the index matches the newer memories only
            svc.remember(messages=[MessageIn(content="My sister moved her chemistry lab", speaker="Ben")],
                         user_id="u", session_id="s2")  # fmt: skip
        result, plain = on.deep_search(question, user_id="u"), off.deep_search(question, user_id="u")
        assert any(s.index == "token_match" and s.count for s in result.steps)
        assert result.items and all("token_match" in i.scores for i in result.items)
        assert "rerank" in result.stats.durations_ms and not result.warnings
        assert [i.score for i in result.items] == sorted((i.score for i in result.items), reverse=True)
        assert sorted(i.text for i in result.items) == sorted(i.text for i in plain.items)  # reordered, not refound
        assert not any("token_match" in i.scores for i in plain.items)
        assert on.ingestor.backfill_tokens("u") > 0  # `mnemoplan reindex`: the index now covers them all
        assert "rerank" not in on.deep_search(question, user_id="u").stats.durations_ms
    finally:
        on.close()
        off.close()


def test_a_token_match_step_on_a_text_of_its_own_leaves_the_token_pass_to_run(service: MemoryService) -> None:
    seed(service)
    reranker = service.deep.llm.reranker
    steps = [s for s in service.explain_plan("chemistry", user_id="u").deep_plan.steps if s.index == "token_match"]
    hit = [Hit(id="x", score=1.0)]
    assert reranker.redundant("chemistry", "u", [StepResult(step=steps[0], hits=hit)])
    own = steps[0].model_copy(update={"params": {**steps[0].params, "query": "a lab"}})
    assert not reranker.redundant("chemistry", "u", [StepResult(step=own, hits=hit)])
    assert not reranker.redundant("chemistry", "u", [StepResult(step=steps[0], hits=[])])


def test_deep_searchs_token_default_does_not_become_recalls_llm_reranker(tmp_path: Path) -> None:
    svc = make_service(tmp_path / "data", recall_rerank="llm")  # no API key: no LLM to rerank with
    try:
        assert svc.deep.recall.reranker is None  # the recall pipeline
        assert type(svc.deep.llm.reranker).__name__ == "LateInteractionReranker"
    finally:
        svc.close()


def test_deep_search_of_a_user_with_no_memories_is_empty_without_failures(service: MemoryService) -> None:
    seed(service)
    service.forget(scope="user", user_id="u")
    for user in ("u", "nobody"):
        result = service.deep_search("Where does Ben's sister teach chemistry?", user_id=user)
        assert result.items == [] and result.warnings == []
        assert all(not step.error for step in result.steps)


def test_an_intersect_step_keeps_what_it_and_its_dependencies_both_found() -> None:
    from mnemoplan.planner.fusion import fuse

    def ran(step_id: str, index: str, ids: str, **kw: Any) -> StepResult:
        step = PlanStep(step_id=step_id, index=index, **kw)
        return StepResult(step, [Hit(rid, 1.0 - i / 10) for i, rid in enumerate(ids.split())])

    a = ran("a", "bm25", "r1 r2 r3")
    b = ran("b", "semantic", "r2 r3 r4 r5", depends_on=["a"], combine="intersect")
    c = ran("c", "temporal", "r1 r9")
    for order in ([a, b, c], [b, c, a]):
        fused = fuse(order, "weighted_union", modes={})
        assert set(fused) == {"r1", "r2", "r3", "r9"}  # a and b both; what c found, b does not depend on
        assert fused["r2"].provenance == ["a", "b"]
    alone = ran("b", "semantic", "r2 r4", combine="intersect")  # no dependency: every step before it
    assert set(fuse([a, alone], "rrf", modes={})) == {"r2"}
    rescored = ran("f", "token_match", "r1 r2", combine="filter_by")  # re-scores, adds nothing: no rescue
    assert set(fuse([a, rescored, b], "weighted_union", modes={})) == {"r2", "r3"}


def test_rules_replan_when_key_terms_are_missing(service: MemoryService) -> None:
    seed(service)
    result = service.deep_search("Which orchestra instrument does Ann rehearse on Thursdays?", user_id="u")
    assert result.stats.rounds >= 2 and not result.evaluations[0]["sufficient"]
    assert result.plans[1].source == "replan"


def test_without_an_llm_a_search_does_not_depend_on_the_searches_before_it(
    service: MemoryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mnemoplan.planner import deep

    seed(service)
    real = deep.evaluate

    def second_round_suffices(analysis: Any, results: Any, items: Any) -> Any:  # the rules' verdict, scripted
        verdict = real(analysis, results, items)
        return dataclasses.replace(verdict, sufficient=any(r.step.step_id == "hier" for r in results))

    monkeypatch.setattr(deep, "evaluate", second_round_suffices)
    question = "Which orchestra instrument does Ann rehearse on Thursdays?"
    now = datetime.now(UTC)  # one 'now' for both: recency moves with the clock, on a loaded machine visibly
    first = service.deep_search(question, user_id="u", reference_time=now)
    assert [p.source for p in first.plans] == ["deterministic", "replan"] and first.sufficient
    again = service.deep_search(question, user_id="u", reference_time=now)  # the revision that worked is not reused...
    assert [p.steps for p in again.plans] == [p.steps for p in first.plans]
    assert [(i.id, i.score) for i in again.items] == [(i.id, i.score) for i in first.items]
    assert not service.explain_plan(question, user_id="u").cached_plan  # ...and not cached


def test_a_caller_plan_runs_exactly_as_given(service: MemoryService) -> None:
    seed(service)
    plan = QueryPlan(query="pottery", steps=[PlanStep(step_id="only", index="bm25", params={"top_k": 3})])
    result = service.deep_search("pottery", user_id="u", plan=plan)
    assert result.stats.rounds == 1 and [s.step_id for s in result.steps] == ["only"]
    assert result.plans[0].steps == plan.steps and result.plans[0].source == "caller"
    assert len(result.items) <= 3 and not result.warnings
    other = service.deep_search("Where does Ann live?", user_id="u", plan=plan)
    assert [i.id for i in other.items] == [i.id for i in result.items]  # the plan's query is searched...
    assert any("plan's query 'pottery' was searched" in w for w in other.warnings)  # ...and it says so


def test_explain_plan_gives_the_servers_own_cap_on_max_results(service: MemoryService) -> None:
    schema = service.explain_plan("pottery", user_id="u", full=True).plan_schema
    assert schema["properties"]["max_results"]["maximum"] == service.limits.deep_max_results == 30


def test_a_caller_plans_max_results_holds_unless_the_call_sets_its_own(service: MemoryService) -> None:
    turns = [MessageIn(content=f"pottery note {i}: glazing, kilns and clay", speaker="Ann") for i in range(8)]
    service.remember(messages=turns, user_id="u", session_id="s1")
    plan = QueryPlan(query="pottery", steps=[PlanStep(step_id="s", index="bm25", params={"top_k": 20})], max_results=2)
    assert len(service.deep_search("pottery", user_id="u", plan=plan).items) == 2
    assert len(service.deep_search("pottery", user_id="u", plan=plan, max_results=4).items) == 4
    with pytest.raises(InvalidInput, match="plan.max_results must be between 1 and 30"):
        service.deep_search("pottery", user_id="u", plan=plan.model_copy(update={"max_results": 40}))


def test_llm_plan_is_used_and_cost_comes_from_reported_usage(tmp_path: Path, llm: Any) -> None:
    server, roles = llm
    with llm_service(tmp_path, server) as service:
        roles.queues["plan"].append(plan_reply({"step_id": "kw", "index": "bm25", "params": {"top_k": 20}}))
        result = service.deep_search("pottery studio", user_id="u")
        assert result.plans[0].source == "llm" and [s.step_id for s in result.plans[0].steps] == ["kw"]
        assert roles.asked[:3] == ["plan", "expand", "evaluate"] and "rerank" in roles.asked
        assert result.stats.llm_calls == len(roles.asked)
        # The planner's reply reported 1000/200 tokens; every other scripted reply 10/5.
        tokens_in = 1000 + 10 * (len(roles.asked) - 1)
        tokens_out = 200 + 5 * (len(roles.asked) - 1)
        assert result.stats.input_tokens == tokens_in and result.stats.output_tokens == tokens_out
        assert result.stats.cost_usd == pytest.approx((tokens_in * 1.0 + tokens_out * 5.0) / 1e6)


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        ([Reply("no json here"), Reply("still { not json")], "malformed"),
        ([Reply(status=500), Reply(status=500)], "500"),
        ([Reply(plan_reply().text, delay_s=600)], "timed out"),  # answered only when the server stops
    ],
)
def test_llm_planner_failures_fall_back_to_the_rules_and_say_so(
    tmp_path: Path, llm: Any, failure: list[Reply], reason: str
) -> None:
    server, roles = llm
    # Long enough for any answer that does come, on a busy machine too.
    with llm_service(tmp_path, server, llm_timeout_s=3.0) as service:
        roles.queues["plan"].extend(failure)
        result = service.deep_search("pottery studio", user_id="u")
        assert result.plans[0].source == "deterministic"
        warning = next(w for w in result.warnings if "planner fell back" in w)
        assert reason in warning.lower()
        assert result.items  # the search itself still worked


@pytest.mark.parametrize("caller_plan", [False, True], ids=["planned", "caller plan"])
def test_an_endpoint_answering_anything_but_messages_degrades_every_llm_step(
    tmp_path: Path, caller_plan: bool
) -> None:
    """An endpoint that answers 200 with a page that is not JSON: every LLM step falls back, with a
    warning, and the search answers from the rules (it was an internal error on every call)."""
    page = Reply(body=b"<html><body>Service temporarily unavailable</body></html>", content_type="text/html")
    with LoopbackMessagesServer(responder=lambda _: page) as server, llm_service(tmp_path, server) as service:
        plan = service.explain_plan("pottery studio", user_id="u").deep_plan if caller_plan else None
        result = service.deep_search("pottery studio", user_id="u", plan=plan)
        assert "I started pottery classes at the Riverside studio last week" in [i.text for i in result.items]
        assert server.requests and result.warnings
        roles = {"plan": "planner fell back", "evaluate": "evaluator fell back", "rerank": "rerank batch"}
        for role in {Roles.role(r) for r in server.requests} - {"expand"}:
            assert any(roles[role] in w and "not a Messages API reply" in w for w in result.warnings), role
        if not caller_plan:
            assert any("expansion skipped" in w for w in result.warnings)


def test_one_deadline_bounds_deep_search_llm_waits_included(tmp_path: Path) -> None:
    """An endpoint that never answers: each LLM step used to wait its own timeout (68 s at the
    defaults). Now every request waits at most what is left of the search's deadline, and once
    it has passed no LLM is asked; the search answers from the rules and says why."""
    hang = Reply(text="{}", delay_s=600)  # answered only when the server stops
    with LoopbackMessagesServer(responder=lambda _: hang) as server, \
            llm_service(tmp_path, server, llm_timeout_s=5.0, deep_deadline_s=1.0) as service:  # fmt: skip
        result = service.deep_search("pottery studio", user_id="u")
        timeouts = [float({k.lower(): v for k, v in h.items()}["x-stainless-read-timeout"])
                    for h in server.request_headers]  # fmt: skip
    assert timeouts and all(t <= 1.0 for t in timeouts)  # the SDK sends each request's timeout along
    assert "I started pottery classes at the Riverside studio last week" in [i.text for i in result.items]
    assert any("planner fell back" in w and "timed out" in w for w in result.warnings)
    assert any("deadline of 1 s reached" in w and "MNEMOPLAN_DEEP_DEADLINE_S" in w for w in result.warnings)


def test_insufficient_then_replanned_then_sufficient_in_round_two(tmp_path: Path, llm: Any) -> None:
    server, roles = llm
    with llm_service(tmp_path, server) as service:
        roles.queues["plan"].append(plan_reply({"step_id": "kw", "index": "bm25", "params": {"top_k": 2}}))
        roles.queues["evaluate"].append(Reply(json.dumps({
            "sufficient": False, "confidence": 0.2, "diagnosis": "nothing about her job",
            "step_assessments": [{"step_id": "kw", "useful": False, "quality": 0.1, "issue": "too narrow"}],
            "suggested_changes": ["add semantic search"]})))  # fmt: skip
        roles.queues["replan"].append(plan_reply(
            {"step_id": "kw", "index": "bm25", "params": {"top_k": 20}},
            {"step_id": "sem", "index": "semantic", "params": {"top_k": 20}}))  # fmt: skip
        roles.queues["evaluate"].append(Reply(json.dumps({"sufficient": True, "confidence": 0.8, "diagnosis": "found"})))
        result = service.deep_search("Where does Mia teach chemistry?", user_id="u")
        assert result.stats.rounds == 2 and result.sufficient
        assert [p.source for p in result.plans] == ["llm", "replan"]
        assert [e["sufficient"] for e in result.evaluations] == [False, True]
        assert result.steps[0].issue == "too narrow" and result.steps[0].round == 1
        assert "Yes, she teaches chemistry at an international school" in [i.text for i in result.items]
        # The plan that worked is cached for queries of the same shape.
        assert service.explain_plan("Where does Mia teach physics?", user_id="u").cached_plan


def test_a_cached_plan_that_falls_short_stops_pre_empting_the_planner(tmp_path: Path, llm: Any) -> None:
    server, roles = llm
    question = "Where does Mia teach chemistry?"
    with llm_service(tmp_path, server) as service:
        roles.queues["plan"].append(plan_reply({"step_id": "kw", "index": "bm25", "params": {"top_k": 20}}))
        service.deep_search(question, user_id="u")  # judged sufficient: the LLM's plan is cached
        assert service.explain_plan(question, user_id="u").cached_plan
        roles.asked.clear()
        roles.queues["evaluate"].append(Reply(json.dumps({"sufficient": False, "confidence": 0.1,
                                                          "diagnosis": "wrong memories"})))  # fmt: skip
        result = service.deep_search(question, user_id="u")
        assert result.plans[0].source == "cache" and "plan" not in roles.asked
        assert not service.explain_plan(question, user_id="u").cached_plan
        roles.asked.clear()
        service.deep_search(question, user_id="u")
        assert roles.asked[0] == "plan"  # the planner is asked again


def test_a_malformed_rerank_reply_keeps_the_order_and_is_counted(tmp_path: Path, llm: Any) -> None:
    server, roles = llm
    with llm_service(tmp_path, server) as service:
        roles.queues["rerank"].extend([Reply("nope"), Reply("still nope")])
        result = service.deep_search("pottery studio", user_id="u")
        assert result.stats.rerank_fallbacks >= 1
        assert any("rerank" in w.lower() for w in result.warnings)
        assert result.items


def test_llm_rewrite_and_hypothetical_memory_add_steps_and_stay_out_of_the_cache(tmp_path: Path, llm: Any) -> None:
    server, roles = llm
    with llm_service(tmp_path, server) as service:
        roles.queues["plan"].append(plan_reply({"step_id": "kw", "index": "bm25", "params": {"top_k": 5}},
                                               {"step_id": "sem", "index": "semantic", "params": {"top_k": 5}}))
        hypothetical = "My first piece was a little bowl I glazed blue"
        roles.queues["expand"].append(Reply(json.dumps({"rewrite": "Ann first made pottery bowl class",
                                                        "hypothetical": hypothetical})))  # fmt: skip
        result = service.deep_search("What was the first thing Ann made?", user_id="u")
        steps = {s.step_id: s for s in result.plans[0].steps}
        assert steps["hyde"].index == "semantic" and steps["hyde"].params["query"] == hypothetical
        assert steps["rewrite"].index == "bm25" and steps["rewrite"].params["top_k"] == 5
        assert {"hyde", "rewrite"} <= {s.step_id for s in result.steps if s.count}
        assert "A lopsided blue bowl, but I love it" in [i.text for i in result.items[:3]]
        assert not result.warnings or not any("expansion" in w for w in result.warnings)
        cached = service.explain_plan("What was the first thing Ben made?", user_id="u")
        assert cached.cached_plan and {s.step_id for s in cached.deep_plan.steps} == {"kw", "sem"}


def test_a_failed_expansion_searches_with_the_query_alone_and_says_so(tmp_path: Path, llm: Any) -> None:
    server, roles = llm
    with llm_service(tmp_path, server) as service:
        roles.queues["expand"].extend([Reply("no json"), Reply("still no json")])
        result = service.deep_search("pottery studio", user_id="u")
        assert any(w.startswith("query expansion skipped") for w in result.warnings)
        assert not {"hyde", "rewrite"} & {s.step_id for s in result.steps} and result.items


def test_a_cached_template_drops_steps_that_depended_on_the_expansion(service: MemoryService) -> None:
    seed(service)
    analysis = service.recall_pipeline.analyzer.analyze("Where does Mia teach?", "u")
    plan = QueryPlan(query="Where does Mia teach?", source="llm", steps=[
        PlanStep(step_id="bm25", index="bm25"), PlanStep(step_id="rewrite", index="bm25", params={"query": "Mia job"}),
        PlanStep(step_id="walk", index="graph_traversal", depends_on=["bm25", "rewrite"])])  # fmt: skip
    service.deep._remember_plan(analysis, plan)
    cached = service.deep.cache.get(analysis)
    assert cached is not None and [s.step_id for s in cached.steps] == ["bm25", "walk"]
    assert cached.steps[1].depends_on == ["bm25"]
    assert service.recall_pipeline.registry.validate(cached)


def test_widening_stops_at_the_largest_list_an_index_serves(service: MemoryService) -> None:
    # A widened plan that worked is cached by query shape; the next query of that shape starts
    # from it and may widen again: without a bound the lists doubled until Tantivy aborted.
    seed(service)
    question = "Which orchestra instrument does Ann rehearse on Thursdays?"  # judged insufficient: widens
    analysis = service.recall_pipeline.analyzer.analyze(question, "u")
    for _ in range(12):
        result = service.deep_search(question, user_id="u")
        assert all(int(s.params.get("top_k", 0)) <= TOP_K_MAX for p in result.plans for s in p.steps)
        service.deep._remember_plan(analysis, result.plans[-1])  # as if the last round had been judged enough
    cached = service.deep.cache.get(analysis)
    assert cached is not None and max(int(s.params.get("top_k", 0)) for s in cached.steps) == TOP_K_MAX


def test_a_template_replaced_meanwhile_is_not_discarded_for_its_predecessor(service: MemoryService) -> None:
    seed(service)
    analysis = service.recall_pipeline.analyzer.analyze("Where does Mia teach?", "u")
    old = QueryPlan(query="Where does Mia teach?", source="llm", steps=[PlanStep(step_id="kw", index="bm25")])
    new = QueryPlan(query="Where does Mia teach?", source="llm", steps=[PlanStep(step_id="sem", index="semantic")])
    service.deep.cache.put(analysis, old)
    used = service.deep.cache.get(analysis)
    service.deep.cache.put(analysis, new)  # another search cached a better plan meanwhile
    assert used is not None and not service.deep.cache.discard(analysis, used)
    assert service.deep.cache.has(analysis)
    assert service.deep.cache.discard(analysis, service.deep.cache.get(analysis))  # type: ignore[arg-type]
    assert not service.deep.cache.has(analysis)
