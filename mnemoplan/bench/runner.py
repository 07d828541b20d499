"""``mnemoplan bench``: ingest a benchmark through remember, query it through recall and friends, score.

Each conversation becomes one memory user, ingested through the same service method the
``remember`` tool calls; questions go through the same method as the tool under test.
Nothing here knows which dataset it runs on: loaders turn every format into one shape.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnemoplan.bench.abstain import run_abstain
from mnemoplan.bench.arguments import MODES
from mnemoplan.bench.datasets import Dataset, Question, load_directory, load_jsonl, load_locomo
from mnemoplan.bench.metrics import latency_summary, summarise, turns_of
from mnemoplan.bench.overhead import measure as plan_overhead
from mnemoplan.bench.progress import Progress
from mnemoplan.bench.report import PLOTS_MISSING, plotting_available, update_readme, write_plots, write_report
from mnemoplan.model import MessageIn
from mnemoplan.runtime import configure

if TYPE_CHECKING:  # the service loads the storage libraries: imported where a run needs it
    from mnemoplan.service.service import MemoryService

RANK_DEPTH = 50  # items asked for; rankings keep at least 25 distinct turns
WARMUP = 10
SINGLE_USER = "bench-single-remember"  # a user of its own: measured users' stores stay as ingested


def load_dataset(args: argparse.Namespace) -> Dataset:
    """The dataset the arguments name."""
    if args.dataset and (args.messages or args.questions):
        sys.exit("mnemoplan bench: give --dataset or --messages/--questions, not both")
    if args.dataset and args.dataset.is_dir():
        return load_directory(args.dataset)
    if args.dataset:
        return load_locomo(args.dataset)
    if args.messages and args.questions:
        return load_jsonl(args.messages, args.questions)
    sys.exit("mnemoplan bench: give --dataset FILE, or --messages FILE --questions FILE")


def machine() -> str:
    """One line about the machine the numbers come from."""
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.machine()} {os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}"


def peak_rss_mb(service: MemoryService | None = None) -> float:
    """Peak resident memory of this process, plus that of the service's graph process (read
    before the service closes). An upper bound: the two peaks need not come at the same time."""
    graph = service.store.graph.peak_rss_mb() if service is not None else None
    try:
        import resource  # POSIX only
    except ImportError:
        return graph or 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 + (graph or 0.0)


def ingest(service: MemoryService, dataset: Dataset) -> dict[str, float]:
    """Store every conversation through remember, one call per session, in order."""
    progress = Progress("ingest", dataset.n_turns, unit="msg")
    started = time.perf_counter()
    for conv_id, turns in dataset.turns.items():
        sessions: dict[int, list[MessageIn]] = {}
        for t in turns:
            sessions.setdefault(t.session, []).append(
                MessageIn(content=t.text, speaker=t.speaker or None, occurred_at=t.timestamp, source_id=t.dia_id)
            )
        for session, messages in sessions.items():
            service.remember(messages=messages, user_id=conv_id, session_id=f"session_{session}")
            progress.advance(len(messages))
    service.settle()  # derived work still under way counts against ingest
    if service.extraction is not None:  # with an LLM, what it reads counts too
        service.extraction.settle()
    service.store.maintain()
    seconds = time.perf_counter() - started
    progress.close()
    return {"messages": dataset.n_turns, "seconds": round(seconds, 2),
            "messages_per_s": round(dataset.n_turns / seconds, 1)}  # fmt: skip


def single_remember(service: MemoryService, dataset: Dataset, n: int = 100) -> dict[str, Any] | None:
    """Latency of ``remember`` storing one message, warm, into a user of its own.

    Turns sampled across the dataset go one per call to a separate user, so the measured
    users' stores are untouched; each call is a new session's next turn, as an agent
    loop sends them.
    """
    turns = [t for ts in dataset.turns.values() for t in ts]
    if not turns or n <= 0:
        return None
    step = max(1, len(turns) // n)
    sample = turns[::step][:n]
    latencies: list[float] = []
    user = f"{SINGLE_USER}-{uuid.uuid4().hex[:8]}"  # fresh on every run, even on a kept --data-dir
    for i, t in enumerate(sample):
        message = MessageIn(content=t.text, speaker=t.speaker or None, occurred_at=t.timestamp)
        started = time.perf_counter()
        result = service.remember(messages=[message], user_id=user, session_id=f"single-{i // 10}")
        elapsed = (time.perf_counter() - started) * 1000
        if result.stored == 1:  # a repeat (the dataset says the same thing twice) is not the write timed
            latencies.append(elapsed)
    return {"messages": len(latencies), **latency_summary(latencies)}


def query_fn(service: MemoryService, mode: str) -> Callable[[Question], list[str]]:
    """How one question is asked in each mode; returns ranked turn ids."""
    if mode == "recall":
        return lambda q: turns_of(service.recall(q.question, user_id=q.conv_id, limit=RANK_DEPTH).items)
    if mode == "deep":
        cap = service.limits.deep_max_results
        return lambda q: turns_of(service.deep_search(q.question, user_id=q.conv_id, max_results=cap).items)
    index = {"bm25": "bm25", "vector": "semantic"}[mode]
    params = {"top_k": RANK_DEPTH} | ({"min_similarity": -1.0} if index == "semantic" else {})

    def single_index(q: Question) -> list[str]:
        hits = service.single_index_search(index, q.question, user_id=q.conv_id, params=params)
        return turns_of(hits)

    return single_index


def run_mode(
    service: MemoryService, mode: str, questions: list[Question]
) -> tuple[dict[str, list[str]], list[float]]:
    """Ask every question (after a short untimed warm-up); rankings and latencies."""
    ask = query_fn(service, mode)
    clear = getattr(service.embedder, "clear_cache", None)
    if clear:
        clear()  # no mode may profit from the query embeddings an earlier mode computed
    for q in questions[:WARMUP]:
        ask(q)
    rankings: dict[str, list[str]] = {}
    latencies: list[float] = []
    progress = Progress(mode, len(questions), unit="q")
    for q in questions:
        started = time.perf_counter()
        ranked = ask(q)
        latencies.append((time.perf_counter() - started) * 1000)
        rankings[q.qid] = ranked
        progress.advance()
    progress.close()
    return rankings, latencies


def mcp_round_trips(data_dir: Path, questions: list[Question], n: int, embedding_model: str) -> dict[str, Any] | None:
    """Time recall (limit 10) through a real MCP stdio round trip on a sample of questions."""
    if n <= 0 or not questions:
        return None
    from mnemoplan.bench.probe import time_stdio_calls

    step = max(1, len(questions) // n)
    timed = questions[::step][:n]
    # Warm as in process: the fresh server has never opened these users (their vectors and
    # records are read on first use), so it first answers one other question of each.
    taken = {q.qid for q in timed}
    first_of_user = {q.conv_id: q for q in reversed(questions) if q.qid not in taken}
    warm = [{"query": q.question, "user_id": q.conv_id, "limit": 10} for q in first_of_user.values()]
    calls = [{"query": q.question, "user_id": q.conv_id, "limit": 10} for q in timed]
    latencies = time_stdio_calls(data_dir, "recall", calls, env={"MNEMOPLAN_EMBEDDING_MODEL": embedding_model},
                                 warmup_calls=warm)  # fmt: skip
    return {"tool": "recall", "limit": 10, "warmup_calls": len(warm), **latency_summary(latencies)}


def cold_starts(data_dir: Path, questions: list[Question], n: int, embedding_model: str) -> dict[str, Any] | None:
    """Median of ``n`` cold starts: a fresh ``mnemoplan serve`` each, timed from spawn to the end
    of initialize, and from there to the reply to a first recall (whose warnings say whether the
    embedding model was ready)."""
    if n <= 0 or not questions:
        return None
    from mnemoplan.bench.probe import cold_first_calls

    q = questions[0]
    runs = cold_first_calls(data_dir, {"query": q.question, "user_id": q.conv_id, "limit": 10}, starts=n,
                            env={"MNEMOPLAN_EMBEDDING_MODEL": embedding_model})  # fmt: skip
    return {"starts": len(runs),
            "initialize_ms_p50": latency_summary([r["initialize_ms"] for r in runs])["p50"],
            "first_recall_ms_p50": latency_summary([r["first_call_ms"] for r in runs])["p50"],
            "keyword_only_answers": sum(1 for r in runs if r["warnings"]), "runs": runs}  # fmt: skip


def write_abstain(out: Path, dataset: Dataset, abstain: dict[str, Any], ingest_stats: dict[str, float]) -> int:
    """abstain.json, and its table on stderr."""
    metrics = {"dataset": dataset.name, "run": {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(),
               "mode": "abstain"}, "conversations": len(dataset.turns), "questions": len(dataset.questions),
               "ingest": ingest_stats, "abstain": abstain}  # fmt: skip
    (out / "abstain.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    lines = ["| part | n | AUROC (best item) | AUROC (rank 1) | no_match own | no_match other | R@10 own |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in ("all", "fit_half", "held_out_half"):
        p = abstain[name]
        lines.append(f"| {name} | {p['questions']} | {p['auroc']:.3f} | {p['auroc_rank1']:.3f} | "
                     f"{p['no_match_own']:.3f} | {p['no_match_other']:.3f} | {p['R@10_own']:.1f} |")  # fmt: skip
    if "refit_on_fit_half" in abstain:
        lines.append(f"refit on the fit half: {abstain['refit_on_fit_half']}")
    (out / "abstain.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines), file=sys.stderr)
    return 0


def run_from_args(args: argparse.Namespace, llm: dict[str, Any] | None = None) -> int:
    """Run the benchmark the arguments describe; writes everything under --out.

    Without an LLM (whatever the environment configures), unless ``llm`` gives the Settings of one
    (``{}``: the environment's); ``--llm`` runs both and sets them side by side (``bench.llm_compare``)."""
    if args.suite:
        if args.dataset or args.messages or args.questions:
            sys.exit("mnemoplan bench: give --suite, --dataset or --messages/--questions, only one")
        from mnemoplan.bench.updates import run_from_args as run_suite

        return run_suite(args, llm)
    configure()  # process-wide settings, when the bench is run without the command
    dataset = load_dataset(args)
    plots = plotting_available()
    if not plots:
        print(PLOTS_MISSING, file=sys.stderr)
    if args.limit_conversations:
        keep = list(dataset.turns)[: args.limit_conversations]
        dataset.turns = {c: dataset.turns[c] for c in keep}
        dataset.questions = [q for q in dataset.questions if q.conv_id in dataset.turns]
    modes = list(MODES) if args.mode == "all" else [] if args.mode == "abstain" else args.mode.split(",")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="mnemoplan-bench-")) if temporary else args.data_dir
    print(f"bench: {dataset.name}, {len(dataset.turns)} conversations, {dataset.n_turns} turns, "
          f"{len(dataset.questions)} questions; data in {data_dir}", file=sys.stderr)  # fmt: skip

    from mnemoplan.config import Settings
    from mnemoplan.service.bootstrap import build_service

    offline = {"llm_provider": "none"} if llm is None else llm
    service = build_service(Settings(data_dir=data_dir, embedding_model=args.embedding_model, **offline))
    live = bool(dataset.questions) and all(q.asked_at for q in dataset.questions)
    per_conv = getattr(args, "questions_per_conversation", None)
    if per_conv is not None and not live:
        seen: dict[str, int] = {}
        kept = []
        for q in dataset.questions:
            seen[q.conv_id] = seen.get(q.conv_id, 0) + 1
            if seen[q.conv_id] <= per_conv:
                kept.append(q)
        dataset.questions = kept
    try:
        started = time.perf_counter()
        service.embedder.embed(["warm up"])
        model_load_s = time.perf_counter() - started
        if live:
            run_live(service, dataset, modes, args, out, model_load_s, plots)
        else:
            ingest_stats = ingest(service, dataset) | {"model_load_s": round(model_load_s, 2)}
            abstain = run_abstain(service, dataset, out) if args.mode == "abstain" else {}
            results: dict[str, Any] = {}
            latencies: dict[str, list[float]] = {}
            session_of = {c: {t.dia_id: t.session for t in ts} for c, ts in dataset.turns.items()}
            for mode in modes:
                rankings, lat = run_mode(service, mode, dataset.questions)
                latencies[mode] = lat
                with (out / f"rankings-{mode}.jsonl").open("w", encoding="utf-8") as fh:
                    for q, ms in zip(dataset.questions, lat, strict=True):
                        fh.write(json.dumps({"qid": q.qid, "ranked": rankings[q.qid], "latency_ms": round(ms, 3)}) + "\n")
                results[mode] = {"quality": summarise(dataset.questions, rankings, session_of),
                                 "latency_ms": latency_summary(lat)}  # fmt: skip
            overhead = plan_overhead(service, dataset.questions) if "recall" in modes else None
            single = single_remember(service, dataset) if modes else None
            rss_mb = peak_rss_mb(service)
    finally:
        service.close()
    if live or args.mode == "abstain":
        code = 0 if live else write_abstain(out, dataset, abstain, ingest_stats)
        if temporary and not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
        return code
    mcp = mcp_round_trips(data_dir, dataset.questions, args.mcp_sample, args.embedding_model) if "recall" in modes else None
    cold = cold_starts(data_dir, dataset.questions, getattr(args, "cold_starts", 0), args.embedding_model)
    metrics = {
        "dataset": dataset.name,
        "run": {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(), "mode": args.mode},
        "conversations": len(dataset.turns),
        "conversation_ids": list(dataset.turns),
        "turns": dataset.n_turns,
        "questions": len(dataset.questions),
        "category_names": dataset.category_names,
        "ingest": ingest_stats,
        "peak_rss_mb": round(rss_mb, 1),
        "mcp_stdio": mcp,
        "cold_start": cold,
        "single_remember_ms": single,
        "plan_overhead": overhead,
        "modes": results,
        "notes": dataset.notes,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    print(write_report(out, metrics), file=sys.stderr)
    if plots:
        write_plots(out, metrics, latencies)
    else:
        print(PLOTS_MISSING, file=sys.stderr)  # again, after the report: the first may have scrolled away
    if args.readme:
        update_readme(args.readme, metrics)
    if temporary and not args.keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0


def run_live(service: MemoryService, dataset: Dataset, modes: list[str], args: argparse.Namespace, out: Path,
             model_load_s: float, plots: bool) -> int:  # fmt: skip
    """The mid-conversation protocol (``bench.live``): questions with ``asked_at`` are asked when
    their turn comes up, each message stored through one ``remember`` call."""
    from mnemoplan.bench.live import FUSION, LiveBench, latency_rows, remember_lines, remember_summary

    bench = LiveBench(service, modes, with_session=not getattr(args, "no_session", False))
    run = bench.run(dataset, getattr(args, "questions_per_conversation", None))
    stored_turns = run.stored
    rss_mb = peak_rss_mb(service)
    session_of = {c: {t.dia_id: t.session for t in ts} for c, ts in dataset.turns.items()}
    lat = latency_rows(run)
    results: dict[str, Any] = {}
    order = [m for m in [*modes, FUSION] if m in run.rankings]
    for mode in order:
        with (out / f"rankings-{mode}.jsonl").open("w", encoding="utf-8") as fh:
            for q, ms in zip(run.questions, run.latencies[mode], strict=True):
                fh.write(json.dumps({"qid": q.qid, "ranked": run.rankings[mode][q.qid], "latency_ms": round(ms, 3)})
                         + "\n")  # fmt: skip
        results[mode] = {"quality": summarise(run.questions, run.rankings[mode], session_of), "latency_ms": lat[mode]}
    remember = remember_summary(run)
    metrics = {
        "dataset": dataset.name,
        "run": {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(), "mode": args.mode,
                "protocol": "mid-conversation", "questions_per_conversation": args.questions_per_conversation},
        "conversations": len(dataset.turns),
        "conversation_ids": list(dataset.turns),
        "turns": stored_turns,
        "questions": len(run.questions),
        "category_names": dataset.category_names,
        "ingest": {"messages": run.stored, "seconds": round(run.remember_s + run.settle_s, 2),
                   "messages_per_s": remember["messages_per_s"], "model_load_s": round(model_load_s, 2)},
        "remember": remember,
        "peak_rss_mb": round(rss_mb, 1),
        "modes": results,
        "notes": [*dataset.notes, "asked mid-conversation: only messages before the asking turn are stored; "
                  "one message per remember call"],
    }  # fmt: skip
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    text = write_report(out, metrics)
    text += "\n" + "\n".join(remember_lines(remember)) + "\n"
    (out / "report.md").write_text(text, encoding="utf-8")
    print(text, file=sys.stderr)
    if plots:
        write_plots(out, metrics, dict(run.latencies))
    return 0
