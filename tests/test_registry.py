"""Plans validate against the registry; a new index plugs in without touching planner or server."""

from __future__ import annotations

import pytest

from mnemoplan.errors import InvalidPlan
from mnemoplan.search.base import Hit, SearchIndex, SearchRequest
from mnemoplan.model import IndexDescriptor, ParamSpec, PlanStep, QueryPlan
from mnemoplan.service.service import MemoryService


def plan(*steps: PlanStep) -> QueryPlan:
    return QueryPlan(query="q", steps=list(steps))


def test_unknown_index_lists_the_valid_ones(service: MemoryService) -> None:
    with pytest.raises(InvalidPlan) as err:
        service.registry.validate(plan(PlanStep(step_id="a", index="telepathy")))
    assert "telepathy" in err.value.message and "bm25" in err.value.hint and "semantic" in err.value.hint


def test_unknown_parameter_and_bad_type(service: MemoryService) -> None:
    with pytest.raises(InvalidPlan) as err:
        service.registry.validate(plan(PlanStep(step_id="a", index="bm25", params={"topk": 5})))
    assert "topk" in err.value.message and "top_k" in err.value.hint
    with pytest.raises(InvalidPlan) as err:
        service.registry.validate(plan(PlanStep(step_id="a", index="bm25", params={"top_k": "many"})))
    assert "integer" in err.value.message


def test_a_kind_that_does_not_exist_is_refused_with_the_kinds_that_do(service: MemoryService) -> None:
    for index in ("bm25", "semantic", "token_match"):
        with pytest.raises(InvalidPlan) as err:
            service.registry.validate(plan(PlanStep(step_id="a", index=index, params={"kinds": ["fact", "bogus"]})))
        assert "'bogus'" in err.value.message and "message, fact, procedure" in err.value.hint
    with pytest.raises(InvalidPlan, match="'episode'"):  # the token index holds no summaries
        service.registry.validate(plan(PlanStep(step_id="a", index="token_match", params={"kinds": ["episode"]})))
    ok = service.registry.validate(plan(PlanStep(step_id="a", index="bm25", params={"kinds": "fact"})))
    assert ok.steps[0].params["kinds"] == ["fact"]


@pytest.mark.parametrize("top_k", [0, -3, 10**12])
def test_numbers_out_of_range_are_refused_with_the_range(service: MemoryService, top_k: int) -> None:
    with pytest.raises(InvalidPlan) as err:  # a huge top_k once made Tantivy reserve 26 GB and abort
        service.registry.validate(plan(PlanStep(step_id="a", index="bm25", params={"top_k": top_k})))
    assert "between 1 and 1000" in err.value.message
    with pytest.raises(InvalidPlan, match="between 0 and 1"):
        service.registry.validate(plan(PlanStep(step_id="a", index="working_memory", params={"query_weight": 2})))
    for nonsense in (float("nan"), float("inf")):
        with pytest.raises(InvalidPlan, match="must be of type number"):
            service.registry.validate(plan(PlanStep(step_id="a", index="semantic", params={"min_similarity": nonsense})))
    for nonsense in (10**400, float("inf"), -float("inf")):  # what json.loads makes of 1e999
        with pytest.raises(InvalidPlan, match="must be of type integer"):
            service.registry.validate(plan(PlanStep(step_id="a", index="bm25", params={"top_k": nonsense})))


def test_a_null_parameter_is_refused_not_run(service: MemoryService) -> None:
    """What the MCP SDK's client sends for NaN or an infinity is null: refused like them, with the
    default to leave it out for, rather than passed to the index (which failed with a TypeError)."""
    service.remember(content="tulips came up red", user_id="u")
    with pytest.raises(InvalidPlan) as err:
        service.registry.validate(plan(PlanStep(step_id="a", index="semantic", params={"min_similarity": None})))
    assert "min_similarity" in err.value.message and "null" in err.value.message
    assert "leave it out" in err.value.hint and "0.15" in err.value.hint
    caller = QueryPlan(query="tulips", steps=[PlanStep(step_id="a", index="semantic", params={"min_similarity": None})])
    with pytest.raises(InvalidPlan, match="min_similarity"):
        service.deep_search("tulips", user_id="u", plan=caller)
    left_out = QueryPlan(query="tulips", steps=[PlanStep(step_id="a", index="semantic")])
    assert [i.text for i in service.deep_search("tulips", user_id="u", plan=left_out).items] == ["tulips came up red"]


def test_a_plan_has_a_bounded_number_of_steps(service: MemoryService) -> None:
    steps = [PlanStep(step_id=f"s{i}", index="bm25") for i in range(33)]
    with pytest.raises(InvalidPlan, match="at most 32"):
        service.registry.validate(plan(*steps))
    assert service.registry.validate(plan(*steps[:32]))


def test_dependency_cycles_and_unknown_dependencies(service: MemoryService) -> None:
    with pytest.raises(InvalidPlan, match="cycle"):
        service.registry.validate(plan(
            PlanStep(step_id="a", index="bm25", depends_on=["b"]),
            PlanStep(step_id="b", index="semantic", depends_on=["a"]),
        ))  # fmt: skip
    with pytest.raises(InvalidPlan, match="unknown step"):
        service.registry.validate(plan(PlanStep(step_id="a", index="bm25", depends_on=["zz"])))
    with pytest.raises(InvalidPlan, match="Duplicate"):
        service.registry.validate(plan(PlanStep(step_id="a", index="bm25"), PlanStep(step_id="a", index="bm25")))


def test_datetime_parameters_are_parsed(service: MemoryService) -> None:
    checked = service.registry.validate(
        plan(PlanStep(step_id="t", index="temporal", params={"start": "2023-05-01", "end": "2023-06-01T00:00:00Z"}))
    )
    assert checked.steps[0].params["start"].year == 2023
    with pytest.raises(InvalidPlan, match="is not before end"):
        service.registry.validate(
            plan(PlanStep(step_id="t", index="temporal", params={"start": "2023-06-01", "end": "2023-05-01"}))
        )


class KeywordCountIndex(SearchIndex):
    """A toy index: records whose text contains a given word, found through the log."""

    descriptor = IndexDescriptor(
        name="contains_word",
        description="Records containing a word, verbatim.",
        stores="nothing of its own",
        query_params=[ParamSpec(name="word", type="string", required=True, description="the word")],
    )

    def __init__(self, service: MemoryService) -> None:
        self._service = service

    def search(self, req: SearchRequest) -> list[Hit]:
        word = req.params["word"]
        rows = self._service.store.log.select(f"user_id = '{req.user_id}'", ["id", "text"])
        return [Hit(r["id"], 1.0, self.name) for r in rows if word in r["text"].split()]


def test_a_new_index_needs_only_an_adapter_and_a_registration(service: MemoryService) -> None:
    service.remember(content="the blue heron landed", user_id="u")
    service.remember(content="a grey heron flew off", user_id="u")
    service.registry.register(KeywordCountIndex(service))
    assert "contains_word" in [d.name for d in service.explain_plan("heron", user_id="u", full=True).indexes]
    custom = plan(PlanStep(step_id="w", index="contains_word", params={"word": "blue"}))
    result = service.deep_search("heron", user_id="u", plan=custom)
    assert [i.text for i in result.items] == ["the blue heron landed"]
    with pytest.raises(InvalidPlan, match="missing required"):
        service.deep_search("heron", user_id="u", plan=plan(PlanStep(step_id="w", index="contains_word")))
