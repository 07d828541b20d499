"""``mnemoplan bench-scale``: many users, a million memories, many clients at once.

1. Build (or resume) a store of ``--users`` users of ``--per-user`` messages, two of ten times
   that and one of ``--big-user`` (``scale_build``), each distinct text embedded once.
2. In a fresh process (its memory is the server's, not the build's): the first recall of users
   untouched since start-up, warm recall by user size, ``remember`` of one message, then one
   recall of every user and the resident memory after it (``scale_measure``).
3. ``mnemoplan serve --http`` on the store, ``--clients`` clients at once, each its own user and
   token (``scale_load``), then the store is read: every acknowledged write there, every forgotten
   memory gone.

Results go to ``OUT/scale.json`` (read by other tools: keep its keys) and ``OUT/scale.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemoplan.bench.datasets import Dataset, load_directory, load_locomo
from mnemoplan.bench.metrics import latency_summary
from mnemoplan.bench.runner import machine
from mnemoplan.bench.scale_build import Conversation, build_users, conversations, plan_users
from mnemoplan.runtime import configure


def load_sources(paths: list[Path]) -> list[Dataset]:
    """The datasets whose text the store replicates (LoCoMo's JSON, or a generic directory)."""
    return [load_locomo(p) if p.suffix == ".json" else load_directory(p) for p in paths]


def questions_by_source(datasets: list[Dataset], sources: list[Conversation]) -> list[list[str]]:
    """For each source conversation, its questions (every question when it has none)."""
    every = [q.question for d in datasets for q in d.questions]
    of: dict[str, list[str]] = {}
    for d in datasets:
        for q in d.questions:
            of.setdefault(f"{d.name}:{q.conv_id}", []).append(q.question)
    return [of.get(c.conv_id) or every for c in sources]


def disk_bytes(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def build(args: argparse.Namespace, datasets: list[Dataset], data_dir: Path) -> dict[str, Any]:
    """Build or resume the store in this process; what it did."""
    from mnemoplan.bench.scale_build import OnceEmbedder
    from mnemoplan.config import Settings
    from mnemoplan.service.bootstrap import build_service, settings_embedding

    sources = conversations(datasets)
    plans = plan_users(args.users, args.per_user, args.big_user, len(sources))
    settings = Settings(data_dir=data_dir, embedding_model=args.embedding_model)
    once = OnceEmbedder(settings_embedding(settings))
    service = build_service(settings, embedding=once.as_model())
    try:
        have = {u: n for u, (n, _) in service.store.log.user_counts(kinds=("message",)).items()}
        missing = sum(max(0, p.size - have.get(p.user_id, 0)) for p in plans)
        print(f"bench-scale: {len(plans)} users, {sum(p.size for p in plans)} messages planned; "
              f"{missing} to store in {data_dir}", file=sys.stderr)  # fmt: skip
        done = build_users(service, plans, sources, have) if missing else {"stored": 0, "seconds": 0.0}
        started = time.perf_counter()
        if missing:
            service.store.maintain()  # compaction and indexes, as the server's upkeep would
        done |= {"maintain_s": round(time.perf_counter() - started, 1), "texts_embedded": once.embedded,
                 "reused": not missing}  # fmt: skip
        counts = service.store.log.user_counts(kinds=("message",))
        done["memories"] = sum(n for n, _ in service.store.log.user_counts().values())
        done["messages"] = sum(n for n, _ in counts.values())
    finally:
        service.close()
    return done


def measure_in_child(args: argparse.Namespace, data_dir: Path, out: Path) -> dict[str, Any]:
    """``scale_measure`` in a fresh process: its numbers."""
    target = out / "measure.json"
    cmd = [sys.executable, "-m", "mnemoplan.bench.scale_measure", "--data-dir", str(data_dir), "--out", str(target),
           "--users", str(args.users), "--per-user", str(args.per_user), "--big-user", str(args.big_user),
           "--queries", str(args.queries), "--embedding-model", args.embedding_model,
           *[a for p in args.dataset for a in ("--dataset", str(p))]]  # fmt: skip
    subprocess.run(cmd, check=True)
    return json.loads(target.read_text())


def http_load(args: argparse.Namespace, datasets: list[Dataset], data_dir: Path, out: Path) -> dict[str, Any]:
    """The mixed load through the HTTP server, then the store read back."""
    from mnemoplan.bench.scale_load import ClientLog, process_tree_cpu_s, run_load, start_server, stop_server
    from mnemoplan.storage.tokens import TokenStore

    sources = conversations(datasets)
    asked = questions_by_source(datasets, sources)
    plans = [p for p in plan_users(args.users, args.per_user, args.big_user, len(sources)) if p.size == args.per_user]
    tokens = TokenStore(data_dir)
    clients = []
    for plan in plans[: args.clients]:
        secret, _ = tokens.create(user_id=plan.user_id, note="bench-scale load")
        clients.append(ClientLog(plan.user_id, secret, asked[plan.sources[0]]))
    env = {"MNEMOPLAN_EMBEDDING_MODEL": args.embedding_model, "LANCE_LOG": "error"}
    proc, url = start_server(data_dir, out / "server.log", env)
    # CPU of the timed calls: the server's (with its graph process) and this process's, the clients'
    cpu: dict[str, tuple[float | None, float]] = {}

    def mark() -> tuple[float | None, float]:
        return process_tree_cpu_s(proc.pid), time.process_time()

    try:
        started = time.perf_counter()
        run_load(url, clients, args.load_rate, args.load_seconds, on_start=lambda: cpu.update(start=mark()))
        cpu["end"] = mark()
        seconds = time.perf_counter() - started
    finally:
        stop_server(proc)
    return load_report(clients, data_dir, seconds, args, cpu)


def cpu_per_call(cpu: dict[str, tuple[float | None, float]], calls: int) -> dict[str, float | None]:
    """The server's and the clients' CPU milliseconds per timed call: all they spent in the timed
    window (the server's upkeep included) over the calls (None where not measured)."""
    if "start" not in cpu or "end" not in cpu or not calls:
        return {"server_cpu_ms_per_call": None, "client_cpu_ms_per_call": None}
    (s0, c0), (s1, c1) = cpu["start"], cpu["end"]
    server = round((s1 - s0) * 1000 / calls, 1) if s0 is not None and s1 is not None else None
    return {"server_cpu_ms_per_call": server, "client_cpu_ms_per_call": round((c1 - c0) * 1000 / calls, 1)}


def load_report(clients: list[Any], data_dir: Path, seconds: float, args: argparse.Namespace,
                cpu: dict[str, tuple[float | None, float]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Latencies and errors of the load, and what the store holds of its writes and forgets."""
    from mnemoplan.config import Settings
    from mnemoplan.model.scope import RecordFilter
    from mnemoplan.service.bootstrap import build_service

    lost = kept_forgotten = 0
    service = build_service(Settings(data_dir=data_dir, embedding_model="hash"))
    try:
        for c in clients:
            live = [i for i in c.remembered if i not in c.forgotten]
            held = set(service.store.log.ids(RecordFilter(c.user_id, ids=tuple(live + list(c.forgotten)))))
            lost += sum(1 for i in live if i not in held)
            kept_forgotten += sum(1 for i in c.forgotten if i in held)
    finally:
        service.close()
    by_tool: dict[str, Any] = {}
    for tool in ("recall", "remember", "forget"):
        ms = [m for c in clients for t, m, ok in c.calls if t == tool]
        by_tool[tool] = latency_summary(ms) if ms else None
    calls = sum(len(c.calls) for c in clients)
    return {
        "clients": len(clients), "seconds": round(seconds, 1), "rate_asked": args.load_rate,
        "calls": calls, "calls_per_s": round(calls / seconds, 1) if seconds else 0.0,
        "errors": sum(len(c.errors) for c in clients), "error_examples": [e for c in clients for e in c.errors][:5],
        "acknowledged_writes": sum(len(c.remembered) for c in clients), "lost_writes": lost,
        "forgotten": sum(len(c.forgotten) for c in clients), "forgotten_still_stored": kept_forgotten,
        "forgotten_returned": sum(len(c.resurfaced) for c in clients),
        "foreign_returned": sum(len(c.foreign) for c in clients), "latency_ms": by_tool,
        **cpu_per_call(cpu or {}, calls),
    }  # fmt: skip


def write_report(out: Path, m: dict[str, Any]) -> str:
    """scale.md: the store, then each figure."""
    b, s = m["build"], m["by_user_size"]
    lines = [
        f"# bench-scale: {m['memories']} memories, {m['users']} users", "",
        f"{m['run']['date']}, {m['run']['machine']}, embeddings `{m['run']['embedding_model']}`.", "",
        f"- build: {'reused, ' if b.get('reused') else ''}{b.get('stored', 0)} messages stored this run "
        f"in {m['build_s']} s ({b.get('messages_per_s', 0)} messages/s; distinct texts embedded: "
        f"{b.get('texts_embedded', 0)}; maintain {b.get('maintain_s', 0)} s)",
        f"- disk: {m['disk_bytes_per_memory']} bytes per memory ({m['disk_bytes'] / 2**30:.2f} GiB)",
        f"- first recall of a user untouched since start-up: p50 {m['cold_recall_p50_ms']} ms, "
        f"p99 {m['cold_recall_p99_ms']} ms",
        f"- remember of one message: p50 {m['remember_p50_ms']} ms, p99 {m['remember_p99_ms']} ms",
        f"- RSS after one recall of every user: {m['rss_mb']} MB (the graph process: {m['graph_rss_mb']} MB)",
        "", "| user size | users timed | queries | recall p50 ms | p99 ms |", "|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    lines += [f"| {k} | {v['users']} | {v['n']} | {v['recall_p50_ms']} | {v['recall_p99_ms']} |" for k, v in s.items()]
    load = m.get("http")
    if load:
        lt = load["latency_ms"]
        lines += ["", f"HTTP, {load['clients']} clients at once for {load['seconds']} s ({load['calls']} calls, "
                  f"{load['calls_per_s']}/s): errors {load['errors']}, acknowledged writes {load['acknowledged_writes']} "
                  f"(lost {load['lost_writes']}), forgotten {load['forgotten']} (still stored "
                  f"{load['forgotten_still_stored']}, returned by a later recall {load['forgotten_returned']}); "
                  f"another client's notes returned {load.get('foreign_returned', 0)}. CPU per timed call (its "
                  f"share of all the server did meanwhile, upkeep included): server "
                  f"{load.get('server_cpu_ms_per_call') or 'not measured'} ms, clients "
                  f"{load.get('client_cpu_ms_per_call') or 'not measured'} ms.", "",
                  "| tool | n | p50 ms | p95 ms | p99 ms |", "|---|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {t} | {v['n']} | {v['p50']} | {v['p95']} | {v['p99']} |" for t, v in lt.items() if v]
    text = "\n".join(lines) + "\n"
    (out / "scale.md").write_text(text, encoding="utf-8")
    return text


def run_from_args(args: argparse.Namespace) -> int:
    """Build (or reuse) the store, measure, load it over HTTP; write scale.json and scale.md under --out."""
    configure()
    if args.users < 0 or args.per_user < 1 or args.big_user < 0 or args.queries < 1:
        sys.exit("mnemoplan bench-scale: --users, --big-user >= 0; --per-user, --queries >= 1")
    datasets = load_sources(args.dataset)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="mnemoplan-scale-")) if temporary else args.data_dir
    created = temporary or not data_dir.exists()  # never delete a directory this run did not create
    started = time.perf_counter()
    built = build(args, datasets, data_dir)
    build_s = 0.0 if built["reused"] else round(time.perf_counter() - started, 1)
    measured = measure_in_child(args, data_dir, out)
    load = http_load(args, datasets, data_dir, out) if args.clients else None
    size = disk_bytes(data_dir)
    metrics = {
        "memories": built["memories"], "messages": built["messages"],
        "users": args.users + (len(plan_users(0, args.per_user, args.big_user, 1)) if args.big_user else 0),
        "by_user_size": measured["by_user_size"], "cold_recall_p50_ms": measured["cold_recall_p50_ms"],
        "cold_recall_p99_ms": measured["cold_recall_p99_ms"], "cold_users": measured["cold_users"],
        "remember_p50_ms": measured["remember_p50_ms"],
        "remember_p99_ms": measured["remember_p99_ms"], "rss_mb": measured["rss_mb"],
        "graph_rss_mb": measured["graph_rss_mb"], "touch_all_s": measured["touch_all_s"],
        "disk_bytes": size, "disk_bytes_per_memory": round(size / max(built["memories"], 1)),
        "build_s": build_s, "build": built, "http": load, "data_dir": str(data_dir),
        "run": {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(),
                "embedding_model": args.embedding_model, "argv": sys.argv[1:]},
    }  # fmt: skip
    (out / "scale.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    print(write_report(out, metrics), file=sys.stderr)
    if not args.keep_data and created:
        shutil.rmtree(data_dir, ignore_errors=True)
    elif not args.keep_data:
        print(f"bench-scale: kept {data_dir} (it existed before this run)", file=sys.stderr)
    return 0

