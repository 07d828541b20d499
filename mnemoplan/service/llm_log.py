"""The LLM call log: one JSON line per request an LLM was sent (or a cap stopped), for ``stats``.

A file per UTC day under ``<data_dir>/llm_calls``; no user id and no text, only what a request
cost: provider, model, purpose, the tool it served, tokens in and out, latency and outcome
(``inference.llm_calls.CallRecord``). Lines are appended as requests end, so the log adds up to
what the server saw even if the process dies, and today's file gives the daily cap its count
after a restart.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from mnemoplan.inference.llm_calls import CallRecord, today

log = logging.getLogger(__name__)


class LLMCallLog:
    """Appends call records to a file per day.

    Args:
        root: The directory of the daily files (made if missing).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def record(self, call: CallRecord) -> None:
        """Append one record; a write that fails is logged, never raised."""
        line = json.dumps(call.as_dict(), ensure_ascii=False) + "\n"
        try:
            with self._lock, (self.root / f"{call.ts[:10]}.jsonl").open("a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError:
            log.warning("could not write the LLM call log", exc_info=True)

    def sent_today(self) -> int:
        """Requests sent today (UTC), as the log holds them."""
        return sum(1 for c in load_calls(self.root, today()) if c.get("sent", True))

    def close(self) -> None:
        """Nothing is buffered: every record is on disk once ``record`` returns."""


def load_calls(root: Path, day: str | None = None) -> list[dict[str, Any]]:
    """Logged requests (of one day, ``YYYY-MM-DD``, or of all), oldest first; a torn last line is skipped."""
    paths = [root / f"{day}.jsonl"] if day else sorted(root.glob("*.jsonl"))
    out: list[dict[str, Any]] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def summarise_calls(calls: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Sums per day and per tool: requests sent, ok, failed, capped, tokens, latency, cost.

    Args:
        calls: Records as ``load_calls`` gives them.

    Returns:
        ``{day: {tool: figures}}``, days and tools sorted; a tool of no tool call is ``-``.
    """
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for call in calls:
        day = str(call.get("ts", ""))[:10] or "?"
        groups.setdefault(day, {}).setdefault(call.get("tool") or "-", []).append(call)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for day in sorted(groups):
        out[day] = {}
        for tool in sorted(groups[day]):
            rows = groups[day][tool]
            sent = [c for c in rows if c.get("sent", True)]
            latencies = sorted(float(c.get("latency_ms", 0.0)) for c in sent)
            outcomes: dict[str, int] = {}
            for c in rows:
                outcomes[c.get("outcome", "?")] = outcomes.get(c.get("outcome", "?"), 0) + 1
            out[day][tool] = {
                "calls": len(sent),
                "ok": sum(1 for c in sent if c.get("outcome") == "ok"),
                "failed": sum(1 for c in sent if c.get("outcome") != "ok"),
                "capped": len(rows) - len(sent),
                "input_tokens": sum(int(c.get("input_tokens", 0)) for c in sent),
                "output_tokens": sum(int(c.get("output_tokens", 0)) for c in sent),
                "cost_usd": round(sum(float(c.get("cost_usd", 0.0)) for c in sent), 6),
                "p50_ms": round(latencies[len(latencies) // 2], 1) if latencies else 0.0,
                "models": sorted({f"{c.get('provider')}:{c.get('model')}" for c in sent}),
                "outcomes": dict(sorted(outcomes.items())),
            }
    return out
