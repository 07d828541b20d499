"""Plans that worked, kept by query shape and reused without calling a planner."""

from __future__ import annotations

import threading
from collections import OrderedDict

from mnemoplan.model import QueryAnalysis, QueryPlan

# Parameters that belong to one query, not to its shape: dropped when a plan is cached.
_QUERY_SPECIFIC = {"query", "entities", "seeds", "subject", "start", "end", "session_id"}


def query_shape(analysis: QueryAnalysis) -> str:
    """What plans for similar queries share: intent, answer type, which kinds of cue are present."""
    known = [e for e in analysis.entities if e.known]
    cues = [
        analysis.intent,
        analysis.answer_type,
        "window" if analysis.time_window else "-",
        "things" if any(not e.participant for e in known) else "-",
        "people" if any(e.participant for e in known) else "-",
    ]
    return "/".join(cues)


class PlanCache:
    """A small LRU of plan templates by query shape."""

    def __init__(self, capacity: int = 256) -> None:
        self._capacity = capacity
        self._plans: OrderedDict[str, QueryPlan] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, analysis: QueryAnalysis) -> QueryPlan | None:
        """The cached template for this query's shape, filled in for this query."""
        with self._lock:
            template = self._plans.get(query_shape(analysis))
            if template is None:
                return None
            self._plans.move_to_end(query_shape(analysis))
        return template.model_copy(update={"query": analysis.query, "analysis": analysis, "source": "cache"})

    def put(self, analysis: QueryAnalysis, plan: QueryPlan) -> None:
        """Keep a plan that worked, without what was specific to its query."""
        template = _template(plan)
        with self._lock:
            self._plans[query_shape(analysis)] = template
            self._plans.move_to_end(query_shape(analysis))
            while len(self._plans) > self._capacity:
                self._plans.popitem(last=False)

    def discard(self, analysis: QueryAnalysis, plan: QueryPlan) -> bool:
        """Forget the template for this query's shape if ``plan`` was made from it.

        A template that did not work for a query stops pre-empting the planner for its
        shape; one that another search replaced meanwhile is left alone.

        Returns:
            True when the template was dropped.
        """
        key = query_shape(analysis)
        steps = _template(plan).steps
        with self._lock:
            template = self._plans.get(key)
            if template is None or template.steps != steps:
                return False
            del self._plans[key]
            return True

    def has(self, analysis: QueryAnalysis) -> bool:
        """True when a plan for this shape is cached."""
        with self._lock:
            return query_shape(analysis) in self._plans


def _template(plan: QueryPlan) -> QueryPlan:
    steps = [s.model_copy(update={"params": {k: v for k, v in s.params.items() if k not in _QUERY_SPECIFIC}})
             for s in plan.steps]  # fmt: skip
    return plan.model_copy(update={"steps": steps, "query": "", "analysis": None})
