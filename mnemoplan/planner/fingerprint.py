"""A plan's identity: what it does, hashed, so no plan runs twice in one search."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from mnemoplan.model import PlanStep, QueryPlan


def plan_fingerprint(plan: QueryPlan) -> str:
    """A stable hash of what a plan does, to never run the same plan twice.

    Covers each step's index, params, combine and dependencies, and the combination
    strategy. Ignores rationale, weights, names, source and step order; dependencies are
    compared by what the step depended on, so renaming step ids changes nothing.

    Args:
        plan: Any plan, validated or not.

    Returns:
        16 hex digits.
    """
    by_id = {s.step_id: s for s in plan.steps}
    memo: dict[str, Any] = {}

    def canonical(step: PlanStep, seen: frozenset[str]) -> Any:
        if step.step_id in memo:
            return memo[step.step_id]
        deps = [
            canonical(by_id[d], seen | {step.step_id}) if d in by_id and d not in seen else d
            for d in step.depends_on
        ]
        value = {
            "index": step.index,
            "params": normalise(step.params),
            "combine": step.combine,
            "depends_on": sorted(deps, key=canonical_json),
        }
        memo[step.step_id] = value
        return value

    steps = sorted((canonical(s, frozenset()) for s in plan.steps), key=canonical_json)
    payload = canonical_json({"steps": steps, "strategy": plan.combination_strategy})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def normalise(value: Any) -> Any:
    # Validation turns 100.0 into 100 and strings into datetimes: both sides must hash alike.
    if isinstance(value, dict):
        return {str(k): normalise(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
