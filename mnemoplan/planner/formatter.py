"""The context string: known facts first, then conversation snippets with their dates, within a token budget."""

from __future__ import annotations

from mnemoplan.model import MemoryItem

CHARS_PER_TOKEN = 4  # a conservative average for English prose


def estimate_tokens(text: str) -> int:
    """Rough token count (no tokenizer dependency)."""
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN)


def _line(item: MemoryItem) -> str:
    date = item.occurred_at.date().isoformat()
    who = f"{item.speaker}: " if item.speaker else ""
    text = " ".join(item.text.split())
    return f"- [{date}] {who}{text}"


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
                room = (token_budget - used - header_cost) * CHARS_PER_TOKEN
                if room > 40:
                    lines.append(line[: room - 1] + "…")
                    used += estimate_tokens(lines[-1])
                break
            lines.append(line)
            used += cost
        if lines:
            out.append(title)
            out.extend(lines)
            used += header_cost
    return "\n".join(out)
