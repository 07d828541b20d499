"""The deterministic planner: the analyzer's findings turned into a plan by fixed rules."""

from __future__ import annotations

from datetime import timedelta

from mnemoplan.model import PlanStep, QueryAnalysis, QueryPlan, TimeWindow
from mnemoplan.planner import recipes


def window_weight(window: TimeWindow) -> float:
    """How much a time window should count: the narrower, the more it says about the answer."""
    if window.start is None or window.end is None:
        return 0.2
    width = window.end - window.start
    if width <= timedelta(days=1):
        return 1.0
    if width <= timedelta(days=8):
        return 0.6
    if width <= timedelta(days=31):
        return 0.4
    return 0.2


def recall_plan(analysis: QueryAnalysis, *, max_results: int, recipe: QueryPlan = recipes.RECALL) -> QueryPlan:
    """The plan ``recall`` runs for an analysed query.

    Always keywords and vectors; the entity graph when the query names things or people
    the memory knows (other than the conversation's participants, who are everywhere);
    the temporal index when it names a time, or asks "when".
    """
    steps = list(recipe.steps)
    if any(e.known and not e.participant for e in analysis.entities):
        entity = recipes.ENTITY_STEP
        if analysis.intent == "broad":  # "everything about X": a wider walk
            entity = entity.model_copy(update={"params": {**entity.params, "top_k": 400, "hops": 2}, "weight": 0.2})
        steps.append(entity)
    if analysis.intent == "aggregation" and analysis.entity_type:
        steps.append(recipes.TYPE_STEP.model_copy(
            update={"params": {**recipes.TYPE_STEP.params, "entity_type": analysis.entity_type}}))  # fmt: skip
    window = analysis.time_window
    if window is not None and window.anchor:
        steps.append(recipes.ANCHOR_STEP.model_copy(update={"params": {**recipes.ANCHOR_STEP.params,
                                                                        "query": window.anchor}}))  # fmt: skip
        steps.append(recipes.ANCHORED_TIME_STEP.model_copy(
            update={"params": {**recipes.ANCHORED_TIME_STEP.params, "anchor_relation": window.relation}}))  # fmt: skip
    elif window is not None:
        steps.append(recipes.TIME_WINDOW_STEP.model_copy(update={"weight": window_weight(window)}))
    if analysis.answer_type == "date":
        steps.append(recipes.DATED_STEP)
    steps = [verbose_keywords(step, len(analysis.keywords)) if step.step_id == "bm25" else step for step in steps]
    return recipe.model_copy(
        update={
            "query": analysis.query,
            "analysis": analysis,
            "steps": steps,
            "expected_answer_type": analysis.answer_type,
            "max_results": max_results,
            "source": "deterministic",
        }
    )


# Keywords beyond which a query is verbose: an agent's whole turn rather than a question.
VERBOSE_KEYWORDS = 12


def verbose_keywords(step: PlanStep, keywords: int) -> PlanStep:
    """The keyword step of a verbose query, weighed down in proportion to its keywords.

    BM25 adds a score for every keyword a memory shares with the query: with twenty of them
    (a user's whole turn, passed by an agent), any memory sharing a handful of the common ones
    ranks high, while the embedding reads the turn as one meaning. A question of a dozen
    keywords or fewer keeps the step's weight.
    """
    if keywords <= VERBOSE_KEYWORDS:
        return step
    return step.model_copy(update={"weight": verbose_weight(step.weight, keywords),
                                   "rationale": f"{step.rationale}; weighed down: a verbose query ({keywords} keywords)"})


def verbose_weight(weight: float, keywords: int) -> float:
    """A keyword step's weight for a query of ``keywords`` keywords (see ``verbose_keywords``)."""
    return weight if keywords <= VERBOSE_KEYWORDS else round(weight * VERBOSE_KEYWORDS / keywords, 4)
