"""deep_memory_search: a plan over every index, executed, reported step by step."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from mnemoplan.model import (
    DeepSearchResult,
    DeepSearchStats,
    ExplainPlanResult,
    PlanStep,
    QueryAnalysis,
    QueryPlan,
    StepReport,
)
from mnemoplan.planner.recall import RecallPipeline, Scope

PLANNER_INSTRUCTIONS = """\
You can write the plan deep_memory_search runs. A plan is JSON matching plan_schema:
{"query": "...", "steps": [{"step_id": "s1", "index": "<name>", "params": {...}, "depends_on": [],
"combine": "union", "weight": 1.0}], "combination_strategy": "weighted_union" | "rrf" | "sequential_filter",
"expected_answer_type": "text" | "yes_no" | "number" | "date" | "list", "max_results": 10}
Rules: use only the indexes listed (prefer available ones) and only their query_params; step_ids are
unique; depends_on names earlier steps, whose results become the step's upstream (a temporal step with
dated_only keeps the dated records among them); combine "filter_by" re-scores what other steps found
without adding records, "intersect" keeps only records this step found too. Start from deep_plan and
edit it: drop steps that cannot help, add a step for a need the plan misses, raise top_k when recall
matters more than speed. Pass the plan back as deep_memory_search(plan=...); it runs exactly as given."""


def deep_plan(analysis: QueryAnalysis, base: QueryPlan, max_results: int) -> QueryPlan:
    """The deterministic deep plan: recall's signals with wider candidate lists."""
    steps = []
    for step in base.steps:
        params = dict(step.params)
        if "top_k" in params:
            params["top_k"] = int(params["top_k"]) * 2
        steps.append(step.model_copy(update={"params": params}))
    return base.model_copy(update={"name": "deep", "steps": steps, "max_results": max_results})


class DeepSearch:
    """The slow, thorough path.

    Args:
        recall: The recall pipeline (analyzer, executor, fusion and ranking are shared).
    """

    def __init__(self, recall: RecallPipeline) -> None:
        self.recall = recall

    def plan_for(self, query: str, user_id: str, max_results: int, reference_time: datetime | None) -> QueryPlan:
        """The plan deep search would run without a caller plan."""
        analysis = self.recall.analyzer.analyze(query, user_id, reference_time)
        return deep_plan(analysis, self.recall.plan(analysis, max_results), max_results)

    def run(
        self,
        query: str,
        scope: Scope,
        *,
        max_results: int,
        plan: QueryPlan | None = None,
        reference_time: datetime | None = None,
    ) -> DeepSearchResult:
        """Run a caller plan exactly as given, else the deterministic deep plan."""
        started = time.perf_counter()
        durations: dict[str, float] = {}
        if plan is not None:
            plan = self.recall.registry.validate(plan.model_copy(update={"source": "caller"}))
            analysis = plan.analysis or self.recall.analyzer.analyze(plan.query or query, scope.user_id, reference_time)
            if not plan.query:
                plan = plan.model_copy(update={"query": query})
        else:
            plan = self.plan_for(query, scope.user_id, max_results, reference_time)
            analysis = plan.analysis
        durations["plan"] = round((time.perf_counter() - started) * 1000, 3)
        t0 = time.perf_counter()
        results = self.recall.execute(plan, scope, analysis)
        durations["execute"] = round((time.perf_counter() - t0) * 1000, 3)
        t0 = time.perf_counter()
        items, _ = self.recall.rank(
            results, plan, scope, min(max_results, plan.max_results), self.recall.config,
            reference_time or datetime.now(UTC),
        )  # fmt: skip
        durations["rank"] = round((time.perf_counter() - t0) * 1000, 3)
        durations["total"] = round((time.perf_counter() - started) * 1000, 3)
        per_index: dict[str, int] = {}
        for r in results:
            per_index[r.step.index] = per_index.get(r.step.index, 0) + len(r.hits)
        warnings = [f"{r.step.step_id} ({r.step.index}) failed: {r.error}" for r in results if r.error]
        return DeepSearchResult(
            query=query,
            user_id=scope.user_id,
            items=items,
            sufficient=bool(items),
            confidence=0.0,
            plans=[plan],
            steps=[
                StepReport(round=1, step_id=r.step.step_id, index=r.step.index, count=len(r.hits),
                           ms=round(r.ms, 3), error=r.error)
                for r in results
            ],  # fmt: skip
            stats=DeepSearchStats(rounds=1, candidates_per_index=per_index, durations_ms=durations),
            warnings=warnings,
        )

    def explain(self, query: str, user_id: str) -> ExplainPlanResult:
        """Both plans, every descriptor, the instructions and the plan schema. Runs nothing."""
        analysis = self.recall.analyzer.analyze(query, user_id)
        recall_plan = self.recall.plan(analysis, 10)
        return ExplainPlanResult(
            query=query,
            user_id=user_id,
            analysis=analysis,
            recall_plan=recall_plan,
            deep_plan=deep_plan(analysis, recall_plan, 10),
            indexes=self.recall.registry.descriptors(user_id),
            planner_instructions=PLANNER_INSTRUCTIONS,
            plan_schema=QueryPlan.model_json_schema(),
        )

    def close(self) -> None:
        """Nothing to release yet."""


__all__ = ["DeepSearch", "PlanStep", "deep_plan"]
