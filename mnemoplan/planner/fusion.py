"""Fusion: per-step scores normalised to [0, 1] and combined into one score per record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mnemoplan.planner.executor import StepResult

RRF_K = 60.0


@dataclass
class Candidate:
    """A record found by at least one step, with its fused score and its per-signal parts."""

    id: str
    score: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)
    provenance: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def normalise(result: StepResult, mode: str) -> dict[str, float]:
    """Scores of one step in [0, 1].

    ``max`` divides by the best score (BM25, graph scores: their zero means "no match");
    ``minmax`` stretches the returned range (cosine similarities, which never reach zero).
    """
    scores: dict[str, float] = {}
    for hit in result.hits:
        if hit.score > scores.get(hit.id, float("-inf")):
            scores[hit.id] = hit.score
    if not scores:
        return {}
    hi, lo = max(scores.values()), min(scores.values())
    if mode == "minmax" and hi > lo:
        return {rid: (s - lo) / (hi - lo) for rid, s in scores.items()}
    if hi <= 0:
        return {rid: 0.0 for rid in scores}
    return {rid: max(0.0, s / hi) for rid, s in scores.items()}


def fuse(
    results: list[StepResult],
    strategy: str,
    *,
    modes: Mapping[str, str],
    weights: Mapping[str, float] | None = None,
) -> dict[str, Candidate]:
    """Combine step results into candidates.

    Args:
        results: Executed steps, in plan order.
        strategy: ``weighted_union`` (weighted sum of normalised scores), ``rrf``
            (reciprocal rank fusion) or ``sequential_filter`` (only records every step found).
        modes: Normalisation per index name (``max`` or ``minmax``); default ``max``.
        weights: Overrides of step weights, by index name.

    A step whose ``combine`` is ``filter_by`` only re-scores records other steps found;
    ``intersect`` keeps, of the records the steps it depends on found (every earlier step's
    when it names none), only those it found too, and adds none of its own.
    """
    weights = weights or {}
    cands: dict[str, Candidate] = {}
    found: dict[str, dict[str, float]] = {}  # step id -> what it found (its scores)
    adders = {r.step.step_id: r.step.combine == "union" for r in results}  # steps that add records
    intersections: list[set[str]] = []
    joins: list[tuple[StepResult, dict[str, float], set[str]]] = []  # (step, scores, the steps before it)
    for result in results:
        step = result.step
        contrib = _contributions(result, strategy, modes)
        found[step.step_id] = contrib
        if step.combine == "intersect" and strategy != "sequential_filter":
            joins.append((result, contrib, set(found) - {step.step_id}))  # applied once every step has added
            continue
        _add(cands, result, contrib, weights, new=step.combine != "filter_by")
        if strategy == "sequential_filter":
            intersections.append(set(contrib))
    for result, contrib, before in joins:
        deps = set(result.step.depends_on) or before
        for rid in set().union(*(found.get(d, {}).keys() for d in deps)) - contrib.keys():
            cand = cands.get(rid)
            if cand is not None and not any(adders.get(p) for p in cand.provenance if p not in deps):
                del cands[rid]  # no step outside the join added it (a filter_by only re-scores)
        _add(cands, result, contrib, weights, new=False)
    for keep in intersections:
        cands = {rid: c for rid, c in cands.items() if rid in keep}
    return cands


def _contributions(result: StepResult, strategy: str, modes: Mapping[str, str]) -> dict[str, float]:
    if strategy == "rrf":
        ranked = list(dict.fromkeys(h.id for h in result.hits))
        return {rid: 1.0 / (RRF_K + rank + 1) for rank, rid in enumerate(ranked)}
    return normalise(result, modes.get(result.step.index, "max"))


def _add(
    cands: dict[str, Candidate], result: StepResult, contrib: dict[str, float], weights: Mapping[str, float], *, new: bool
) -> None:
    """Add one step's scores to the candidates (creating those it alone found when ``new``)."""
    step = result.step
    weight = weights.get(step.index, step.weight)
    details = {h.id: h.detail for h in result.hits if h.detail}
    for rid, value in contrib.items():
        cand = cands.get(rid)
        if cand is None:
            if not new:
                continue
            cand = cands[rid] = Candidate(rid)
        cand.scores[step.step_id] = round(value, 4)
        cand.score += weight * value
        cand.provenance.append(step.step_id)
        if rid in details:
            cand.details.append(details[rid])
