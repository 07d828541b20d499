"""``mnemoplan stats``: aggregates of the search log, and of the LLM call log per day and per tool."""

from __future__ import annotations

import argparse
import json

from mnemoplan.cli.common import add_common_arguments, settings_from_args


def summarise_searches(entries: list[dict]) -> dict[str, dict]:
    """Aggregates of logged searches per tool: counts, errors, latency, rounds, cost, indexes."""
    out: dict[str, dict] = {}
    for tool in sorted({e.get("tool", "?") for e in entries}):
        rows = [e for e in entries if e.get("tool") == tool]
        ok = [e for e in rows if e.get("ok")]
        durations = sorted(e.get("duration_ms", 0.0) for e in ok)  # a failed call's time is no search's
        indexes: dict[str, int] = {}
        for e in ok:
            for step in e.get("steps", []):
                if step.get("count"):
                    name = step.get("index") or step.get("name", "?")
                    indexes[name] = indexes.get(name, 0) + 1
        out[tool] = {
            "searches": len(rows),
            "errors": len(rows) - len(ok),
            "p50_ms": round(durations[len(durations) // 2], 2) if durations else 0.0,
            "p95_ms": (
                round(durations[min(len(durations) - 1, int(0.95 * len(durations)))], 2) if durations else 0.0
            ),
            "mean_rounds": round(sum(e.get("rounds", 1) for e in ok) / len(ok), 2) if ok else 0.0,
            "mean_items": round(sum(e.get("items", 0) for e in ok) / len(ok), 2) if ok else 0.0,
            "cost_usd": round(sum(e.get("cost_usd", 0.0) for e in ok), 6),
            "llm_calls": sum(e.get("llm_calls", 0) for e in ok),
            "indexes_with_results": dict(sorted(indexes.items(), key=lambda kv: -kv[1])),
        }
    return out


def run(args: argparse.Namespace) -> int:
    """Aggregates of the search log (every recall and deep search): counts, latency, rounds, cost;
    and of the LLM's requests, per day and per tool: calls, tokens, latency, outcomes, cost."""
    from mnemoplan.service.llm_log import load_calls, summarise_calls
    from mnemoplan.service.search_log import load_entries

    settings = settings_from_args(args)
    entries = load_entries(settings.data_dir / "searches", args.user)
    summary: dict[str, dict] = summarise_searches(entries)
    llm = summarise_calls(load_calls(settings.data_dir / "llm_calls"))
    if args.json:
        print(json.dumps({**summary, "llm_calls": llm}, indent=2))
        return 0
    print_llm_calls(llm)
    if not entries:
        print("no searches logged yet")
        return 0
    for tool, s in summary.items():
        print(f"{tool}: {s['searches']} searches, {s['errors']} errors, p50 {s['p50_ms']} ms, "
              f"p95 {s['p95_ms']} ms, {s['mean_rounds']} rounds, {s['mean_items']} items, "
              f"{s['llm_calls']} LLM calls, ${s['cost_usd']}")
        if s["indexes_with_results"]:
            found = ", ".join(f"{k} {v}" for k, v in s["indexes_with_results"].items())
            print("   indexes that found something: " + found)
    return 0


def print_llm_calls(llm: dict[str, dict[str, dict]]) -> None:
    """The LLM's requests per day and per tool, a line each (every user's: the log keeps none)."""
    if not llm:
        print("LLM: no requests logged (none configured, or none sent yet)")
        return
    print("LLM requests per day and tool (every user's):")
    for day, tools in llm.items():
        for tool, s in tools.items():
            bad = ", ".join(f"{k} {v}" for k, v in s["outcomes"].items() if k != "ok")
            print(f"  {day} {tool}: {s['calls']} calls ({s['ok']} ok{', ' + bad if bad else ''}), "
                  f"{s['input_tokens']} tokens in, {s['output_tokens']} out, p50 {s['p50_ms']} ms, "
                  f"${s['cost_usd']}; {', '.join(s['models'])}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``stats`` to the command's subparsers."""
    p = sub.add_parser("stats", help="aggregates of the search log", description=run.__doc__)
    add_common_arguments(p, user_help="only this user's searches (default: every user's)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
