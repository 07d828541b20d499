"""``bench-scale``'s measures in a fresh process, through the service the tools use:

- the first recall of users untouched since start-up (a sample of the smallest users);
- warm recall by user size: each sampled user asked its own conversation's questions;
- ``remember`` of one message;
- one recall of every user, then this process's resident memory (and the graph process's).

``python -m mnemoplan.bench.scale_measure --data-dir DIR --out FILE ...`` (``bench-scale`` runs it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from mnemoplan.bench.metrics import percentile
from mnemoplan.bench.progress import Progress
from mnemoplan.bench.scale import load_sources, questions_by_source
from mnemoplan.bench.scale_build import UserPlan, conversations, plan_users
from mnemoplan.runtime import configure

COLD_USERS = 30  # users of the smallest size whose first recall is timed
USERS_PER_SIZE = 10  # users timed warm, per size


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process now, in MB (0 where /proc is missing)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def timed_recall(service: Any, user: str, query: str) -> float:
    started = time.perf_counter()
    service.recall(query, user_id=user, limit=10)
    return (time.perf_counter() - started) * 1000


def p50_p99(values: list[float]) -> tuple[float, float]:
    return round(percentile(values, 50), 2), round(percentile(values, 99), 2)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from mnemoplan.config import Settings
    from mnemoplan.runtime import settle_heap
    from mnemoplan.service.bootstrap import build_service

    datasets = load_sources(args.dataset)
    sources = conversations(datasets)
    asked = questions_by_source(datasets, sources)
    plans = plan_users(args.users, args.per_user, args.big_user, len(sources))
    rng = random.Random(7)
    service = build_service(Settings(data_dir=args.data_dir, embedding_model=args.embedding_model))
    settle_heap()  # as the server does once its service is built
    try:
        service.embedder.embed(["warm up"])
        questions = lambda p: asked[p.sources[0]]  # noqa: E731
        by_size: dict[int, list[UserPlan]] = {}
        for plan in plans:
            by_size.setdefault(plan.size, []).append(plan)
        # the process's own first recall (model warm-up, shared structures): not a user's cost;
        # made on the largest user, so the smallest ones stay untouched for the cold recalls
        warm_up = plans[-1]
        smallest = [p for p in by_size[min(by_size)] if p is not warm_up]
        cold_users = rng.sample(smallest, min(COLD_USERS, len(smallest)))
        timed_recall(service, warm_up.user_id, questions(warm_up)[0])
        cold = [timed_recall(service, p.user_id, rng.choice(questions(p))) for p in cold_users]
        sizes: dict[str, Any] = {}
        for size, users in sorted(by_size.items()):
            picked = rng.sample(users, min(USERS_PER_SIZE, len(users)))
            per_user = max(1, args.queries // len(picked))
            progress = Progress(f"recall {size}", per_user * len(picked), unit="q")
            times: list[float] = []
            for plan in picked:
                qs = questions(plan)
                timed_recall(service, plan.user_id, qs[0])  # first touch: not warm
                for q in rng.choices(qs, k=per_user):
                    if hasattr(service.embedder, "clear_cache"):
                        service.embedder.clear_cache()  # no query profits from another's embedding
                    times.append(timed_recall(service, plan.user_id, q))
                    progress.advance()
            progress.close()
            p50, p99 = p50_p99(times)
            sizes[str(size)] = {"users": len(picked), "n": len(times), "recall_p50_ms": p50, "recall_p99_ms": p99}
        remembered = []
        for i in range(100):
            plan = rng.choice(plans)
            started = time.perf_counter()
            service.remember(content=f"Scale note {i}: the parking spot this week is P{rng.randint(1, 400)}",
                             user_id=plan.user_id, session_id="scale-notes")  # fmt: skip
            remembered.append((time.perf_counter() - started) * 1000)
        service.settle()
        started = time.perf_counter()
        progress = Progress("touch every user", len(plans), unit="user")
        for plan in plans:
            service.recall(rng.choice(questions(plan)), user_id=plan.user_id, limit=10)
            progress.advance()
        progress.close()
        touch_s = time.perf_counter() - started
        graph_pid = service.store.graph.pid
        cold_p50, cold_p99 = p50_p99(cold)
        rem_p50, rem_p99 = p50_p99(remembered)
        return {
            "by_user_size": sizes, "cold_recall_p50_ms": cold_p50, "cold_recall_p99_ms": cold_p99,
            "cold_users": len(cold), "remember_p50_ms": rem_p50, "remember_p99_ms": rem_p99,
            "touch_all_s": round(touch_s, 1), "rss_mb": round(rss_mb()),
            "graph_rss_mb": round(rss_mb(graph_pid)) if graph_pid else None,
        }  # fmt: skip
    finally:
        service.close()


def main(argv: list[str] | None = None) -> int:
    configure()
    p = argparse.ArgumentParser(prog="python -m mnemoplan.bench.scale_measure", description=__doc__)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dataset", type=Path, action="append", required=True)
    p.add_argument("--users", type=int, required=True)
    p.add_argument("--per-user", type=int, required=True)
    p.add_argument("--big-user", type=int, required=True)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--embedding-model", default="all-MiniLM-L6-v2")
    args = p.parse_args(argv)
    args.out.write_text(json.dumps(measure(args), indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
