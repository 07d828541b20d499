"""The LLM's part in deep search: write a plan, judge what it found, and write a better one.

Each role sends one compact JSON-only prompt through ``LLMClient`` and parses the reply with
pydantic. A plan that does not parse or validate gets one repair call that shows the model
the error and its own JSON; after that the caller falls back to the deterministic path, told
why in ``PlannerOutcome.fallback_reason``. Prompts carry only what the caller passes in: the
query, its analysis, the user's descriptors, plans and the items retrieved for this query.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from mnemoplan.errors import InvalidInput, InvalidPlan, LLMError
from mnemoplan.model import (
    IndexDescriptor,
    PlanStep,
    QueryAnalysis,
    QueryPlan,
)
from mnemoplan.planner.evaluate import Evaluation
from mnemoplan.planner.fingerprint import plan_fingerprint
from mnemoplan.inference.llm import LLMClient, LLMUsage
from mnemoplan.inference.llm_json import JSON_ONLY, describe
from mnemoplan.planner.llm.prompts import PLANNER_INSTRUCTIONS, analysis_json, compact
from mnemoplan.planner.llm.protocols import PlannerOutcome, Validate

def _choices(name: str, model: type[BaseModel] = QueryPlan) -> str:
    # Spelled from the model's own Literal types, so the prompt cannot drift from the schema.
    return " | ".join(json.dumps(v) for v in get_args(model.model_fields[name].annotation))


PLAN_SCHEMA_TEXT = (
    '{"steps": [{"step_id": "s1", "index": "<index name>", "params": {"<param>": <value>}, '
    '"rationale": "<why, a few words>", "depends_on": ["<earlier step_id>"], '
    f'"combine": {_choices("combine", PlanStep)}, "weight": <0-10>}}], '
    f'"combination_strategy": {_choices("combination_strategy")}, '
    f'"expected_answer_type": {_choices("expected_answer_type")}, "max_results": <1-{{max_results}}>}}'
)



def _rules(instructions: str) -> str:
    # The instructions were written for a calling agent: their schema sketch repeats
    # PLAN_SCHEMA_TEXT (tokens), and their last sentence (handing a plan back through a tool)
    # would only confuse a model that answers with the plan itself.
    _, sep, rest = instructions.partition("Rules:")
    return (sep + rest if sep else instructions).partition("Pass the plan back")[0].strip()


_RULES = _rules(PLANNER_INSTRUCTIONS)

PLANNER_SYSTEM = (
    f"You plan retrieval over one user's long-term memory.\n{_RULES}\n"
    "Tune the params to the query (keywords, entities, time window). " + JSON_ONLY
)
REPLANNER_SYSTEM = (
    "You revise a retrieval plan over one user's long-term memory after it did not find enough.\n"
    + _RULES.replace("Start from deep_plan", "Start from the last plan run") + "\n"
    "Address the diagnosis: change indexes, params (query text, top_k, time bounds, kinds) or the "
    "combination. Never repeat a plan already run. " + JSON_ONLY
)
_MAX_BAD_JSON_CHARS = 4000
_PLAN_FIELDS = ("steps", "combination_strategy", "expected_answer_type", "max_results")
_RESULTS_CAP = next(m.le for m in QueryPlan.model_fields["max_results"].metadata if hasattr(m, "le"))


class _PlanWriter:
    """Shared set-up of the LLM roles that write plans.

    Args:
        client: The shared LLM client.
        max_tokens: Cap on the plan reply's length.
    """

    def __init__(self, client: LLMClient, *, max_tokens: int = 1500) -> None:
        self._client = client
        self._max_tokens = max_tokens


class LLMPlanner(_PlanWriter):
    """Asks the LLM for a plan, starting from the deterministic one."""

    def plan(
        self,
        query: str,
        analysis: QueryAnalysis,
        descriptors: list[IndexDescriptor],
        baseline: QueryPlan,
        validate: Validate,
        max_results: int,
        *,
        deadline: float | None = None,
    ) -> PlannerOutcome:
        """Write a plan for the query, repairing it once if it does not validate.

        Args:
            query: The user's query.
            analysis: The deterministic analysis of the query.
            descriptors: The indexes the plan may use.
            baseline: The deterministic plan, offered as a starting point.
            validate: Checks a plan (usually ``IndexRegistry.validate``); raises ``InvalidPlan``.
            max_results: Upper bound for the plan's ``max_results``.
            deadline: ``time.monotonic()`` instant every LLM request (the repair too) ends by.

        Returns:
            The outcome: a validated plan with source ``llm``, or None with the reason.
        """
        prompt = "\n".join([
            _context(query, analysis, descriptors),
            f"deep_plan (baseline): {_plan_json(baseline)}",
            _ask(max_results),
        ])  # fmt: skip

        def build(data: Any) -> QueryPlan:
            return validate(_parse_plan(data, query, analysis, max_results, source="llm"))

        return _plan_with_repair(self._client, PLANNER_SYSTEM, prompt, build, self._max_tokens, "plan",
                                 deadline)  # fmt: skip


class LLMReplanner(_PlanWriter):
    """Asks the LLM for a different plan after an evaluation found the results lacking."""

    def revise(
        self,
        query: str,
        analysis: QueryAnalysis,
        descriptors: list[IndexDescriptor],
        previous: list[QueryPlan],
        evaluation: Evaluation,
        validate: Validate,
        max_results: int,
        *,
        deadline: float | None = None,
    ) -> PlannerOutcome:
        """Write a plan unlike every previous one that addresses the evaluation.

        A plan that does not validate, or repeats a previous plan (same ``plan_fingerprint``),
        gets one repair call; after that the outcome has no plan.

        Args:
            query: The user's query.
            analysis: The deterministic analysis of the query.
            descriptors: The indexes the plan may use.
            previous: Plans already run, oldest first.
            evaluation: The judgement of the last round.
            validate: Checks a plan (usually ``IndexRegistry.validate``); raises ``InvalidPlan``.
            max_results: Upper bound for the plan's ``max_results``.

        Returns:
            The outcome: a new validated plan with source ``replan``, or None with the reason.
        """
        seen = {plan_fingerprint(p) for p in previous}
        judged = {
            "diagnosis": evaluation.diagnosis,
            "suggested_changes": evaluation.suggested_changes,
            "step_assessments": evaluation.step_assessments,
        }
        prompt = "\n".join([
            _context(query, analysis, descriptors),
            "Plans already run (do not repeat any):",
            *(f"{n}. {_plan_json(p)}" for n, p in enumerate(previous, 1)),
            f"Evaluation of the last plan: {compact(judged)}",
            _ask(max_results),
        ])  # fmt: skip

        def build(data: Any) -> QueryPlan:
            plan = validate(_parse_plan(data, query, analysis, max_results, source="replan"))
            if plan_fingerprint(plan) in seen:
                raise InvalidPlan(
                    "The plan repeats one already run (same indexes, params and combination).",
                    hint="Change an index, a parameter or the combination as the evaluation suggests.",
                )
            return plan

        return _plan_with_repair(self._client, REPLANNER_SYSTEM, prompt, build, self._max_tokens, "replan",
                                 deadline)  # fmt: skip


def _plan_with_repair(
    client: LLMClient, system: str, prompt: str, build: Callable[[Any], QueryPlan], max_tokens: int,
    role: str, deadline: float | None = None,
) -> PlannerOutcome:
    """Ask for a plan; on a rejected one, ask once more with the error and the bad JSON.

    ``role`` is ``plan`` or ``replan``: the purpose label, and the subject of fallback reasons
    ("LLM planner timed out", "LLM plan invalid after repair: ...").
    """
    usage = LLMUsage()
    ask = prompt
    problem: InvalidInput | None = None
    for attempt in (1, 2):
        try:
            reply = client.complete_json(system=system, prompt=ask, max_tokens=max_tokens, purpose=role,
                                         deadline=deadline)  # fmt: skip
        except LLMError as err:
            # The client keeps a failed call's tokens in its own totals only; count the failure here.
            usage.add(LLMUsage(calls=1, failures=1))
            what = "timed out" if "timeout" in err.message else f"failed: {err.message}"
            return PlannerOutcome(None, usage, attempt, f"LLM {role}ner {what}")  # planner, replanner
        usage.add(reply.usage)
        try:
            return PlannerOutcome(build(reply.data), usage, attempt)
        except InvalidInput as err:
            problem = err
        bad = compact(reply.data)[:_MAX_BAD_JSON_CHARS]
        hint = f" Hint: {problem.hint}" if problem.hint else ""
        ask = (
            f"{prompt}\nYour previous reply was rejected.\nReply: {bad}\nError: {problem.message}{hint}\n"
            "Reply with the corrected plan as one JSON object."
        )
    assert problem is not None  # the loop only ends here after a rejection
    return PlannerOutcome(None, usage, 2, f"LLM {role} invalid after repair: {problem.message}")


def _parse_plan(
    data: Any, query: str, analysis: QueryAnalysis, max_results: int, *, source: str
) -> QueryPlan:
    """The reply as a QueryPlan for this query: identity fields forced, max_results capped.

    Raises:
        InvalidPlan: The reply is not a plan object, or does not match the schema.
    """
    if isinstance(data, dict) and "steps" not in data and isinstance(data.get("plan"), dict):
        data = data["plan"]  # models like to wrap the answer in a named envelope
    if not isinstance(data, dict):
        raise InvalidPlan("The reply is not a JSON object.", hint="Reply with one plan object, not a list.")
    # Keys the model must not choose (query, source, analysis) or that are its own notes are dropped.
    fields = {k: data[k] for k in _PLAN_FIELDS if k in data}
    cap = max(1, min(max_results, _RESULTS_CAP))
    requested = fields.get("max_results", cap)
    number = isinstance(requested, int | float) and not isinstance(requested, bool)
    fields["max_results"] = max(1, min(int(requested), cap)) if number else cap
    try:
        return QueryPlan.model_validate(
            {**fields, "name": source, "query": query, "analysis": analysis, "source": source}
        )
    except ValidationError as err:
        raise InvalidPlan(
            f"The plan does not match the schema: {describe(err)}",
            hint="Use exactly the keys of the schema; every step needs step_id and index.",
        ) from None


def _context(query: str, analysis: QueryAnalysis, descriptors: list[IndexDescriptor]) -> str:
    return "\n".join([
        f"Query: {json.dumps(query, ensure_ascii=False)}",
        f"Analysis: {analysis_json(analysis)}",
        f"Indexes: {compact([_descriptor(d) for d in descriptors])}",
    ])  # fmt: skip


def _ask(max_results: int) -> str:
    cap = max(1, min(max_results, _RESULTS_CAP))
    return "Reply with the plan as JSON: " + PLAN_SCHEMA_TEXT.replace("{max_results}", str(cap))


def _descriptor(d: IndexDescriptor) -> dict[str, Any]:
    # Only what helps choose and parameterise an index; empty fields cost tokens and say nothing.
    params = [
        {k: v for k, v in p.model_dump(mode="json").items() if v is not None and v != "" and v is not False}
        for p in d.query_params
    ]  # fmt: skip
    out = {"name": d.name, "description": d.description, "best_for": d.best_for, "query_params": params,
           "returns": d.returns, "examples": d.examples, "available": d.available}  # fmt: skip
    return {k: v for k, v in out.items() if v not in ([], "")}


def _plan_json(plan: QueryPlan) -> str:
    # What the plan does, defaults left out (tokens); the rationale is the old plan's, not news.
    keep = {"step_id", "index", "params", "depends_on", "combine", "weight"}
    steps = [s.model_dump(mode="json", include=keep, exclude_defaults=True) for s in plan.steps]
    return compact({
        "steps": steps, "combination_strategy": plan.combination_strategy,
        "expected_answer_type": plan.expected_answer_type, "max_results": plan.max_results,
    })  # fmt: skip


