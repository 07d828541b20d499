"""deep_memory_search: plan, execute, judge, re-plan when not enough, rerank.

A plan comes from the caller (run exactly as given), the plan cache (a plan an LLM wrote
that worked for a query of the same shape), the LLM planner when configured, or the
deterministic rules. Each round's results join those of earlier rounds; an evaluator (the LLM's, else
the rules') judges them, and a replanner proposes the next plan, never one that ran.
Every degraded component (an LLM fallback, a failed step, a reranker timeout) leaves a
warning in the result. One deadline bounds the whole search: each LLM call waits at most
what is left of it, and once it has passed no LLM is asked again and no new round starts
(the first round always runs: it is local work, and the rules' answer).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from mnemoplan.errors import InvalidPlan, LLMError
from mnemoplan.inference.llm import LLMUsage
from mnemoplan.inference.llm_calls import llm_scope
from mnemoplan.search.base import widened
from mnemoplan.model import (
    DeepSearchResult,
    DeepSearchStats,
    ExplainPlanResult,
    IndexDescriptor,
    MemoryItem,
    PlanStep,
    QueryAnalysis,
    QueryPlan,
    StepReport,
)
from mnemoplan.planner.evaluate import Evaluation, assess_steps, evaluate, revise
from mnemoplan.planner.confidence import no_match_context
from mnemoplan.planner.deterministic import verbose_weight
from mnemoplan.planner.fingerprint import plan_fingerprint
from mnemoplan.planner.formatter import format_context
from mnemoplan.planner.deep_merge import start_from_recall
from mnemoplan.planner.executor import StepResult
from mnemoplan.planner.llm.prompts import PLANNER_INSTRUCTIONS
from mnemoplan.planner.llm.protocols import Evaluator, Expander, Planner, Replanner
from mnemoplan.planner.plan_cache import PlanCache
from mnemoplan.planner.recall import RecallConfig, RecallPipeline, Scope, keyword_only
from mnemoplan.planner.rerank.base import Reranker, SkippableReranker

log = logging.getLogger(__name__)

EXPANSION_STEP_IDS = frozenset({"rewrite", "hyde"})  # see planner.llm.expander

@dataclass
class LLMParts:
    """The LLM-backed components; any may be None (then the deterministic one is used)."""

    planner: Planner | None = None
    evaluator: Evaluator | None = None
    replanner: Replanner | None = None
    reranker: Reranker | None = None
    expander: Expander | None = None  # query rewrite and HyDE (planner.llm.expander)


@dataclass(frozen=True)
class DeepConfig:
    """Knobs of deep search.

    Attributes:
        max_rounds: Rounds of plan -> execute -> judge before giving up.
        weights: Fusion weights by index (0.5/0.5, the best measured on LoCoMo: bench/README.md).
        recency_weight: Weight of the recency prior (0.10), with ``recency_half_life_days``.
        widen: Factor on the candidate lists of recall's steps.
        candidate_pool: Fused candidates ranked.
        rerank_deadline_s: Time the reranker may take before the original order is kept.
        deadline_s: Time the whole search may take, LLM calls included (see the module's doc).
        max_llm_calls: LLM requests one search may send (retries and repairs count); past it each
            LLM step takes its rules' path with a warning. 0: no cap.
        round_decay: Weight of each round's signals relative to the round before. A revised
            plan adds what the first one missed without reshuffling what it found: at full
            weight, rules-only later rounds cost R@10 on LoCoMo, less the lower the weight,
            while R@25 rose above recall's (bench/README.md).
        entity_hops: Hops of the entity graph step (recall's takes one).
        keep_recall: How many of recall's first items deep keeps in place (``start_from_recall``).
        found_share: Weight of deep's own rank beside recall's below them (reciprocal ranks).
    """

    max_rounds: int = 3
    weights: MappingProxyType = field(default_factory=lambda: MappingProxyType({"semantic": 0.5, "bm25": 0.5}))
    recency_weight: float = 0.10
    recency_half_life_days: float = 90.0
    widen: int = 2
    candidate_pool: int = 300
    rerank_deadline_s: float = 8.0
    round_decay: float = 0.2
    deadline_s: float = 15.0
    entity_hops: int = 2
    keep_recall: int = 10
    found_share: float = 1.0
    max_llm_calls: int = 0


def deep_plan(analysis: QueryAnalysis, base: QueryPlan, max_results: int, config: DeepConfig) -> QueryPlan:
    """The deterministic deep plan: recall's signals, wider, with the fact store; sessions for lists."""
    steps: list[PlanStep] = []
    for step in base.steps:
        params = dict(step.params)
        if "top_k" in params and step.index in ("bm25", "semantic"):
            params["top_k"] = widened(params["top_k"], config.widen)
        if step.index == "entity_graph" and "entity_type" not in params:
            params["hops"] = config.entity_hops  # thoroughness over recall's milliseconds
        if step.index == "token_match":  # every user, one too large to hold in memory read from the log
            params.update(scan_log=True, max_memories=0)
        weight = config.weights.get(step.index, step.weight)
        if step.step_id == "bm25" and step.index in config.weights:  # weighed down as recall's for a verbose query
            weight = verbose_weight(weight, len(analysis.keywords))
        steps.append(step.model_copy(update={"params": params, "weight": weight}))
    steps.append(PlanStep(step_id="facts", index="fact_store", weight=0.2, rationale="distilled facts"))
    if analysis.answer_type == "list" or analysis.intent in ("broad", "aggregation"):
        steps.append(PlanStep(step_id="hier", index="hierarchical", weight=0.3,
                              rationale="answers spread over sessions"))  # fmt: skip
    return base.model_copy(update={"name": "deep", "steps": steps, "max_results": max_results})


def _round_results(results: list[StepResult], round_no: int, decay: float = 1.0) -> list[StepResult]:
    """Rename a round's steps so fusion keeps every round's signals apart; later rounds weigh ``decay`` less each."""
    factor = decay ** (round_no - 1)
    return [replace(r, step=r.step.model_copy(update={"step_id": f"r{round_no}.{r.step.step_id}",
                                                      "weight": r.step.weight * factor})) for r in results]  # fmt: skip


@dataclass
class _Run:
    """What one deep search accumulates."""

    plans: list[QueryPlan] = field(default_factory=list)
    results: list[StepResult] = field(default_factory=list)
    reports: list[StepReport] = field(default_factory=list)
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    rerank_fallbacks: int = 0
    llm_plans: set[str] = field(default_factory=set)  # fingerprints of the plans an LLM wrote
    deadline: float = math.inf  # time.monotonic() instant the search ends by
    budget_s: float = math.inf
    out_of_time: bool = False  # the deadline passed, and a warning says so

    def time_left(self, what: str) -> float:
        """Seconds left before the deadline; none left (0) also adds one warning, naming ``what``
        was skipped first."""
        left = self.deadline - time.monotonic()
        if left > 0:
            return left
        if not self.out_of_time:
            self.out_of_time = True
            self.warnings.append(f"deadline of {self.budget_s:g} s reached (MNEMOPLAN_DEEP_DEADLINE_S): "
                                 f"skipped {what} and what would have come after it")  # fmt: skip
        return 0.0

    def charge(self, usage: LLMUsage | None) -> None:
        if usage is not None:
            self.llm_calls += usage.calls
            self.input_tokens += usage.input_tokens
            self.output_tokens += usage.output_tokens
            self.cost_usd += usage.cost_usd

    def time(self, phase: str, started: float) -> None:
        self.durations[phase] = round(self.durations.get(phase, 0.0) + (time.perf_counter() - started) * 1000, 3)


class DeepSearch:
    """The slow, thorough path.

    Args:
        recall: The recall pipeline (analyzer, registry, executor, fusion, ranking).
        config: Deep search knobs.
        llm: LLM-backed planner, evaluator, replanner and reranker, when configured.
        cache: Plans that worked, by query shape.
    """

    def __init__(
        self, recall: RecallPipeline, config: DeepConfig | None = None, llm: LLMParts | None = None,
        cache: PlanCache | None = None,
    ) -> None:  # fmt: skip
        self.recall = recall
        self.config = config or DeepConfig()
        self.llm = llm or LLMParts()
        self.cache = cache or PlanCache()

    # -- planning ----------------------------------------------------------------------

    def deterministic_plan(self, analysis: QueryAnalysis, max_results: int) -> QueryPlan:
        """The plan the rules write for an analysed query."""
        return deep_plan(analysis, self.recall.plan(analysis, max_results), max_results, self.config)

    def _first_plan(self, analysis: QueryAnalysis, user_id: str, max_results: int, run: _Run) -> QueryPlan:
        baseline = self.deterministic_plan(analysis, max_results)
        cached = self.cache.get(analysis)
        if cached is not None:
            try:
                return self.recall.registry.validate(cached.model_copy(update={"max_results": max_results}))
            except Exception:  # the registry changed since: forget the template
                run.warnings.append("a cached plan no longer validates; planned afresh")
        if self.llm.planner is None or not run.time_left("the LLM planner"):
            return baseline
        outcome = self.llm.planner.plan(
            analysis.query, analysis, self.recall.registry.descriptors(user_id), baseline,
            self.recall.registry.validate, max_results, deadline=run.deadline,
        )  # fmt: skip
        run.charge(outcome.usage)
        if outcome.plan is None:
            run.warnings.append(f"LLM planner fell back to the rules: {outcome.fallback_reason}")
            return baseline
        run.llm_plans.add(plan_fingerprint(outcome.plan))
        return outcome.plan

    def _judge(self, analysis: QueryAnalysis, plan: QueryPlan, results: list[StepResult], items: list[MemoryItem],
               round_no: int, run: _Run) -> Evaluation:  # fmt: skip
        rules = evaluate(analysis, results, items)
        if self.llm.evaluator is None or not run.time_left("the LLM evaluator"):
            return rules
        reports = [StepReport(round=round_no, step_id=r.step.step_id, index=r.step.index, count=len(r.hits),
                              ms=round(r.ms, 3), error=r.error) for r in results]  # fmt: skip
        try:
            verdict = self.llm.evaluator.evaluate(analysis.query, analysis, plan, reports, items, round_no,
                                                  deadline=run.deadline)  # fmt: skip
        except LLMError as exc:
            run.warnings.append(f"LLM evaluator fell back to the rules: {exc.message}")
            return rules
        run.charge(verdict.usage)
        return Evaluation(bool(verdict.sufficient), float(verdict.confidence), verdict.diagnosis,
                          list(verdict.step_assessments) or rules.step_assessments, list(verdict.suggested_changes),
                          "llm", rules.coverage)  # fmt: skip

    def _next_plan(self, analysis: QueryAnalysis, user_id: str, run: _Run, evaluation: Evaluation,
                   items: list[MemoryItem], tried: set[str], max_results: int) -> QueryPlan | None:  # fmt: skip
        if self.llm.replanner is not None and run.time_left("the LLM replanner"):
            outcome = self.llm.replanner.revise(
                analysis.query, analysis, self.recall.registry.descriptors(user_id), run.plans, evaluation,
                self.recall.registry.validate, max_results, deadline=run.deadline,
            )  # fmt: skip
            run.charge(outcome.usage)
            if outcome.plan is not None and plan_fingerprint(outcome.plan) not in tried:
                run.llm_plans.add(plan_fingerprint(outcome.plan))
                return outcome.plan
            run.warnings.append(f"LLM replanner fell back to the rules: {outcome.fallback_reason or 'repeated plan'}")
        return revise(run.plans[-1], evaluation, items, tried)

    def _remember_plan(self, analysis: QueryAnalysis, plan: QueryPlan) -> None:
        """Cache a plan that worked, as a template: without the expansion steps, which carry
        this query's own text (and without any dependency on them)."""
        steps = [s.model_copy(update={"depends_on": [d for d in s.depends_on if d not in EXPANSION_STEP_IDS]})
                 for s in plan.steps if s.step_id not in EXPANSION_STEP_IDS]  # fmt: skip
        try:
            template = self.recall.registry.validate(plan.model_copy(update={"steps": steps}))
        except InvalidPlan:
            return  # nothing worth keeping without the expansion
        self.cache.put(analysis, template)

    def _expand(self, analysis: QueryAnalysis, plan: QueryPlan, run: _Run) -> QueryPlan:
        """The plan plus the LLM's rewrite and hypothetical-memory steps, when an expander is configured."""
        if self.llm.expander is None or not run.time_left("query expansion"):
            return plan
        try:
            expansion = self.llm.expander.expand(analysis.query, analysis, deadline=run.deadline)
        except LLMError as exc:
            run.warnings.append(f"query expansion skipped: {exc.message}")
            return plan
        run.charge(expansion.usage)
        extra = expansion.steps(plan)
        if not extra:
            return plan
        try:
            return self.recall.registry.validate(plan.model_copy(update={"steps": [*plan.steps, *extra]}))
        except InvalidPlan as exc:
            run.warnings.append(f"query expansion skipped: {exc.message}")
            return plan

    # -- running -----------------------------------------------------------------------

    def _config(self) -> RecallConfig:
        base = self.recall.config
        ranking = dataclasses.replace(
            base.ranking, recency_weight=self.config.recency_weight,
            recency_half_life_days=self.config.recency_half_life_days,
        )  # fmt: skip
        return dataclasses.replace(base, ranking=ranking, candidate_pool=self.config.candidate_pool)

    def run(
        self,
        query: str,
        scope: Scope,
        *,
        max_results: int,
        plan: QueryPlan | None = None,
        reference_time: datetime | None = None,
    ) -> DeepSearchResult:
        """Search until the evaluator is satisfied or the rounds run out; a caller plan runs once, exactly.

        Every LLM request it makes counts against one ``llm_scope`` (``max_llm_calls``)."""
        with llm_scope("deep_memory_search", self.config.max_llm_calls, "MNEMOPLAN_LLM_MAX_CALLS_PER_SEARCH"):
            return self._run(query, scope, max_results=max_results, plan=plan, reference_time=reference_time)

    def _run(
        self,
        query: str,
        scope: Scope,
        *,
        max_results: int,
        plan: QueryPlan | None = None,
        reference_time: datetime | None = None,
    ) -> DeepSearchResult:
        started = time.perf_counter()
        run = _Run(deadline=time.monotonic() + self.config.deadline_s, budget_s=self.config.deadline_s)
        now = reference_time or datetime.now(UTC)
        t0 = time.perf_counter()
        analysis = self.recall.analyzer.analyze(query, scope.user_id, reference_time)
        caller = plan is not None
        first: QueryPlan | None = None
        if plan is not None:
            if plan.query.strip() and plan.query.strip() != query.strip():
                run.warnings.append(f"the plan's query {plan.query!r} was searched, not the call's {query!r} "
                                    "(which set the time window and the entities)")  # fmt: skip
            plan = self.recall.registry.validate(plan.model_copy(update={"source": "caller", "query": plan.query or query}))
        else:
            first = self._first_plan(analysis, scope.user_id, max_results, run)
            plan = self._expand(analysis, first, run)
            if plan_fingerprint(first) in run.llm_plans:  # still the LLM's plan, with the expansion steps
                run.llm_plans.add(plan_fingerprint(plan))
        run.time("plan", t0)
        base = None if caller else self._recall_first(analysis, scope, max_results, now, run)
        config = self._config()
        tried: set[str] = set()
        items: list[MemoryItem] = []
        evaluation: Evaluation | None = None
        rounds = 1 if caller else self.config.max_rounds
        for round_no in range(1, rounds + 1):
            tried.add(plan_fingerprint(plan))
            run.plans.append(plan)
            t0 = time.perf_counter()
            results = self.recall.execute(plan, scope, analysis)
            run.time("execute", t0)
            run.results.extend(_round_results(results, round_no, self.config.round_decay))
            run.warnings.extend(f"round {round_no}: step {r.step.step_id} ({r.step.index}) failed: {r.error}"
                                for r in results if r.error)  # fmt: skip
            t0 = time.perf_counter()
            items, _ = self.recall.rank(run.results, plan, scope, max(max_results, 30), config, now)
            run.time("rank", t0)
            t0 = time.perf_counter()
            evaluation = self._judge(analysis, plan, results, items, round_no, run)
            run.time("evaluate", t0)
            assessed = {a["step_id"]: a for a in assess_steps(results, items)}
            assessed.update({a.get("step_id", ""): a for a in evaluation.step_assessments})
            for r in results:
                a = assessed.get(r.step.step_id, {})
                run.reports.append(StepReport(round=round_no, step_id=r.step.step_id, index=r.step.index,
                                              count=len(r.hits), ms=round(r.ms, 3), error=r.error,
                                              useful=a.get("useful"), quality=a.get("quality"),
                                              issue=a.get("issue", "")))  # fmt: skip
            run.evaluations.append({"round": round_no, **evaluation.as_dict()})
            if round_no == 1 and first is not None and first.source == "cache" and not evaluation.sufficient:
                self.cache.discard(analysis, first)  # it stops pre-empting the planner for this shape
            if evaluation.sufficient or caller or round_no == rounds:
                break
            if not run.time_left(f"round {round_no + 1}"):
                break
            t0 = time.perf_counter()
            nxt = self._next_plan(analysis, scope.user_id, run, evaluation, items, tried, max_results)
            run.time("replan", t0)
            if nxt is None:
                break
            plan = nxt
        # Only a plan an LLM wrote is worth keeping: reusing it saves a paid call. The rules
        # re-derive theirs in microseconds, and caching their revisions made a query's result
        # depend on the queries before it, and cost R@10 on LoCoMo (bench/README.md).
        if evaluation is not None and evaluation.sufficient and plan_fingerprint(run.plans[-1]) in run.llm_plans:
            self._remember_plan(analysis, run.plans[-1])
        if base is not None:
            items = start_from_recall(base, items, self.config.keep_recall, self.config.found_share)
        items = self._rerank(query, scope.user_id, items, run)[:max_results]
        items, nothing = self.recall.judge(query, analysis, items, scope.user_id)
        context = no_match_context(items) if nothing else format_context(items, self.recall.config.token_budget)
        return self._result(query, scope, items, evaluation, run, started).model_copy(
            update={"context": context, "no_match": nothing})

    def _recall_first(self, analysis: QueryAnalysis, scope: Scope, max_results: int, now: datetime,
                      run: _Run) -> list[MemoryItem]:  # fmt: skip
        """What recall finds for the query, in recall's order: where deep starts (``start_from_recall``)."""
        t0 = time.perf_counter()
        plan = self.recall.plan(analysis, max(max_results, 30))
        if self.recall.model_ready is not None and not self.recall.model_ready():
            plan = keyword_only(plan)
        results = self.recall.execute(plan, scope, analysis)
        items, _ = self.recall.rank(results, plan, scope, max(max_results, 30), self.recall.config, now)
        run.warnings.extend(f"recall's step {r.step.step_id} ({r.step.index}) failed: {r.error}"
                            for r in results if r.error)  # fmt: skip
        run.time("recall", t0)
        return items

    def _rerank(self, query: str, user_id: str, items: list[MemoryItem], run: _Run) -> list[MemoryItem]:
        reranker = self.llm.reranker
        if reranker is None or not items:
            return items
        if isinstance(reranker, SkippableReranker) and reranker.redundant(query, user_id, run.results):
            return items  # an index fused this reranker's signal already
        left = run.time_left("the rerank")
        if not left:
            return items
        t0 = time.perf_counter()
        deadline = min(self.config.rerank_deadline_s, left)
        outcome = reranker.rerank(query, items, deadline_s=deadline, user_id=user_id)
        run.time("rerank", t0)
        run.charge(outcome.usage)
        run.rerank_fallbacks += outcome.fallbacks
        run.warnings.extend(outcome.notes)
        return outcome.items

    def _result(self, query: str, scope: Scope, items: list[MemoryItem], evaluation: Evaluation | None, run: _Run,
                started: float) -> DeepSearchResult:  # fmt: skip
        per_index: dict[str, int] = {}
        for r in run.results:
            per_index[r.step.index] = per_index.get(r.step.index, 0) + len(r.hits)
        run.durations["total"] = round((time.perf_counter() - started) * 1000, 3)
        return DeepSearchResult(
            query=query,
            user_id=scope.user_id,
            items=items,
            sufficient=bool(evaluation and evaluation.sufficient),
            confidence=evaluation.confidence if evaluation else 0.0,
            plans=run.plans,
            steps=run.reports,
            evaluations=run.evaluations,
            stats=DeepSearchStats(
                rounds=len(run.plans), candidates_per_index=per_index, durations_ms=run.durations,
                llm_calls=run.llm_calls, input_tokens=run.input_tokens, output_tokens=run.output_tokens,
                cost_usd=round(run.cost_usd, 6), rerank_fallbacks=run.rerank_fallbacks,
            ),  # fmt: skip
            warnings=run.warnings,
        )

    def explain(self, query: str, user_id: str, *, full: bool = False) -> ExplainPlanResult:
        """Both plans, a line per index and the instructions; with ``full``, every descriptor and
        the plan schema too (about 20 KB, so only on request). Runs nothing."""
        analysis = self.recall.analyzer.analyze(query, user_id)
        recall_plan = self.recall.plan(analysis, 10)
        cached = self.cache.get(analysis)
        deep_plan = cached or self.deterministic_plan(analysis, 10)
        descriptors = self.recall.registry.descriptors(user_id)
        if not full:  # the analysis is given once, not again inside each plan
            recall_plan, deep_plan = (p.model_copy(update={"analysis": None}) for p in (recall_plan, deep_plan))
        return ExplainPlanResult(
            query=query,
            user_id=user_id,
            analysis=analysis,
            recall_plan=recall_plan,
            deep_plan=deep_plan,
            cached_plan=cached is not None,
            indexes=descriptors if full else [],
            index_summaries={d.name: index_summary(d) for d in descriptors},
            planner_instructions=PLANNER_INSTRUCTIONS,
            plan_schema=QueryPlan.model_json_schema() if full else {},
        )

    def close(self) -> None:
        """Nothing to release."""


def index_summary(d: IndexDescriptor) -> str:
    """One line on an index: what it is, its parameters with their defaults, and whether it
    can answer for this user now."""
    params = ", ".join(p.name if p.default is None else f"{p.name}={p.default}" for p in d.query_params)
    first = re.split(r"\. | \(|; |, and ", d.description, maxsplit=1)[0].rstrip(".")
    return f"{first}. Params: {params}." + ("" if d.available else " Unavailable now.")
