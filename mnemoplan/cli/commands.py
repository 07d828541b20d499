"""Shell commands beyond serving: search and bench."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from mnemoplan.bench.arguments import bench_arguments, scale_arguments


def cmd_search(args: argparse.Namespace) -> int:
    """Run one recall (or deep search) from the shell and print the results with per-phase timings."""
    from mnemoplan.cli.main import _open_service

    service = _open_service(args, existing=True)
    try:
        if service.embedder is not None:  # loaded first: the timings are the search's, not the model's load
            service.embedder.embed(["warm up"])
        if args.deep:
            result = service.deep_search(args.query, user_id=args.user, max_results=args.limit)
            timings = result.stats.durations_ms
        else:
            result = service.recall(args.query, user_id=args.user, limit=args.limit)
            timings = {**result.trace.timings_ms, "total": result.duration_ms}
        if args.json:
            print(result.model_dump_json(indent=2))
            return 0
        for rank, item in enumerate(result.items, 1):
            who = f"{item.speaker}: " if item.speaker else ""
            print(f"{rank:2d}. {item.score:.3f} [{item.occurred_at.date()}] {who}{item.text[:160]}")
        if not result.items:
            print(f"no memories of user {result.user_id!r} match")
        print("timings (ms): " + ", ".join(f"{k}={v:.1f}" for k, v in timings.items()), file=sys.stderr)
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    finally:
        service.close()
    return 0


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
            "p95_ms": round(durations[min(len(durations) - 1, int(0.95 * len(durations)))], 2) if durations else 0.0,
            "mean_rounds": round(sum(e.get("rounds", 1) for e in ok) / len(ok), 2) if ok else 0.0,
            "mean_items": round(sum(e.get("items", 0) for e in ok) / len(ok), 2) if ok else 0.0,
            "cost_usd": round(sum(e.get("cost_usd", 0.0) for e in ok), 6),
            "llm_calls": sum(e.get("llm_calls", 0) for e in ok),
            "indexes_with_results": dict(sorted(indexes.items(), key=lambda kv: -kv[1])),
        }
    return out


def cmd_stats(args: argparse.Namespace) -> int:
    """Aggregates of the search log (every recall and deep search): counts, latency, rounds, cost."""
    import json

    from mnemoplan.service.search_log import load_entries
    from mnemoplan.cli.main import _settings

    settings = _settings(args)
    entries = load_entries(settings.data_dir / "searches", args.user)
    summary = summarise_searches(entries)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    if not entries:
        print("no searches logged yet")
        return 0
    for tool, s in summary.items():
        print(f"{tool}: {s['searches']} searches, {s['errors']} errors, p50 {s['p50_ms']} ms, p95 {s['p95_ms']} ms, "
              f"{s['mean_rounds']} rounds, {s['mean_items']} items, {s['llm_calls']} LLM calls, ${s['cost_usd']}")
        if s["indexes_with_results"]:
            print("   indexes that found something: " + ", ".join(f"{k} {v}" for k, v in s["indexes_with_results"].items()))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark retrieval quality, latency and ingest cost (see bench/README.md)."""
    from mnemoplan.bench.runner import run_from_args

    return run_from_args(args)


def cmd_bench_scale(args: argparse.Namespace) -> int:
    """Build (or reuse) one user holding many messages, time recall, write scale.json and scale.md under --out."""
    from mnemoplan.bench.scale import run_from_args

    return run_from_args(args)


def add_commands(sub: argparse._SubParsersAction, common: Callable[..., None]) -> None:
    """Register the search and bench subcommands."""
    p = sub.add_parser("search", help="run one recall or deep search", description=cmd_search.__doc__)
    common(p)
    p.add_argument("query", help="the question")
    p.add_argument("--deep", action="store_true", help="use deep_memory_search instead of recall")
    p.add_argument("--limit", type=int, default=10, help="how many results (default 10)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("stats", help="aggregates of the search log", description=cmd_stats.__doc__)
    common(p, user_help="only this user's searches (default: every user's)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("bench", help="benchmark recall quality and speed", description=cmd_bench.__doc__)
    bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("bench-scale", help="time recall for one user holding many messages",
                       description=cmd_bench_scale.__doc__)  # fmt: skip
    scale_arguments(p)
    p.set_defaults(func=cmd_bench_scale)


__all__ = ["add_commands", "cmd_bench", "cmd_bench_scale", "cmd_search"]
