"""The plan executor: steps in dependency order, independent steps concurrently."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

from mnemoplan.errors import MnemoError
from mnemoplan.search.base import Hit, SearchRequest
from mnemoplan.search.registry import IndexRegistry, topological_order
from mnemoplan.model import PlanStep, QueryPlan

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """What one step returned, how long it took, and its error if it failed."""

    step: PlanStep
    hits: list[Hit] = field(default_factory=list)
    ms: float = 0.0
    error: str = ""


class PlanExecutor:
    """Runs validated plans against the registry.

    Args:
        registry: The indexes steps name.
        pool: Threads for concurrent steps (the storage libraries release the GIL).
    """

    def __init__(self, registry: IndexRegistry, pool: Executor) -> None:
        # No read-ahead of the records steps find: it saved nothing on small stores and, at
        # 100k records, its reads of every step's top candidates made recall far slower.
        self._registry = registry
        self._pool = pool

    def _run_step(self, step: PlanStep, base: SearchRequest, upstream: list[Hit]) -> StepResult:
        started = time.perf_counter()
        try:
            index = self._registry.get(step.index)
            req = replace(base, params=dict(step.params), upstream=upstream)
            hits = index.search(req)
            return StepResult(step, hits, (time.perf_counter() - started) * 1000)
        except MnemoError as exc:
            return StepResult(step, [], (time.perf_counter() - started) * 1000, exc.message)
        except Exception as exc:  # one broken index must not sink the plan
            log.exception("step %s (%s) failed", step.step_id, step.index)
            return StepResult(step, [], (time.perf_counter() - started) * 1000, f"{type(exc).__name__}")

    def execute(self, plan: QueryPlan, base: SearchRequest) -> list[StepResult]:
        """Run every step; a step sees the hits of the steps it depends on as ``upstream``."""
        results: dict[str, StepResult] = {}
        for wave in topological_order(plan.steps):
            jobs = []
            for step in wave:
                upstream = [h for dep in step.depends_on for h in results[dep].hits]
                if len(wave) == 1:
                    results[step.step_id] = self._run_step(step, base, upstream)
                else:
                    jobs.append((step, self._pool.submit(self._run_step, step, base, upstream)))
            for step, future in jobs:
                results[step.step_id] = future.result()
        return [results[s.step_id] for s in plan.steps]
