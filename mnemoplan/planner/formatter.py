"""The context string: known facts first, then conversation snippets with their dates, within a token budget."""

from __future__ import annotations

import math
import re

from mnemoplan.model import MemoryItem

CHARS_PER_TOKEN = 4  # a conservative average for English prose
# Tokenizers spend more on other scripts: Greek and Cyrillic about one token per two
# characters, CJK and most others (emoji too) about one per character or more.
_MID = re.compile("[\u0370-\u052f]")
_WIDE = re.compile("[^\u0000-\u052f]")


def estimate_tokens(text: str) -> int:
    """Rough token count (no tokenizer dependency): 4 Latin characters to a token, 2 Greek
    or Cyrillic, 1 of any other script."""
    if text.isascii():
        return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)
    wide, mid = len(_WIDE.findall(text)), len(_MID.findall(text))
    narrow = len(text) - wide - mid
    return max(1, math.ceil(narrow / CHARS_PER_TOKEN + mid / 2 + wide))


def _clip(line: str, tokens: int) -> str:
    """The longest start of ``line`` that, with an ellipsis, fits in ``tokens``."""
    lo, hi = 0, len(line)
    while lo < hi:  # estimate_tokens grows with the prefix: bisect on it
        mid = (lo + hi + 1) // 2
        if estimate_tokens(line[:mid] + "…") <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return line[:lo] + "…"


def outdated(item: MemoryItem) -> str:
    """" (outdated)" once a newer fact replaced an item, so that a prompt holding both the old
    and the new value can tell them apart; " (may have changed)" when only an answer doubts it
    (``planner.slots``); "" otherwise."""
    if not item.current:
        return " (outdated)"
    return " (may have changed)" if "possibly_changed" in item.metadata else ""


def _line(item: MemoryItem) -> str:
    """``- [2024-05-08] Ola: I live in Lyon``, with ``outdated`` after the date."""
    date = item.occurred_at.date().isoformat()
    who = f"{item.speaker}: " if item.speaker else ""
    text = " ".join(item.text.split())
    return f"- [{date}]{outdated(item)} {who}{text}"


def format_context(items: list[MemoryItem], token_budget: int) -> str:
    """Render items for a prompt, best first within each section, never over the budget."""
    facts = [i for i in items if i.kind in ("fact", "procedure")]
    episodes = [i for i in items if i.kind == "episode"]
    messages = [i for i in items if i.kind == "message"]
    sections = [("Known facts:", facts), ("Session summaries:", episodes), ("Relevant conversation:", messages)]
    out: list[str] = []
    used = 0
    for title, group in sections:
        if not group:
            continue
        header_cost = estimate_tokens(title)
        if used + header_cost >= token_budget:
            break
        lines = []
        for item in group:
            line = _line(item)
            cost = estimate_tokens(line)
            if used + header_cost + cost > token_budget:
                room = token_budget - used - header_cost
                if room > 10:
                    lines.append(_clip(line, room))
                    used += estimate_tokens(lines[-1])
                break
            lines.append(line)
            used += cost
        if lines:
            out.append(title)
            out.extend(lines)
            used += header_cost
    return "\n".join(out)
