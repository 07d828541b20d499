"""Named, frozen plans ("recipes"). Planners copy and adjust them; nothing edits them in place."""

from __future__ import annotations

from mnemoplan.model import PlanStep, QueryPlan

# Episode summaries are not ranked beside the turns they summarise (on LoCoMo they crowd
# them out and cost R@10: bench/README.md); they serve the session-level (hierarchical)
# index instead.
# A passage of a long message is ranked beside the turns; recall shows a message once, as the
# passage or the whole, whichever ranks first (``RecallPipeline.rank``).
MEMORY_KINDS = ["message", "fact", "procedure", "passage"]

# Recall matches tokens for users up to 15k memories (beyond that the scan takes too much of
# its time); deep search matches every user's, reading one too large to hold in memory from the log.
RECALL_MAX_MEMORIES = 15_000

RECALL = QueryPlan(
    name="recall",
    query="",
    steps=[
        PlanStep(step_id="bm25", index="bm25", params={"top_k": 100, "kinds": MEMORY_KINDS}, weight=0.5,
                 rationale="keywords and names, with the previous turn as context"),
        PlanStep(step_id="semantic", index="semantic", params={"top_k": 100, "kinds": MEMORY_KINDS}, weight=0.5,
                 rationale="paraphrases the keywords miss"),
        PlanStep(step_id="tokens", index="token_match", weight=0.35,
                 params={"top_k": 100, "kinds": MEMORY_KINDS, "max_memories": RECALL_MAX_MEMORIES},
                 rationale="words of the answer the query only names the kind of"),
    ],
    combination_strategy="weighted_union",
)  # fmt: skip

# One hop in recall: the second (entities mentioned alongside) was slow on a large store
# and gained nothing measurable on LoCoMo; "everything about X" and deep search take two.
ENTITY_STEP = PlanStep(
    step_id="entities", index="entity_graph", params={"top_k": 100, "hops": 1}, weight=0.1,
    rationale="records linked to the entities the query names",
)  # fmt: skip

TIME_WINDOW_STEP = PlanStep(
    step_id="time", index="temporal", params={"top_k": 300}, weight=0.2,
    rationale="records in the time window the query names",
)  # fmt: skip

DATED_STEP = PlanStep(
    step_id="dated", index="temporal", params={"dated_only": True, "top_k": 120},
    depends_on=["bm25", "semantic"], weight=0.2,
    rationale="a 'when' question wants a memory that carries a date",
)  # fmt: skip

ANCHOR_STEP = PlanStep(
    step_id="anchor", index="bm25", params={"top_k": 3, "kinds": MEMORY_KINDS}, weight=0.0,
    rationale="find the event the query's time is relative to",
)  # fmt: skip

ANCHORED_TIME_STEP = PlanStep(
    step_id="time", index="temporal", params={"top_k": 300}, depends_on=["anchor"], weight=0.2,
    rationale="records before / after the anchor event",
)  # fmt: skip

TYPE_STEP = PlanStep(
    step_id="of_type", index="entity_graph", params={"top_k": 200, "hops": 1}, weight=0.3,
    rationale="records about every entity of the kind the query lists",
)  # fmt: skip

RECIPES: dict[str, QueryPlan] = {"recall": RECALL}
