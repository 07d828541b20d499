"""What the planner's LLM prompts share: the planner's instructions, compact JSON, one line per
memory, the analysis."""

from __future__ import annotations

import json
from typing import Any

from mnemoplan.model import MemoryItem, QueryAnalysis
from mnemoplan.planner.formatter import outdated

MAX_ITEM_CHARS = 300

# What explain_plan hands the calling agent, so that its own LLM can write the plan, and what
# the LLM planner is told of plans.
PLANNER_INSTRUCTIONS = """\
You can write the plan deep_memory_search runs. A plan is JSON matching plan_schema:
{"query": "...", "steps": [{"step_id": "s1", "index": "<name>", "params": {...}, "depends_on": [],
"combine": "union", "weight": 1.0}], "combination_strategy": "weighted_union" | "rrf" | "sequential_filter",
"expected_answer_type": "text" | "yes_no" | "number" | "date" | "list", "max_results": 10}
Rules: use only the indexes listed (prefer available ones) and only their query_params; step_ids are
unique; depends_on names earlier steps, whose results become the step's upstream (graph_traversal starts
from the entities of those records; a temporal step with dated_only keeps the dated ones); combine
"filter_by" re-scores what other steps found without adding records, "intersect" keeps, of what the
steps it depends on found, only what it found too. Start from deep_plan and edit it: drop steps that
cannot help, add a step for a need the plan misses, raise top_k when recall matters more than speed. \
Pass the plan back as
deep_memory_search(plan=...); it runs exactly as given (no re-planning)."""


def compact(value: Any) -> str:
    # Prompts keep the natural key order (a descriptor reads name-first) and no spaces (tokens).
    return json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)


def analysis_json(a: QueryAnalysis) -> str:
    out: dict[str, Any] = {"intent": a.intent, "answer_type": a.answer_type, "keywords": a.keywords}
    if a.entities:
        fields = {"name", "type", "known", "participant"}
        entities = [e.model_dump(include=fields) for e in a.entities]
        out["entities"] = [{k: v for k, v in e.items() if v != ""} for e in entities]
    if a.time_window is not None:
        out["time_window"] = a.time_window.model_dump(mode="json")
    if a.entity_type:
        out["entity_type"] = a.entity_type
    if a.reference_time is not None:
        out["reference_time"] = a.reference_time.isoformat()
    return compact(out)


def item_line(item: MemoryItem) -> str:
    text = " ".join(item.text.split())
    if len(text) > MAX_ITEM_CHARS:
        text = text[: MAX_ITEM_CHARS - 1] + "…"
    when, via = item.occurred_at.date().isoformat(), ",".join(item.provenance) or "-"
    return f"[{item.id[:8]}] {item.kind}{outdated(item)} {when} {item.speaker or '-'} via {via}: {text}"


def clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value))) if value == value else 0.0  # NaN -> 0
