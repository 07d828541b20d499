"""``mnemoplan bench --mode abstain``: does recall know when memory holds nothing relevant?

Every question is asked twice through ``MemoryService.recall`` (limit 10, as a host asks):
of its own conversation, where its evidence is, and of the next conversation in the dataset,
where it is not. The best item's ``confidence`` should separate the two: the report gives the
AUROC (the chance that an own-conversation question outranks an other-conversation one), the
share of each half that says ``no_match``, and R@10 of the own half (unchanged by confidence,
which does not reorder).

To keep fitting honest, conversations alternate between a *fit* half (even positions) and a
*held-out* half (odd positions): the report gives the AUROC of the shipped model on each,
and the weights of a logistic fitted on the fit half alone, with their AUROC on the held-out
half. Nothing here knows which dataset it runs on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mnemoplan.bench.datasets import Dataset, Question
from mnemoplan.bench.metrics import question_metrics
from mnemoplan.bench.progress import Progress

if TYPE_CHECKING:
    from mnemoplan.service.service import MemoryService

LIMIT = 10
SIGNALS = ("cosine", "coverage", "unknown")


def auroc(positive: list[float], negative: list[float]) -> float:
    """Area under the ROC curve: P(a positive scores above a negative), ties counting half."""
    if not positive or not negative:
        return float("nan")
    scores = np.asarray(positive + negative, dtype=np.float64)
    order = scores.argsort(kind="mergesort")
    ranks = np.empty(len(scores), dtype=np.float64)
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):  # average ranks over ties
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    n_pos, n_neg = len(positive), len(negative)
    return float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-3, rounds: int = 50) -> np.ndarray:
    """Weights (bias first) of a logistic regression by Newton's method, lightly regularised."""
    X = np.hstack([np.ones((len(x), 1)), x])
    w = np.zeros(X.shape[1])
    for _ in range(rounds):
        p = 1 / (1 + np.exp(-np.clip(X @ w, -30, 30)))
        grad = X.T @ (p - y) + l2 * w
        hess = (X * (p * (1 - p))[:, None]).T @ X + l2 * np.eye(X.shape[1])
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def _best(service: MemoryService, question: str, user_id: str) -> tuple[dict[str, Any], list[str]]:
    """The most confident item's confidence and signals, the result's no_match, and its items."""
    result = service.recall(question, user_id=user_id, limit=LIMIT)
    scorer = service.recall_pipeline.confidence
    row: dict[str, Any] = {"no_match": result.no_match, "confidence": 0.0, "rank1": 0.0}
    if result.items and scorer is not None:
        signals = scorer.signals(question, result.analysis, result.items, user_id)
        best = max(range(len(result.items)), key=lambda i: result.items[i].confidence)
        row.update(confidence=result.items[best].confidence, rank1=result.items[0].confidence,
                   **{k: round(getattr(signals[best], k), 5) for k in SIGNALS})  # fmt: skip
    return row, [s for i in result.items for s in (i.source_ids or [i.source_id]) if s]


def run_abstain(service: MemoryService, dataset: Dataset, out: Path) -> dict[str, Any]:
    """Ask every question of its own and of another conversation; write abstain.jsonl, return metrics."""
    convs = list(dataset.turns)
    if len(convs) < 2:
        raise SystemExit("mnemoplan bench --mode abstain needs at least two conversations")
    other = {c: convs[(i + 1) % len(convs)] for i, c in enumerate(convs)}
    fit_half = set(convs[::2])
    session_of = {c: {t.dia_id: t.session for t in ts} for c, ts in dataset.turns.items()}
    rows: list[dict[str, Any]] = []
    progress = Progress("abstain", len(dataset.questions), unit="q")
    with (out / "abstain.jsonl").open("w", encoding="utf-8") as fh:
        for q in dataset.questions:
            own, ranked = _best(service, q.question, q.conv_id)
            away, _ = _best(service, q.question, other[q.conv_id])
            r10 = question_metrics(q, ranked, session_of[q.conv_id])["R@10"]
            row = {"qid": q.qid, "conv_id": q.conv_id, "half": "fit" if q.conv_id in fit_half else "held_out",
                   "category": q.category, "own": own, "other": away, "R@10": r10}  # fmt: skip
            fh.write(json.dumps(row) + "\n")
            rows.append(row)
            progress.advance()
    progress.close()
    return summarise_abstain(rows, dataset.questions)


def summarise_abstain(rows: list[dict[str, Any]], questions: list[Question]) -> dict[str, Any]:
    """AUROC, no_match rates and R@10 overall and per half; a logistic fitted on the fit half."""

    def part(sel: list[dict[str, Any]]) -> dict[str, Any]:
        pos = [r["own"]["confidence"] for r in sel]
        neg = [r["other"]["confidence"] for r in sel]
        return {
            "questions": len(sel),
            "auroc": round(auroc(pos, neg), 4),
            "auroc_rank1": round(auroc([r["own"]["rank1"] for r in sel], [r["other"]["rank1"] for r in sel]), 4),
            "no_match_own": round(float(np.mean([r["own"]["no_match"] for r in sel])), 4) if sel else 0.0,
            "no_match_other": round(float(np.mean([r["other"]["no_match"] for r in sel])), 4) if sel else 0.0,
            "R@10_own": round(100 * float(np.mean([r["R@10"] for r in sel])), 2) if sel else 0.0,
        }

    fit = [r for r in rows if r["half"] == "fit"]
    held = [r for r in rows if r["half"] == "held_out"]
    out: dict[str, Any] = {"all": part(rows), "fit_half": part(fit), "held_out_half": part(held)}

    def matrix(sel: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        x = [[r[side].get(k, 0.0) for k in SIGNALS] for r in sel for side in ("own", "other")]
        y = [1.0 if side == "own" else 0.0 for _ in sel for side in ("own", "other")]
        return np.asarray(x, dtype=np.float64), np.asarray(y)

    if fit and held:
        x, y = matrix(fit)
        w = fit_logistic(x, y)
        xh, yh = matrix(held)
        zh = np.hstack([np.ones((len(xh), 1)), xh]) @ w
        out["refit_on_fit_half"] = {
            "weights": dict(zip(("bias", *SIGNALS), (round(float(v), 3) for v in w), strict=True)),
            "held_out_auroc": round(auroc(list(zh[yh == 1]), list(zh[yh == 0])), 4),
            "note": "signals of the item the shipped model found most confident",
        }
    return out
