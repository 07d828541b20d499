"""What planning and plan execution cost on their own, with the indexes' time taken out.

For each sampled question whose deterministic recall plan has exactly three steps (the plain
plan: keywords, vectors and token matching, side by side), the plan
is run once for real to capture what every step returned. Then the same question is
analysed, planned, validated, executed and fused again, timed, against replay indexes
that hand back the captured hits at once: what remains is the planner's and the
executor's own time (thread hand-offs, dependency waves, upstream wiring, fusion).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from mnemoplan.bench.datasets import Question
from mnemoplan.search.base import Hit, LazyVector, SearchIndex, SearchRequest
from mnemoplan.search.registry import IndexRegistry
from mnemoplan.planner.executor import PlanExecutor
from mnemoplan.planner.fusion import fuse
from mnemoplan.model.scope import Scope

if TYPE_CHECKING:  # the service loads the storage libraries: imported where a run needs it
    import numpy as np

    from mnemoplan.service.service import MemoryService

STEPS = 3
REPEATS = 5  # timed runs per question; the median is kept


class ReplayIndex(SearchIndex):
    """An index that answers with hits captured from the real one, keyed by step parameters."""

    def __init__(self, real: SearchIndex) -> None:
        self.descriptor = real.descriptor
        self.answers: dict[str, list[Hit]] = {}

    @staticmethod
    def key(params: dict[str, Any]) -> str:
        """A step's identity within one plan: its parameters."""
        return repr(sorted(params.items()))

    def search(self, req: SearchRequest) -> list[Hit]:
        return self.answers.get(self.key(req.params), [])


def _no_vector(text: str) -> np.ndarray:
    raise AssertionError("a replayed step asked for the query vector")


def measure(service: MemoryService, questions: list[Question], sample: int = 100) -> dict[str, Any] | None:
    """Median planning, execution and fusion time of three-step deterministic plans, indexes excluded."""
    pipeline = service.recall_pipeline
    analyzer, registry = pipeline.analyzer, pipeline.registry
    replays = {name: ReplayIndex(registry.get(name)) for name in registry.names}
    replay_registry = IndexRegistry()
    for index in replays.values():
        replay_registry.register(index)
    picked: list[Question] = []
    for q in questions:
        analysis = analyzer.analyze(q.question, q.conv_id)
        if not analysis.skip_retrieval and len(pipeline.plan(analysis, 10).steps) == STEPS:
            picked.append(q)
    if not picked:
        return None
    step = max(1, len(picked) // sample)
    picked = picked[::step][:sample]
    plan_ms: list[float] = []
    exec_ms: list[float] = []
    fuse_ms: list[float] = []
    total_ms: list[float] = []
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="overhead-step") as pool:
        executor = PlanExecutor(replay_registry, pool)
        for q in picked:
            analysis = analyzer.analyze(q.question, q.conv_id)
            plan = registry.validate(pipeline.plan(analysis, 10))
            real = pipeline.execute(plan, Scope(user_id=q.conv_id), analysis)
            for index in replays.values():
                index.answers.clear()
            for result in real:
                replays[result.step.index].answers[ReplayIndex.key(result.step.params)] = result.hits
            expected = [len(r.hits) for r in real]
            runs: list[tuple[float, float, float]] = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                analysis = analyzer.analyze(q.question, q.conv_id)
                plan = replay_registry.validate(pipeline.plan(analysis, 10))
                t1 = time.perf_counter()
                base = SearchRequest(user_id=q.conv_id, query=plan.query, params={},
                                     vector=LazyVector(_no_vector), analysis=analysis)  # fmt: skip
                results = executor.execute(plan, base)
                t2 = time.perf_counter()
                if [len(r.hits) for r in results] != expected or any(r.error for r in results):
                    raise RuntimeError(f"replay did not reproduce the plan's steps for {q.qid}: the measurement "
                                       "would not be of the same work")  # fmt: skip
                fuse(results, plan.combination_strategy, modes=pipeline.config.modes, weights=pipeline.config.weights)
                t3 = time.perf_counter()
                runs.append((t1 - t0, t2 - t1, t3 - t2))
            p, e, f = (statistics.median(r[i] for r in runs) * 1000 for i in range(3))
            plan_ms.append(p)
            exec_ms.append(e)
            fuse_ms.append(f)
            total_ms.append(p + e)
    return {
        "plan_steps": STEPS,
        "questions": len(picked),
        "example_plan": [s.step_id + (f" <- {','.join(s.depends_on)}" if s.depends_on else "") for s in plan.steps],
        "median_ms": {
            "analyze_plan_validate": round(statistics.median(plan_ms), 3),
            "execute": round(statistics.median(exec_ms), 3),
            "planning_and_execution": round(statistics.median(total_ms), 3),
            "fuse": round(statistics.median(fuse_ms), 3),
        },
        "p95_ms_planning_and_execution": round(sorted(total_ms)[int(0.95 * (len(total_ms) - 1))], 3),
    }

