"""``mnemoplan bench --llm``: the same benchmarks without the LLM and with it, side by side.

The LLM is whichever the environment configures (``MNEMOPLAN_LLM_PROVIDER``, ``_BASE_URL``,
``_MODEL``, ``_API_KEY``, or ``ANTHROPIC_API_KEY`` alone), so anyone with a model (a local
Ollama, vLLM or llama.cpp server, or an API) can measure what it adds. The updates suite runs
always, the ``--dataset`` (LoCoMo; or ``--messages``/``--questions``) too when given, each
twice into a data directory of its own: ``offline`` with no LLM, ``llm`` with it, extraction
read to the end before the questions. The LLM run's call log (``service.llm_log``) gives its
cost: requests, tokens and time per message stored and per question asked. Written to ``--out``: the two runs' own outputs, ``llm.json``
and ``llm.md``.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemoplan.bench.arguments import MODES

UPDATE_FIGURES = ("current_first", "outdated_marked", "false_supersede", "history_found")
LOCOMO_FIGURES = ("R@1", "R@5", "R@10", "R@25")


def run_from_args(args: argparse.Namespace) -> int:
    """Run each benchmark offline and with the LLM; write llm.json and llm.md under --out.

    Raises:
        SystemExit: When the environment configures no LLM.
    """
    from mnemoplan.config import Settings
    from mnemoplan.service.llm_log import load_calls, summarise_calls

    settings = Settings()
    if settings.llm_in_use is None:
        sys.exit("mnemoplan bench --llm: no LLM is configured; set MNEMOPLAN_LLM_PROVIDER (and _BASE_URL, _MODEL, "
                 "_API_KEY) or ANTHROPIC_API_KEY (README: Use your own LLM)")  # fmt: skip
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    llm = {"provider": settings.llm_in_use, "model": settings.llm_model_in_use,
           "extraction_model": settings.llm_extraction_model or settings.llm_model_in_use,
           "base_url": settings.llm_base_url_in_use or "(the provider's)"}  # fmt: skip
    benches = [("updates", {"suite": "updates", "dataset": None, "messages": None, "questions": None})]
    if args.dataset or (args.messages and args.questions):
        benches.append(("dataset", {"suite": None, "mode": args.mode if args.mode in MODES else "recall"}))
    report: dict[str, Any] = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "llm": llm, "benches": {}}
    for bench, changes in benches:
        runs: dict[str, Any] = {}
        for label, overrides in (("offline", {"llm_provider": "none"}), ("llm", {})):
            print(f"bench --llm: {bench}, {label}", file=sys.stderr)
            sub = copy.copy(args)
            vars(sub).update(changes, out=out / f"{bench}-{label}", mcp_sample=0, cold_starts=0, readme=None,
                             data_dir=Path(tempfile.mkdtemp(prefix=f"mnemoplan-{bench}-{label}-")))  # fmt: skip
            from mnemoplan.bench.runner import run_from_args as run_bench

            run_bench(sub, overrides)
            metrics = json.loads((sub.out / "metrics.json").read_text(encoding="utf-8"))
            calls = load_calls(sub.data_dir / "llm_calls")
            runs[label] = {"metrics": metrics, "calls": summarise_calls(calls), "totals": _totals(calls)}
            if not args.keep_data:
                shutil.rmtree(sub.data_dir, ignore_errors=True)
        report["benches"][bench] = runs
    (out / "llm.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    text = render(report)
    (out / "llm.md").write_text(text, encoding="utf-8")
    print(text, file=sys.stderr)
    return 0


def _totals(calls: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Requests, tokens and summed latency per tool over a whole run."""
    out: dict[str, dict[str, float]] = {}
    for call in calls:
        if not call.get("sent", True):
            continue
        t = out.setdefault(call.get("tool") or "-", {"calls": 0, "ok": 0, "input_tokens": 0, "output_tokens": 0,
                                                      "seconds": 0.0, "cost_usd": 0.0})  # fmt: skip
        t["calls"] += 1
        t["ok"] += call.get("outcome") == "ok"
        t["input_tokens"] += call.get("input_tokens", 0)
        t["output_tokens"] += call.get("output_tokens", 0)
        t["seconds"] += call.get("latency_ms", 0.0) / 1000
        t["cost_usd"] += call.get("cost_usd", 0.0)
    return out


def _quality(bench: str, metrics: dict[str, Any]) -> dict[str, float | None]:
    if bench == "updates":
        overall = metrics["groups"].get("all", {})
        return {name: (overall.get(name) or {}).get("share") for name in UPDATE_FIGURES}
    out: dict[str, float | None] = {}
    for mode, result in metrics.get("modes", {}).items():
        overall = result["quality"]["overall"]
        out.update({f"{mode} {k}": overall.get(k) for k in LOCOMO_FIGURES})
    return out


def _size(bench: str, metrics: dict[str, Any]) -> tuple[int, int, float]:
    """Messages stored, questions asked, seconds to store them (the LLM's extraction included)."""
    if bench == "updates":
        return metrics["messages"], sum(g["current_first"]["total"] for k, g in metrics["groups"].items()
                                        if k == "all"), metrics["seconds"]  # fmt: skip
    ingest = metrics["ingest"]
    return ingest["messages"], metrics["questions"], ingest["seconds"]


def render(report: dict[str, Any]) -> str:
    """llm.md: quality offline and with the LLM, then what the LLM cost."""
    llm = report["llm"]
    lines = [f"# bench --llm ({report['date']}): {llm['provider']} {llm['model']} "
             f"(extraction: {llm['extraction_model']}) at {llm['base_url']}", ""]  # fmt: skip
    for bench, runs in report["benches"].items():
        name = "updates suite" if bench == "updates" else runs["offline"]["metrics"].get("dataset", bench)
        lines += [f"## {name}", "", "| figure | offline | with the LLM |", "|---|---|---|"]
        offline, with_llm = (_quality(bench, runs[k]["metrics"]) for k in ("offline", "llm"))
        for key in offline:
            lines.append(f"| {key} | {_pct(offline[key], bench)} | {_pct(with_llm.get(key), bench)} |")
        messages, questions, seconds = _size(bench, runs["llm"]["metrics"])
        _, _, offline_s = _size(bench, runs["offline"]["metrics"])
        lines += ["", f"Storing {messages} messages took {offline_s:.1f} s offline, {seconds:.1f} s with the LLM "
                      "(its extraction read to the end).", "",
                  "| tool | requests | ok | per message | tokens in/out per message | LLM s per message | cost |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for tool, t in runs["llm"]["totals"].items():
            per = messages if tool == "remember" else max(questions, 1)
            unit = "message" if tool == "remember" else "question"
            lines.append(f"| {tool} | {t['calls']:.0f} | {t['ok']:.0f} | {t['calls'] / per:.2f} / {unit} | "
                         f"{t['input_tokens'] / per:.0f} / {t['output_tokens'] / per:.0f} | "
                         f"{t['seconds'] / per:.3f} | ${t['cost_usd']:.4f} |")  # fmt: skip
        if not runs["llm"]["totals"]:
            lines.append("| (no request was sent) | 0 | 0 | – | – | – | – |")
        lines.append("")
    return "\n".join(lines)


def _pct(value: float | None, bench: str) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f} %" if bench == "updates" else f"{value:.1f}"
