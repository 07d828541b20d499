"""Shell commands beyond serving: search and bench."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def cmd_search(args: argparse.Namespace) -> int:
    """Run one recall (or deep search) from the shell and print the results with per-phase timings."""
    from mnemoplan.server.cli import _open_service

    service = _open_service(args)
    try:
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
        print("timings (ms): " + ", ".join(f"{k}={v:.1f}" for k, v in timings.items()), file=sys.stderr)
        for warning in result.warnings:
            print(f"warning: {warning}", file=sys.stderr)
    finally:
        service.close()
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmark retrieval quality, latency and ingest cost (see bench/README.md)."""
    from mnemoplan.bench.runner import run_from_args

    return run_from_args(args)


def add_commands(sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register the search and bench subcommands."""
    p = sub.add_parser("search", help="run one recall or deep search", description=cmd_search.__doc__)
    common(p)
    p.add_argument("query", help="the question")
    p.add_argument("--deep", action="store_true", help="use deep_memory_search instead of recall")
    p.add_argument("--limit", type=int, default=10, help="how many results (default 10)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(func=cmd_search)

    from mnemoplan.bench.runner import add_arguments

    p = sub.add_parser("bench", help="benchmark recall quality and speed", description=cmd_bench.__doc__)
    add_arguments(p)
    p.set_defaults(func=cmd_bench)

    from mnemoplan.bench import scale

    p = sub.add_parser("bench-scale", help="time recall for one user holding many messages",
                       description=scale.run_from_args.__doc__)  # fmt: skip
    scale.add_arguments(p)
    p.set_defaults(func=scale.run_from_args)


__all__ = ["add_commands", "cmd_bench", "cmd_search"]
