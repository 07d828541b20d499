"""The text content of each tool's result: what a host's model reads.

The structured content keeps everything (scores per signal, plans, traces); the text is short.
For ``recall`` and ``deep_memory_search`` it is the context and a list of the items (id,
date, confidence, one line), at most twice the context's length; for ``forget`` and
``remember`` the counts and at most ``IDS_SHOWN`` ids; ``explain_plan`` is its (already
compact) result as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from mnemoplan.model import DeepSearchResult, ExplainPlanResult, ForgetReceipt, MemoryItem, RecallResult, RememberResult

IDS_SHOWN = 20  # ids listed in a receipt's text; the structured content has the rest (within its cap)
LINE_CHARS = 80  # of a memory's text in the item list


def render_text(result: Any) -> str | None:
    """The text content for a tool's result; None for a result this module does not know."""
    if isinstance(result, RecallResult | DeepSearchResult):
        return search_text(result.context, result.items, result.no_match, result.warnings)
    if isinstance(result, ForgetReceipt):
        return forget_text(result)
    if isinstance(result, RememberResult):
        return remember_text(result)
    if isinstance(result, ExplainPlanResult):
        return compact_json(result)
    return None


def compact_json(result: BaseModel) -> str:
    """A model as JSON without spaces (the SDK's default text is indented)."""
    return json.dumps(result.model_dump(mode="json"), separators=(",", ":"), ensure_ascii=False)


def _one_line(text: str, chars: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def item_line(item: MemoryItem, chars: int = LINE_CHARS) -> str:
    """``- <id> 2024-05-08 conf 0.83: Ola: I live in Lyon``."""
    who = f"{item.speaker}: " if item.speaker else ""
    old = " (outdated)" if not item.current else " (may have changed)" if "possibly_changed" in item.metadata else ""
    return (f"- {item.id} {item.occurred_at.date().isoformat()} conf {item.confidence:.2f}{old}: "
            f"{_one_line(who + item.text, chars)}")  # fmt: skip


def search_text(context: str, items: list[MemoryItem], no_match: bool, warnings: list[str]) -> str:
    """The context, then as many item lines as fit in the context's length again.

    A warning (a degraded search) goes first when it fits in the same budget: it changes how
    the context should be read."""
    budget = max(len(context), 1) * 2
    parts = [context] if context else []
    used = len(context)
    for w in warnings:
        line = f"Warning: {w}"
        if used + len(line) + 1 <= budget:
            parts.insert(0, line)
            used += len(line) + 1
    header = "Items (id, date, confidence):" if not no_match else "Closest items (not relevant):"
    lines: list[str] = []
    room = budget - used - len(header) - 2
    for item in items:
        line = item_line(item)
        if len(line) + 1 > room:  # the last that fits, its text shortened, if enough of it is left
            chars = LINE_CHARS - (len(line) + 1 - room)
            if chars >= 20:
                lines.append(item_line(item, chars))
            break
        lines.append(line)
        room -= len(line) + 1
    if lines:
        parts.append(header + "\n" + "\n".join(lines))
    text = "\n\n".join(parts)
    return text[:budget] if len(text) > budget else text


def _ids(ids: list[str], total: int) -> str:
    shown = ids[:IDS_SHOWN]
    more = total - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def forget_text(r: ForgetReceipt) -> str:
    """Counts, the first ids, whether the bytes are gone, and any warning."""
    lines = [f"Forgot {r.removed} memor{'y' if r.removed == 1 else 'ies'} of {r.user_id} (scope {r.scope})"
             + (f": {_ids(r.ids, r.removed)}." if r.ids else ".")]  # fmt: skip
    if r.finished_ids:
        lines.append(f"Finished an earlier forget: {_ids(r.finished_ids, len(r.finished_ids))}.")
    lines.append("Purged from disk." if r.purged else "Not yet purged from disk (see warnings); out of every search.")
    lines.extend(f"Warning: {w}" for w in r.warnings)
    return "\n".join(lines)


def remember_text(r: RememberResult) -> str:
    """Counts and the first ids."""
    lines = [f"Stored {r.stored}, {r.duplicates} already in memory, {r.derived} derived; user {r.user_id}"
             + (f", session {r.session_id}" if r.session_id else "") + f". Ids: {_ids(r.ids, len(r.ids))}."]  # fmt: skip
    lines.extend(f"Warning: {w}" for w in r.warnings)
    return "\n".join(lines)
