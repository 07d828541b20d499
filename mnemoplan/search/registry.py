"""The registry of searchable indexes, and validation of plans against it.

Adding an index means writing a ``SearchIndex`` and registering it here; the planner
and the server only ever see the registry and its descriptors.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from mnemoplan.errors import InvalidPlan
from mnemoplan.search.base import SearchIndex
from mnemoplan.model import IndexDescriptor, ParamSpec, PlanStep, QueryPlan, as_utc


MAX_STEPS = 32  # a plan's steps each run an index query; the rules write fewer than 15


def _num(bound: float) -> str:
    if not math.isfinite(bound):
        return "any"
    return str(int(bound)) if bound == int(bound) else str(bound)


def _check_choices(spec: ParamSpec, values: list[str], where: str) -> None:
    bad = [v for v in values if v not in spec.choices] if spec.choices is not None else []
    if bad:
        raise InvalidPlan(
            f"{where}: parameter {spec.name!r} does not take {', '.join(map(repr, bad))[:80]}.",
            hint=f"{spec.name}: one or more of {', '.join(spec.choices or ())}.",
        )


def _coerce(spec: ParamSpec, value: Any, where: str) -> Any:
    def fail() -> InvalidPlan:
        return InvalidPlan(
            f"{where}: parameter {spec.name!r} must be of type {spec.type}, got {value!r:.60}.",
            hint=f"{spec.name}: {spec.description}",
        )

    if value is None:  # what the MCP SDK's client sends for NaN or an infinity, refused as they are
        default = "" if spec.default is None else f" ({spec.default})"
        raise InvalidPlan(f"{where}: parameter {spec.name!r} is null.",
                          hint=f"Give a {spec.type}, or leave it out for its default{default}.")  # fmt: skip
    if spec.type == "string":
        if not isinstance(value, str):
            raise fail()
        return value
    if spec.type in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail()
        try:  # NaN, infinities and integers too large for a float are no numbers to search with
            if not math.isfinite(value) or (spec.type == "integer" and int(value) != value):
                raise fail()
        except OverflowError:
            raise fail() from None
        low = -math.inf if spec.minimum is None else spec.minimum
        high = math.inf if spec.maximum is None else spec.maximum
        if not low <= value <= high:
            raise InvalidPlan(
                f"{where}: parameter {spec.name!r} must be between {_num(low)} and {_num(high)}, got {value!r:.60}.",
                hint=f"{spec.name}: {spec.description}",
            )
        return int(value) if spec.type == "integer" else float(value)
    if spec.type == "boolean":
        if not isinstance(value, bool):
            raise fail()
        return value
    if spec.type == "datetime":
        if isinstance(value, datetime):
            return as_utc(value)
        if isinstance(value, str):
            try:
                return as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
            except ValueError:
                raise fail() from None
        raise fail()
    if spec.type == "string_list":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise fail()
        _check_choices(spec, value, where)
        return value
    raise fail()


class IndexRegistry:
    """Named searchable indexes."""

    def __init__(self) -> None:
        self._indexes: dict[str, SearchIndex] = {}

    def register(self, index: SearchIndex) -> None:
        """Add an index; its name must be new."""
        if index.name in self._indexes:
            raise ValueError(f"index {index.name!r} is already registered")
        self._indexes[index.name] = index

    def get(self, name: str) -> SearchIndex:
        """The index called ``name``.

        Raises:
            InvalidPlan: no such index.
        """
        index = self._indexes.get(name)
        if index is None:
            raise InvalidPlan(
                f"Unknown index {name!r}.", hint=f"Valid indexes: {', '.join(sorted(self._indexes))}."
            )
        return index

    @property
    def names(self) -> list[str]:
        """Registered index names, in registration order."""
        return list(self._indexes)

    def descriptors(self, user_id: str) -> list[IndexDescriptor]:
        """Every descriptor, with availability for this user."""
        return [index.describe(user_id) for index in self._indexes.values()]

    def validate(self, plan: QueryPlan) -> QueryPlan:
        """Check a plan against the registry and return it with parameters coerced.

        Raises:
            InvalidPlan: no steps or more than MAX_STEPS; unknown index, parameter or type;
                a number out of range; a missing required parameter; duplicate or unknown step
                ids; a dependency cycle.
        """
        if not plan.steps:
            raise InvalidPlan("The plan has no steps.", hint="Add at least one step naming an index.")
        if len(plan.steps) > MAX_STEPS:
            raise InvalidPlan(
                f"The plan has {len(plan.steps)} steps; at most {MAX_STEPS} are run.",
                hint="Merge steps that query the same index, or split the question.",
            )
        ids = [s.step_id for s in plan.steps]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise InvalidPlan(f"Duplicate step ids: {', '.join(dupes)}.", hint="Give every step its own step_id.")
        steps = []
        for step in plan.steps:
            index = self.get(step.index)
            specs = {p.name: p for p in index.descriptor.query_params}
            where = f"step {step.step_id!r} ({step.index})"
            unknown = sorted(set(step.params) - set(specs))
            if unknown:
                raise InvalidPlan(
                    f"{where}: unknown parameter(s) {', '.join(unknown)}.",
                    hint=f"Valid parameters of {step.index}: {', '.join(specs) or 'none'}.",
                )
            params = {name: _coerce(specs[name], value, where) for name, value in step.params.items()}
            missing = [n for n, s in specs.items() if s.required and params.get(n) is None]
            if missing:
                raise InvalidPlan(f"{where}: missing required parameter(s) {', '.join(missing)}.")
            start, end = params.get("start"), params.get("end")
            if isinstance(start, datetime) and isinstance(end, datetime) and start >= end:
                raise InvalidPlan(f"{where}: start {start.isoformat()} is not before end {end.isoformat()}.",
                                  hint="A window's start comes before its end (exclusive).")  # fmt: skip
            for dep in step.depends_on:
                if dep not in ids:
                    raise InvalidPlan(
                        f"{where}: depends on unknown step {dep!r}.", hint=f"Steps: {', '.join(ids)}."
                    )
            steps.append(step.model_copy(update={"params": params}))
        topological_order(steps)
        return plan.model_copy(update={"steps": steps})


def topological_order(steps: list[PlanStep]) -> list[list[PlanStep]]:
    """Group steps into waves; each wave depends only on earlier ones.

    Raises:
        InvalidPlan: the dependencies form a cycle.
    """
    remaining = {s.step_id: s for s in steps}
    done: set[str] = set()
    waves: list[list[PlanStep]] = []
    while remaining:
        wave = [s for s in remaining.values() if all(d in done for d in s.depends_on)]
        if not wave:
            cycle = " -> ".join(sorted(remaining))
            raise InvalidPlan(
                f"The steps {cycle} depend on each other in a cycle.",
                hint="Remove a depends_on entry so that some step runs first.",
            )
        waves.append(wave)
        for s in wave:
            done.add(s.step_id)
            del remaining[s.step_id]
    return waves
