"""``bench-replicas``: what a log in object storage costs, against moto's S3 on loopback.

1. First touch: a user's overlays (BM25, graph, caches) built from the shared log by a server that
   never served the user, for users of 1k, 10k (and optionally 100k) memories.
2. The freshness check: what ``catch_up`` adds to each call when nothing moved (a read of the
   user's head), p50 over many calls on a server whose caches are current.
3. Recall and remember p50/p99 through nginx in front of three replicas, and against one
   local-disk server, in the same run (``replicas_load.py``).

The hash embedder stores memories fast and leaves only storage in the figures. moto answers on
loopback: no network latency of a real S3 region, and a machine shared with other work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mnemoplan.bench.replicas_load import NAMES, compare, free_port, message, percentile
from mnemoplan.config import Settings
from mnemoplan.model import MessageIn
from mnemoplan.model.scope import RecordFilter
from mnemoplan.runtime import configure
from mnemoplan.service.bootstrap import build_service
from mnemoplan.service.service import MemoryService

CREDENTIALS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
BATCH = 500  # messages per remember call while filling a user


@contextmanager
def moto_s3(log_path: Path) -> Iterator[str]:
    """moto's S3 server in its own process on loopback (not this one's GIL); its endpoint URL.

    Raises:
        RuntimeError: moto is not installed (``pip install 'moto[server]'``) or did not start.
    """
    port = free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        ends = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > ends:
                raise RuntimeError(f"moto's S3 server did not start (see {log_path}; pip install 'moto[server]')")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(60)


def new_bucket(endpoint: str, name: str) -> tuple[str, dict[str, str]]:
    """A bucket on the S3 server; the URI of a prefix in it and LanceDB's options to reach it."""
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS).create_bucket(Bucket=name)
    return f"s3://{name}/memory", {"endpoint": endpoint, "region": "us-east-1", "allow_http": "true", **CREDENTIALS}


def open_service(data_dir: Path, uri: str | None = None, options: dict[str, str] | None = None) -> MemoryService:
    """A service with the hash embedder, storing before it answers; its log at ``uri`` if given."""
    settings = Settings(data_dir=data_dir, embedding_model="hash", remember_in_background=False,
                        llm_provider="none", storage_uri=uri, storage_options=options or {})  # fmt: skip
    return build_service(settings)


def fill(service: MemoryService, user: str, count: int) -> None:
    """Store ``count`` messages of ``user``, ``BATCH`` a call, a session each."""
    for start in range(0, count, BATCH):
        batch = [MessageIn(content=message(i), speaker=NAMES[i % len(NAMES)]) for i in range(start, min(count, start + BATCH))]
        service.remember(messages=batch, user_id=user, session_id=f"s{start // BATCH}")


def first_touch(sizes: list[int], work: Path, uri: str, options: dict[str, str]) -> list[dict[str, Any]]:
    """For each size, a user written by one server, then touched first by a server that never
    served them: the rebuild (``catch_up``), and that server's first and later recalls."""
    rows = []
    writer = open_service(work / "writer", uri, options)
    try:
        for n in sizes:
            user = f"u{n}"
            started = time.perf_counter()
            fill(writer, user, n)
            fill_s = time.perf_counter() - started
            reader = open_service(work / f"reader-{n}", uri, options)
            try:
                started = time.perf_counter()
                reader.store.catch_up(user)
                rebuild_ms = (time.perf_counter() - started) * 1000
                started = time.perf_counter()
                reader.recall("what did Maya say about the garden in Oslo", user_id=user)
                first_ms = (time.perf_counter() - started) * 1000
                later = []
                for i in range(20):
                    started = time.perf_counter()
                    reader.recall(f"reference number {100_000 + i * 37 % n}", user_id=user)
                    later.append((time.perf_counter() - started) * 1000)
                records = len(reader.store.log.ids(RecordFilter(user)))  # messages and what they derived
            finally:
                reader.close()
            rows.append({"memories": n, "records": records, "fill_s": round(fill_s, 1),
                         "rebuild_ms": round(rebuild_ms, 1), "first_recall_ms": round(first_ms, 1),
                         "later_recall_p50_ms": percentile(later, 0.5)})  # fmt: skip
            print(f"bench-replicas: first touch {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        writer.close()
    return rows


def freshness(work: Path, uri: str, options: dict[str, str], calls: int) -> dict[str, Any]:
    """The freshness check when nothing moved: ``catch_up`` of a user whose caches are current,
    and recall p50 with and without it, on one server."""
    service = open_service(work / "fresh", uri, options)
    try:
        fill(service, "f", 200)
        service.recall("warm up", user_id="f")
        replica = service.store.replica
        assert replica is not None
        before = replica.refreshes
        checks = []
        for _ in range(calls):
            started = time.perf_counter()
            service.store.catch_up("f")
            checks.append((time.perf_counter() - started) * 1000)
        return {"calls": calls, "catch_up_p50_ms": percentile(checks, 0.5), "catch_up_p99_ms": percentile(checks, 0.99),
                "refreshes_during": replica.refreshes - before}  # fmt: skip
    finally:
        service.close()


def run_from_args(args: argparse.Namespace) -> int:
    """Run the three measurements; write replicas.json under --out and print it."""
    configure()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mnemoplan-replicas-"))
    results: dict[str, Any] = {"argv": sys.argv[1:], "cpus": os.cpu_count(), "moto": "loopback, own process"}
    try:
        with moto_s3(work / "moto.log") as endpoint:
            uri, options = new_bucket(endpoint, "bench-first-touch")
            results["first_touch"] = first_touch(args.sizes, work, uri, options)
            uri, options = new_bucket(endpoint, "bench-freshness")
            results["freshness"] = freshness(work, uri, options, args.calls)
            print(f"bench-replicas: freshness {results['freshness']}", file=sys.stderr, flush=True)
            if not args.no_http:
                uri, options = new_bucket(endpoint, "bench-http")
                results["http"] = compare(work / "http", uri, options, users=args.users, memories=args.memories,
                                          rounds=args.rounds)  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(results, indent=2)
    (out / "replicas.json").write_text(text, encoding="utf-8")
    print(text)
    return 0
