"""``mnemoplan bench-scale``: recall latency for one user holding many messages.

The store is built through the same method the ``remember`` tool calls, one call per
session, from LoCoMo's turns replicated in rounds (each round shifted 400 days later, with
its own session ids, so every message is a distinct memory). Recall is then timed warm, in
process, on questions sampled evenly from LoCoMo, all asked of that one user.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnemoplan.bench.datasets import Dataset, Turn, load_locomo
from mnemoplan.bench.metrics import latency_summary
from mnemoplan.bench.progress import Progress
from mnemoplan.bench.runner import machine, peak_rss_mb
from mnemoplan.model import MessageIn
from mnemoplan.model.scope import RecordFilter
from mnemoplan.runtime import configure

if TYPE_CHECKING:  # the service loads the storage libraries: imported where a run needs it
    from mnemoplan.service.service import MemoryService

USER = "scale"
ROUND_SHIFT_DAYS = 400
WARMUP = 10
LIMITS = (10, 50)
TARGET_P50_MS = 50.0


# -- building the store -------------------------------------------------------------------


def sessions_in_rounds(dataset: Dataset) -> Iterator[tuple[int, str, int, list[Turn]]]:
    """(round, conversation id, session number, turns), endlessly: each round, every session in order."""
    sessions: list[tuple[str, int, list[Turn]]] = []
    for conv_id, turns in dataset.turns.items():
        by_session: dict[int, list[Turn]] = {}
        for t in turns:
            by_session.setdefault(t.session, []).append(t)
        sessions.extend((conv_id, n, ts) for n, ts in by_session.items())
    if not sessions:
        raise ValueError("the dataset has no turns")
    r = 0
    while True:
        for conv_id, n, turns in sessions:
            yield r, conv_id, n, turns
        r += 1


def message_of(turn: Turn, r: int) -> MessageIn:
    """One turn as the message stored in round ``r``: its own source id, its time shifted r * 400 days."""
    when = turn.timestamp + timedelta(days=ROUND_SHIFT_DAYS * r) if turn.timestamp else None
    return MessageIn(content=turn.text, speaker=turn.speaker or None, occurred_at=when,
                     source_id=f"r{r}:{turn.conv_id}:{turn.dia_id}")  # fmt: skip


def stored_messages(service: MemoryService) -> int:
    """Message records (not derived memories) the user ``scale`` holds."""
    return service.store.log.count(RecordFilter(USER, kinds=("message",)))


def build_store(service: MemoryService, dataset: Dataset, n: int, have: int) -> dict[str, Any]:
    """Bring the user to ``n`` messages through remember, one call per session, resuming after ``have``.

    The messages are a fixed sequence, so a store holding its first ``have`` messages resumes
    where it stopped (a session cut short is sent again whole; remember skips its repeats).
    """
    progress = Progress("ingest", max(n - have, 0), unit="msg")
    sent = stored = duplicates = derived = calls = 0
    position = 0  # messages of the sequence before this session
    last_round = 0
    started = time.perf_counter()
    for r, conv_id, session, turns in sessions_in_rounds(dataset):
        if position >= n:
            break
        take = turns[: n - position]
        end = position + len(take)
        if end > have:
            result = service.remember(messages=[message_of(t, r) for t in take], user_id=USER,
                                      session_id=f"r{r}-{conv_id}-session_{session}")  # fmt: skip
            calls += 1
            fresh = end - max(position, have)
            sent += len(take)
            stored += result.stored
            duplicates += result.duplicates
            derived += result.derived
            progress.advance(fresh)
        position, last_round = end, r
    service.settle()  # what remember accepted is stored before the store is measured
    seconds = time.perf_counter() - started
    progress.close()
    return {
        "messages_sent": sent, "stored": stored, "duplicates": duplicates, "derived": derived,
        "remember_calls": calls, "rounds": last_round + 1, "seconds": round(seconds, 2),
        "messages_per_s": round(stored / seconds, 1) if stored and seconds else 0.0,
    }  # fmt: skip


# -- timing recall --------------------------------------------------------------------------


def sample_evenly(items: list[str], n: int, offset: float = 0.0) -> list[str]:
    """``n`` items spread evenly over the list (``offset`` in steps shifts the picks)."""
    if not items or n <= 0:
        return []
    step = len(items) / n
    return [items[int(i * step + offset * step) % len(items)] for i in range(n)]


def time_recall(service: MemoryService, queries: list[str], limit: int) -> dict[str, Any]:
    """Warm latency of recall at one limit, with per-phase and per-signal medians."""
    clear = getattr(service.embedder, "clear_cache", None)
    if clear:
        clear()  # no timed query may profit from an embedding computed by the warm-up or another pass
    latencies: list[float] = []
    phases: dict[str, list[float]] = {}
    signals: dict[str, list[float]] = {}
    results: list[int] = []
    progress = Progress(f"limit{limit}", len(queries), unit="q")
    for q in queries:
        started = time.perf_counter()
        result = service.recall(q, user_id=USER, limit=limit)
        latencies.append((time.perf_counter() - started) * 1000)
        for name, ms in result.trace.timings_ms.items():
            phases.setdefault(name, []).append(ms)
        for sig in result.trace.signals:
            signals.setdefault(sig.name, []).append(sig.ms)
        results.append(len(result.items))
        progress.advance()
    progress.close()
    return {
        "latency_ms": latency_summary(latencies),
        "phases_median_ms": {k: round(statistics.median(v), 2) for k, v in phases.items()},
        "signals_median_ms": {k: round(statistics.median(v), 2) for k, v in signals.items()},
        "signals_seen_in": {k: len(v) for k, v in signals.items()},
        "items_median": statistics.median(results) if results else 0,
        "latencies_ms": [round(ms, 2) for ms in latencies],  # in query order, to see drift
    }


def store_facts(service: MemoryService, data_dir: Path) -> dict[str, Any]:
    """Rows, on-disk size and the vector search path of the store as timed."""
    log = service.store.log
    user_rows = log.count(RecordFilter(USER))
    cache_max = log.vector_cache.max_user_rows
    table = getattr(log, "_table", None)  # the log exposes no index listing; read-only look
    indices = sorted(idx.name for idx in table.list_indices()) if table is not None else []
    size = sum(f.stat().st_size for f in data_dir.rglob("*") if f.is_file())
    return {
        "log_rows": log.count(),
        "user_rows": user_rows,
        "user_messages": stored_messages(service),
        "lance_indices": indices,
        "vector_search": "in-memory exact (user within the vector cache)" if user_rows <= cache_max
        else f"LanceDB with prefilter (user rows {user_rows} > vector cache limit {cache_max})",
        "disk_mb": round(size / 2**20, 1),
    }


# -- report ---------------------------------------------------------------------------------


def _table(rows: dict[str, dict[str, Any]], keys: list[str]) -> list[str]:
    lines = ["| | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    lines += [f"| {name} | " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for name, r in rows.items()]
    return lines


def how_built(m: dict[str, Any]) -> str:
    """One paragraph saying exactly how the store was built."""
    ing, st = m["ingest"], m["store"]
    if m["reused"]:
        origin = f"earlier and reused from `{st['data_dir']}` (this run ingested nothing)"
    else:
        origin = f"in this run ({ing['stored']} stored, {ing['remember_calls']} remember calls"
        if m["existing_messages"]:
            origin += f", on top of {m['existing_messages']} already there"
        origin += ")"
    return (
        f"The user `{USER}` holds {m['n_messages']} messages, built {origin}. "
        f"Source: {m['dataset']}'s {m['source_turns']} turns, replicated in rounds through "
        "`MemoryService.remember(messages=[MessageIn(...)], user_id='scale', session_id=...)` "
        "(the remember tool's method), one call per session: round r sends every conversation's "
        "sessions in order with session_id `r{r}-{conv_id}-session_{n}`, source_id "
        "`r{r}:{conv_id}:{dia_id}`, the turn's speaker and text, and occurred_at = the session's time "
        f"+ r x {ROUND_SHIFT_DAYS} days; the sequence stops at exactly {m['target_messages']} messages "
        f"(rounds: {ing['rounds']}). Embeddings: `{m['run']['embedding_model']}`. Then "
        "`store.maintain()` (compaction, and LanceDB's ANN and scalar indexes once the log passes "
        "50,000 rows)."
    )


def write_report(out: Path, m: dict[str, Any]) -> str:
    """scale.md: how the store was built, then the timings."""
    ing, st = m["ingest"], m["store"]
    latency = {f"limit {k}": v["latency_ms"] for k, v in m["recall"].items()}
    lines = [
        f"# Recall at scale: {m['n_messages']} messages, one user",
        "",
        f"{m['run']['date']}, {m['run']['machine']}. Warm, in process; {m['queries']} questions "
        f"sampled evenly from LoCoMo (text only), after {WARMUP} untimed warm-up queries; "
        "query-embedding cache cleared before each timed pass.",
        "",
        "## How the store was built",
        "",
        how_built(m),
        "",
        f"- ingest: {ing['seconds']} s, {ing['messages_per_s']} messages/s "
        f"(model load {m['model_load_s']} s, excluded); derived memories: {ing['derived']}",
        f"- maintain: {m['maintain_s']} s",
        f"- store: {st['log_rows']} log rows ({st['user_rows']} for the user, incl. derived), "
        f"{st['disk_mb']} MiB on disk; Lance indexes: {', '.join(st['lance_indices']) or 'none'}",
        f"- vector search: {st['vector_search']}",
        "",
        "## Recall latency (ms)",
        "",
        *_table(latency, ["p50", "p95", "p99", "mean", "n"]),
        "",
        f"First recall after opening the store (cold, untimed): {m['first_query_ms']} ms. "
        f"Target p50 <= {TARGET_P50_MS:.0f} ms at limit 10: **{'met' if m['target_met'] else 'NOT met'}**.",
        "",
        "## Median per phase and per signal (ms)",
        "",
    ]
    for k, v in m["recall"].items():
        seen = v["signals_seen_in"]
        lines += [
            f"limit {k}: " + ", ".join(f"{n}={ms}" for n, ms in v["phases_median_ms"].items()),
            f"signals (median over the queries that ran them, of {m['queries']}): "
            + ", ".join(f"{n}={ms} ({seen[n]})" for n, ms in v["signals_median_ms"].items()),
            "",
        ]
    lines.append(f"Peak RSS {m['peak_rss_mb']} MiB.")
    text = "\n".join(lines) + "\n"
    (out / "scale.md").write_text(text, encoding="utf-8")
    return text


# -- command --------------------------------------------------------------------------------


def run_from_args(args: argparse.Namespace) -> int:
    """Build (or reuse) the store, time recall, write scale.json and scale.md under --out."""
    configure()  # process-wide settings, when the bench is run without the command
    if args.messages < 1 or args.queries < 1:
        sys.exit("mnemoplan bench-scale: --messages and --queries must be at least 1")
    dataset = load_locomo(args.dataset)
    questions = [q.question for q in dataset.questions]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="mnemoplan-scale-")) if temporary else args.data_dir
    created = temporary or not data_dir.exists()  # never delete a directory this run did not create
    print(f"bench-scale: {args.messages} messages for user {USER!r} from {dataset.name} "
          f"({dataset.n_turns} turns); data in {data_dir}", file=sys.stderr)  # fmt: skip

    from mnemoplan.config import Settings
    from mnemoplan.service.bootstrap import build_service

    service = build_service(Settings(data_dir=data_dir, embedding_model=args.embedding_model))
    try:
        started = time.perf_counter()
        service.embedder.embed(["warm up"])
        model_load_s = time.perf_counter() - started
        have = stored_messages(service)
        reused = have >= args.messages
        if reused:
            print(f"bench-scale: reusing the store ({have} messages already there)", file=sys.stderr)
            ingest = {"messages_sent": 0, "stored": 0, "duplicates": 0, "derived": 0, "remember_calls": 0,
                      "rounds": -(-args.messages // dataset.n_turns),
                      "seconds": 0.0, "messages_per_s": 0.0}  # fmt: skip
        else:
            ingest = build_store(service, dataset, args.messages, have)
        started = time.perf_counter()
        service.store.maintain()
        maintain_s = time.perf_counter() - started
        print(f"bench-scale: maintain {maintain_s:.1f} s", file=sys.stderr)
        facts = store_facts(service, data_dir) | {"data_dir": str(data_dir)}

        warmup = sample_evenly(questions, WARMUP, offset=0.5)
        started = time.perf_counter()
        service.recall(warmup[0], user_id=USER, limit=10)
        first_query_ms = (time.perf_counter() - started) * 1000
        for q in warmup[1:]:
            service.recall(q, user_id=USER, limit=10)
        timed = sample_evenly(questions, args.queries)
        recall = {str(limit): time_recall(service, timed, limit) for limit in LIMITS}
        rss_mb = peak_rss_mb(service)
    finally:
        service.close()

    metrics = {
        "dataset": dataset.name,
        "user_id": USER,
        "target_messages": args.messages,
        "n_messages": facts["user_messages"],
        "source_turns": dataset.n_turns,
        "reused": reused,
        "existing_messages": have,
        "ingest": ingest,
        "model_load_s": round(model_load_s, 2),
        "maintain_s": round(maintain_s, 2),
        "store": facts,
        "queries": len(timed),
        "warmup": WARMUP,
        "first_query_ms": round(first_query_ms, 2),
        "recall": recall,
        "target_p50_ms": TARGET_P50_MS,
        "target_met": recall["10"]["latency_ms"]["p50"] <= TARGET_P50_MS,
        "peak_rss_mb": round(rss_mb, 1),
        "run": {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(),
                "embedding_model": args.embedding_model},  # fmt: skip
    }
    (out / "scale.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    print(write_report(out, metrics), file=sys.stderr)
    if args.keep_data or not created:
        if not args.keep_data:
            print(f"bench-scale: kept {data_dir} (it existed before this run)", file=sys.stderr)
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0
