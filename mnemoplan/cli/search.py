"""``mnemoplan search``: one recall or deep search from the shell, with per-phase timings."""

from __future__ import annotations

import argparse
import sys

from mnemoplan.cli.common import add_common_arguments, open_service


def run(args: argparse.Namespace) -> int:
    """Run one recall (or deep search) from the shell and print the results with per-phase timings."""
    service = open_service(args, existing=True, shared=True)
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


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``search`` to the command's subparsers."""
    p = sub.add_parser("search", help="run one recall or deep search", description=run.__doc__)
    add_common_arguments(p)
    p.add_argument("query", help="the question")
    p.add_argument("--deep", action="store_true", help="use deep_memory_search instead of recall")
    p.add_argument("--limit", type=int, default=10, help="how many results (default 10)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")
    p.set_defaults(func=run)
