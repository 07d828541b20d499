"""The deterministic planner: the analyzer's findings turned into a plan by fixed rules."""

from __future__ import annotations

from mnemoplan.model import QueryAnalysis, QueryPlan
from mnemoplan.planner import recipes


def recall_plan(analysis: QueryAnalysis, *, max_results: int, recipe: QueryPlan = recipes.RECALL) -> QueryPlan:
    """The plan ``recall`` runs for an analysed query.

    Always keywords and vectors; the entity graph when the query names known entities;
    the temporal index when it names a time, or asks "when".
    """
    steps = list(recipe.steps)
    if any(e.known for e in analysis.entities):
        steps.append(recipes.ENTITY_STEP)
    if analysis.time_window is not None:
        steps.append(recipes.TIME_WINDOW_STEP)
    if analysis.answer_type == "date":
        steps.append(recipes.DATED_STEP)
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
