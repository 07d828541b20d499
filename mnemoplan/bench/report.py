"""report.md, the PNG plots, and the README's results table."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README_START = "<!-- bench:start -->"
README_END = "<!-- bench:end -->"
COLUMNS = ["R@1", "R@5", "R@10", "R@25", "any@5", "any@10", "session_R@10"]


def _label(group: str, names: dict[str, str]) -> str:
    if group.startswith("category "):
        raw = group.removeprefix("category ")
        return f"{raw} {names[raw]}" if raw in names else f"category {raw}"
    return group


def quality_table(modes: dict[str, Any], names: dict[str, str], group: str = "overall") -> list[str]:
    """Markdown rows: one per mode, for one question group."""
    lines = ["| mode | n | " + " | ".join(COLUMNS) + " | p50 ms | p95 ms | p99 ms |",
             "|---|---|" + "---|" * (len(COLUMNS) + 3)]  # fmt: skip
    for mode, m in modes.items():
        q = m["quality"].get(group)
        if not q:
            continue
        lat = m["latency_ms"]
        cells = " | ".join(f"{q[c]:.1f}" for c in COLUMNS)
        lines.append(f"| {mode} | {q['n']} | {cells} | {lat['p50']:.1f} | {lat['p95']:.1f} | {lat['p99']:.1f} |")
    return lines


def category_table(modes: dict[str, Any], names: dict[str, str], metric: str = "R@10") -> list[str]:
    """Markdown: one row per category, one column per mode."""
    groups = [g for g in next(iter(modes.values()))["quality"] if g != "overall"]
    lines = ["| category | n | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
    for g in groups:
        n = next(iter(modes.values()))["quality"][g]["n"]
        cells = " | ".join(f"{m['quality'][g][metric]:.1f}" for m in modes.values())
        lines.append(f"| {_label(g, names)} | {n} | {cells} |")
    return lines


def deep_minus_recall(modes: dict[str, Any], names: dict[str, str]) -> list[str]:
    """Markdown: deep's R@k less recall's, overall and per category (deep is never to rank below
    recall); empty unless both were run."""
    if "recall" not in modes or "deep" not in modes:
        return []
    recall, deep = modes["recall"]["quality"], modes["deep"]["quality"]
    lines = ["| group | n | R@5 | R@10 | R@25 |", "|---|---|---|---|---|"]
    for g in recall:
        if g in deep:
            cells = " | ".join(f"{deep[g][k] - recall[g][k]:+.2f}" for k in ("R@5", "R@10", "R@25"))
            lines.append(f"| {_label(g, names)} | {recall[g]['n']} | {cells} |")
    return lines


def write_report(out: Path, metrics: dict[str, Any]) -> str:
    """Write report.md and return its text."""
    names = metrics.get("category_names", {})
    modes = metrics["modes"]
    run = metrics["run"]
    lines = [
        f"# Benchmark: {metrics['dataset']}",
        "",
        f"{run['date']} on {run['machine']}; {metrics['conversations']} conversations, "
        f"{metrics['turns']} turns, {metrics['questions']} questions with evidence.",
        "",
        "## Overall (turn level, no LLM)",
        "",
        *quality_table(modes, names),
        "",
        "## R@10 per category",
        "",
        *category_table(modes, names, "R@10"),
        "",
        "## R@5 per category",
        "",
        *category_table(modes, names, "R@5"),
        "",
        *(["## deep − recall (points)", "", *deep_minus_recall(modes, names), ""]
          if deep_minus_recall(modes, names) else []),
        "## Cost",
        "",
        f"- ingest: {metrics['ingest']['messages']} messages in {metrics['ingest']['seconds']:.1f} s = "
        f"**{metrics['ingest']['messages_per_s']:.0f} messages/s** end to end "
        f"(model load {metrics['ingest']['model_load_s']:.1f} s not included)",
        f"- peak RSS: {metrics['peak_rss_mb']:.0f} MB (the server's process and its graph process)",
    ]
    mcp = metrics.get("mcp_stdio")
    if mcp:
        lines.append(
            f"- MCP stdio round trip of `{mcp['tool']}` ({mcp['n']} sampled questions, client to server to client): "
            f"p50 {mcp['p50']:.1f} ms, p95 {mcp['p95']:.1f} ms"
        )
    cold = metrics.get("cold_start")
    if cold:
        lines.append(
            f"- cold start ({cold['starts']} fresh servers, median): initialize {cold['initialize_ms_p50']:.0f} ms after "
            f"spawning, first `recall` reply {cold['first_recall_ms_p50']:.0f} ms after initialize "
            f"({cold['keyword_only_answers']} answered by keywords while the model loaded)"
        )
    single = metrics.get("single_remember_ms")
    if single:
        lines.append(
            f"- `remember` of one message, warm ({single['messages']} calls): "
            f"p50 {single['p50']:.1f} ms, p95 {single['p95']:.1f} ms"
        )
    overhead = metrics.get("plan_overhead")
    if overhead:
        med = overhead["median_ms"]
        lines.append(
            f"- planning and execution overhead, index time excluded, {overhead['plan_steps']}-step deterministic "
            f"plan ({' / '.join(overhead['example_plan'])}; {overhead['questions']} questions): "
            f"median {med['planning_and_execution']:.2f} ms (analyse+plan+validate {med['analyze_plan_validate']:.2f}, "
            f"execute {med['execute']:.2f}), p95 {overhead['p95_ms_planning_and_execution']:.2f} ms; "
            f"fusion {med['fuse']:.2f} ms"
        )
    for note in metrics.get("notes", []):
        lines.append(f"- {note}")
    lines += ["", "Latencies are warm, in process, per query; rankings are in rankings-<mode>.jsonl.", ""]
    text = "\n".join(lines)
    (out / "report.md").write_text(text, encoding="utf-8")
    return text


PLOTS_MISSING = (
    "bench: matplotlib is not installed (pip install 'mnemoplan[bench]'), so the plots are skipped; "
    "every other file is written"
)


def plotting_available() -> bool:
    """Whether the plotting library (the ``bench`` extra) imports: checked before a run, not
    after the work, so a run without it still writes everything but the plots."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_plots(out: Path, metrics: dict[str, Any], latencies: dict[str, list[float]]) -> list[str]:
    """R@10 per category per mode, and the latency distribution per mode, as PNG files.

    Raises:
        ImportError: matplotlib is not installed (see ``plotting_available``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = metrics.get("category_names", {})
    modes = metrics["modes"]
    groups = list(next(iter(modes.values()))["quality"])
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / max(1, len(modes))
    for i, (mode, m) in enumerate(modes.items()):
        xs = [j + i * width for j in range(len(groups))]
        ax.bar(xs, [m["quality"][g]["R@10"] for g in groups], width, label=mode)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))])
    ax.set_xticklabels([_label(g, names) for g in groups], rotation=15)
    ax.set_ylabel("R@10 (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.set_title(f"R@10 per category — {metrics['dataset']}")
    fig.tight_layout()
    fig.savefig(out / "recall_at_10_by_category.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for mode, values in latencies.items():
        if values:
            ax.hist(values, bins=60, alpha=0.55, label=f"{mode} (p50 {sorted(values)[len(values) // 2]:.1f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("latency per query (ms, log scale)")
    ax.set_ylabel("queries")
    ax.legend()
    ax.set_title("Query latency, warm, in process")
    fig.tight_layout()
    fig.savefig(out / "latency.png", dpi=110)
    plt.close(fig)
    return ["recall_at_10_by_category.png", "latency.png"]


def update_readme(readme: Path, metrics: dict[str, Any]) -> None:
    """Replace the README's results block with this run's overall table."""
    run = metrics["run"]
    block = [
        README_START,
        f"Latest full run: {run['date']}, {run['machine']}, `mnemoplan bench --mode {run['mode']}` on "
        f"{metrics['dataset']} ({metrics['questions']} questions, turn-level evidence, no LLM):",
        "",
        *quality_table(metrics["modes"], metrics.get("category_names", {})),
        "",
        f"Ingest {metrics['ingest']['messages_per_s']:.0f} messages/s end to end; peak RSS "
        f"{metrics['peak_rss_mb']:.0f} MB"
        + (f"; MCP stdio round trip p50 {metrics['mcp_stdio']['p50']:.1f} ms" if metrics.get("mcp_stdio") else "")
        + (f"; `remember` of one message p50 {metrics['single_remember_ms']['p50']:.1f} ms"
           if metrics.get("single_remember_ms") else "")
        + (f"; planning and execution overhead of a {metrics['plan_overhead']['plan_steps']}-step plan, index time "
           f"excluded, median {metrics['plan_overhead']['median_ms']['planning_and_execution']:.2f} ms"
           if metrics.get("plan_overhead") else "")
        + ".",
        README_END,
    ]
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(README_START) + ".*?" + re.escape(README_END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: "\n".join(block), text)
    else:
        text = text.rstrip() + "\n\n## Results\n\n" + "\n".join(block) + "\n"
    readme.write_text(text, encoding="utf-8")
