"""Retrieval metrics over ranked turn lists, per the protocol in ../shared/data/README.md.

Every question with evidence counts; a question with no ranking is a miss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from mnemoplan.bench.datasets import Question

KS = (1, 5, 10, 25)


def distinct(ranked: list[str]) -> list[str]:
    """Turn ids in rank order, first occurrence only."""
    return list(dict.fromkeys(ranked))


def question_metrics(q: Question, ranked: list[str], session_of: Mapping[str, int]) -> dict[str, float]:
    """R@k, any@k and session_R@10 of one question."""
    ranked = distinct(ranked)
    evidence = set(q.evidence)
    out: dict[str, float] = {}
    for k in KS:
        hit = len(evidence & set(ranked[:k]))
        out[f"R@{k}"] = hit / len(evidence)
        if k in (5, 10):
            out[f"any@{k}"] = 1.0 if hit else 0.0
    sessions: list[int] = []
    for dia in ranked:
        s = session_of.get(dia)
        if s is not None and s not in sessions:
            sessions.append(s)
            if len(sessions) == 10:
                break
    wanted = set(q.evidence_sessions)
    out["session_R@10"] = len(wanted & set(sessions)) / len(wanted) if wanted else 0.0
    return out


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0 for an empty list)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def summarise(
    questions: list[Question],
    rankings: Mapping[str, list[str]],
    session_of: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, float]]:
    """Mean metrics (in percent) overall and per category, with question counts."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for q in questions:
        m = question_metrics(q, rankings.get(q.qid, []), session_of.get(q.conv_id, {}))
        groups["overall"].append(m)
        groups[f"category {q.category}"].append(m)
    out: dict[str, dict[str, float]] = {}
    for name, rows in sorted(groups.items(), key=lambda kv: (kv[0] != "overall", kv[0])):
        agg = {key: round(100 * sum(r[key] for r in rows) / len(rows), 2) for key in rows[0]}
        agg["n"] = len(rows)
        out[name] = agg
    return out


def latency_summary(latencies: list[float]) -> dict[str, float]:
    """p50 / p95 / p99 / mean of latencies in milliseconds."""
    return {
        "p50": round(percentile(latencies, 50), 2),
        "p95": round(percentile(latencies, 95), 2),
        "p99": round(percentile(latencies, 99), 2),
        "mean": round(sum(latencies) / len(latencies), 2) if latencies else 0.0,
        "n": len(latencies),
    }


def turns_of(items: Sequence[Any]) -> list[str]:
    """Map ranked items to source turns: a derived item counts as the turns it came from."""
    out: list[str] = []
    for item in items:
        for dia in item.source_ids or ([item.source_id] if item.source_id else []):
            if dia not in out:
                out.append(dia)
    return out
