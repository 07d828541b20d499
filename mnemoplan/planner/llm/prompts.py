"""What the LLM prompts share: compact JSON, one line per memory, the analysis, error text."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from mnemoplan.model import MemoryItem, QueryAnalysis
from mnemoplan.planner.formatter import outdated

JSON_ONLY = "Reply with one JSON object only: no prose, no code fences."
MAX_ITEM_CHARS = 300


def compact(value: Any) -> str:
    # Prompts keep the natural key order (a descriptor reads name-first) and no spaces (tokens).
    return json.dumps(value, separators=(",", ":"), default=str, ensure_ascii=False)


def describe(err: ValidationError) -> str:
    problems = [f"{'.'.join(str(p) for p in e['loc']) or 'reply'}: {e['msg']}" for e in err.errors()[:4]]
    more = err.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


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
