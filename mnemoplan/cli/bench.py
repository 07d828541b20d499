"""``mnemoplan bench``, ``bench-scale`` and ``bench-replicas``: retrieval quality, latency and scale."""

from __future__ import annotations

import argparse

from mnemoplan.bench.arguments import bench_arguments, replicas_arguments, scale_arguments


def run(args: argparse.Namespace) -> int:
    """Benchmark retrieval quality, latency and ingest cost (see bench/README.md)."""
    if args.llm:
        from mnemoplan.bench.llm_compare import run_from_args as run_compare

        return run_compare(args)
    from mnemoplan.bench.runner import run_from_args

    return run_from_args(args)


def run_scale(args: argparse.Namespace) -> int:
    """Build (or reuse) a store of many users (U x M messages, two of 10 x M, one big), time recall by
    user size, the first recall of an untouched user, remember and memory, then load it through the
    HTTP server with many clients at once; write scale.json and scale.md under --out."""
    from mnemoplan.bench.scale import run_from_args

    return run_from_args(args)


def run_replicas(args: argparse.Namespace) -> int:
    """Against moto's S3 on loopback: a user's first touch on a replica (1k, 10k memories), the
    freshness check per call, and recall/remember through nginx and three replicas against one
    local-disk server; write replicas.json under --out. Needs moto (the test extra) and nginx."""
    from mnemoplan.bench.replicas import run_from_args

    return run_from_args(args)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``bench``, ``bench-scale`` and ``bench-replicas`` to the command's subparsers."""
    p = sub.add_parser("bench", help="benchmark recall quality and speed", description=run.__doc__)
    bench_arguments(p)
    p.set_defaults(func=run)

    p = sub.add_parser("bench-scale", help="measure many users, a large store and many clients at once",
                       description=run_scale.__doc__)  # fmt: skip
    scale_arguments(p)
    p.set_defaults(func=run_scale)

    p = sub.add_parser("bench-replicas", help="measure replicas on a log in object storage (moto on loopback)",
                       description=run_replicas.__doc__)  # fmt: skip
    replicas_arguments(p)
    p.set_defaults(func=run_replicas)
