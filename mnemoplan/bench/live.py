"""Questions asked mid-conversation, as an agent asks them.

For a dataset whose questions carry ``asked_at`` (the turn that asks), each conversation is
stored in order, one message per ``remember`` call as an agent loop sends them, and each
question is asked when its turn comes up, with only the earlier messages in memory. The
asking turn itself is not stored before it is asked.

A question is asked right after the turn before it was remembered, as an agent asks: the
session's own turns may still wait to be embedded, and the recall's time includes whatever it
waits for. Earlier sessions were said long before (a conversation's pace, not a bench's burst):
the bench lets their messages be stored when a new session starts, timed as ingest.

Beside the tools (recall, deep) it scores BM25 alone, MiniLM alone and their reciprocal-rank
fusion on the same stores at the same moments, and times every ``remember`` by message length.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mnemoplan.bench.datasets import Dataset, Question, Turn
from mnemoplan.bench.metrics import latency_summary, percentile, turns_of
from mnemoplan.bench.progress import Progress
from mnemoplan.model import MessageIn

if TYPE_CHECKING:
    from mnemoplan.service.service import MemoryService

RANK_DEPTH = 50
RRF_K = 60  # the constant of Cormack et al.'s reciprocal-rank fusion
RECENT_TURNS = 6  # turns of the asking session a host passes along with a recall
LENGTH_BUCKETS = ((0, 50), (51, 150), (151, 400), (401, 10**9))  # words per message
FUSION = "fusion"


def rrf(*rankings: list[str], k: int = RRF_K) -> list[str]:
    """Reciprocal-rank fusion of ranked id lists (each id once per list)."""
    score: dict[str, float] = defaultdict(float)
    for ranking in rankings:
        for rank, rid in enumerate(dict.fromkeys(ranking), 1):
            score[rid] += 1.0 / (k + rank)
    return sorted(score, key=lambda rid: -score[rid])


def asked_in_order(dataset: Dataset, per_conversation: int | None) -> dict[str, dict[str, list[Question]]]:
    """Per conversation, the questions by the dia_id of the turn that asks them (the first
    ``per_conversation`` in conversation order, if given).

    Raises:
        ValueError: a question without ``asked_at``, or one naming a turn the conversation lacks.
    """
    out: dict[str, dict[str, list[Question]]] = {}
    for conv_id, turns in dataset.turns.items():
        position = {t.dia_id: i for i, t in enumerate(turns)}
        qs = [q for q in dataset.questions if q.conv_id == conv_id]
        for q in qs:
            if q.asked_at is None or q.asked_at not in position:
                raise ValueError(f"question {q.qid}: asked_at {q.asked_at!r} is not a turn of {conv_id}")
        qs.sort(key=lambda q: position[q.asked_at or ""])
        if per_conversation is not None:
            qs = qs[:per_conversation]
        by_turn: dict[str, list[Question]] = {}
        for q in qs:
            by_turn.setdefault(q.asked_at or "", []).append(q)
        out[conv_id] = by_turn
    return out


def recent_turns(turns: list[Turn], i: int, n: int = RECENT_TURNS) -> list[str]:
    """The last ``n`` turns of the session turn ``i`` belongs to, before it: what the host holds."""
    session = turns[i].session
    out: list[str] = []
    j = i - 1
    while j >= 0 and turns[j].session == session and len(out) < n:
        if turns[j].text.strip():
            out.insert(0, turns[j].text)
        j -= 1
    return out


@dataclass
class LiveRun:
    """What a mid-conversation run gathered."""

    rankings: dict[str, dict[str, list[str]]] = field(default_factory=lambda: defaultdict(dict))
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    remember: list[tuple[int, str, float]] = field(default_factory=list)  # (words, speaker, ms)
    stored: int = 0
    remember_s: float = 0.0
    settle_s: float = 0.0
    questions: list[Question] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)  # records accepted and not yet stored, at each question


class LiveBench:
    """Stores each conversation one message per call and asks each question at its turn.

    Args:
        service: The memory service.
        modes: Tool modes to ask (recall, deep, bm25, vector); bm25 and vector together add fusion.
        with_session: Recall and deep are told the session they are asked from (recall also its
            recent turns, as ``history``).
    """

    def __init__(self, service: MemoryService, modes: list[str], *, with_session: bool = True) -> None:
        self.service = service
        self.modes = modes
        self.with_session = with_session
        self._clear = getattr(service.embedder, "clear_cache", None)
        self._warm: set[str] = set()

    def ask(self, mode: str, q: Question, turns: list[Turn], i: int) -> list[str]:
        """One question in one mode; ranked turn ids."""
        svc = self.service
        when = turns[i].timestamp
        if mode == "recall":
            extra: dict[str, Any] = {}
            if self.with_session:
                extra = {"session_id": f"session_{turns[i].session}", "history": recent_turns(turns, i)}
            result = svc.recall(q.question, user_id=q.conv_id, limit=RANK_DEPTH, reference_time=when, **extra)
            return turns_of(result.items)
        if mode == "deep":
            own = {"session_id": f"session_{turns[i].session}"} if self.with_session else {}
            result = svc.deep_search(q.question, user_id=q.conv_id, max_results=svc.limits.deep_max_results,
                                     reference_time=when, **own)  # fmt: skip
            return turns_of(result.items)
        index = {"bm25": "bm25", "vector": "semantic"}[mode]
        params = {"top_k": RANK_DEPTH} | ({"min_similarity": -1.0} if index == "semantic" else {})
        return turns_of(svc.single_index_search(index, q.question, user_id=q.conv_id, params=params))

    def _settle(self, run: LiveRun) -> None:
        """Let every accepted message be stored, timed as ingest."""
        started = time.perf_counter()
        settle = getattr(self.service, "settle", None)
        if settle:
            settle()
        run.settle_s += time.perf_counter() - started

    def _ask_all(self, run: LiveRun, q: Question, turns: list[Turn], i: int) -> None:
        deferred = getattr(self.service, "deferred", None)
        run.waiting.append(deferred.pending(q.conv_id) if deferred is not None else 0)
        for mode in self.modes:
            if mode not in self._warm:  # the first call of a mode loads what it reads: untimed
                self.ask(mode, q, turns, i)
                self._warm.add(mode)
            if self._clear:
                self._clear()  # no mode profits from the query embedding another computed
            started = time.perf_counter()
            ranked = self.ask(mode, q, turns, i)
            run.latencies[mode].append((time.perf_counter() - started) * 1000)
            run.rankings[mode][q.qid] = ranked
        if "bm25" in self.modes and "vector" in self.modes:
            run.rankings[FUSION][q.qid] = rrf(run.rankings["bm25"][q.qid], run.rankings["vector"][q.qid])
            run.latencies[FUSION].append(run.latencies["bm25"][-1] + run.latencies["vector"][-1])
        run.questions.append(q)

    def _remember(self, run: LiveRun, conv_id: str, t: Turn) -> None:
        if not t.text.strip():
            return  # an empty turn is not a memory (remember refuses it)
        message = MessageIn(content=t.text, speaker=t.speaker or None, occurred_at=t.timestamp, source_id=t.dia_id)
        started = time.perf_counter()
        self.service.remember(messages=[message], user_id=conv_id, session_id=f"session_{t.session}")
        elapsed = time.perf_counter() - started
        run.remember_s += elapsed
        run.remember.append((len(t.text.split()), t.speaker, elapsed * 1000))
        run.stored += 1

    def run(self, dataset: Dataset, per_conversation: int | None = None) -> LiveRun:
        """Store and ask every conversation; the rankings, latencies and remember timings."""
        asked = asked_in_order(dataset, per_conversation)
        run = LiveRun()
        plan: list[tuple[str, list[Turn], int]] = []
        for conv_id, turns in dataset.turns.items():
            index = {t.dia_id: i for i, t in enumerate(turns)}
            last = max((index[d] for d in asked[conv_id]), default=-1)
            plan.append((conv_id, turns, last))
        total = sum(last + 1 for _, _, last in plan)
        progress = Progress("live", total, unit="msg")
        for conv_id, turns, last in plan:
            for i in range(last + 1):
                if i == 0 or turns[i].session != turns[i - 1].session:
                    self._settle(run)  # earlier sessions were said long ago
                for q in asked[conv_id].get(turns[i].dia_id, []):
                    self._ask_all(run, q, turns, i)
                if i < last:
                    self._remember(run, conv_id, turns[i])
                progress.advance()
        self._settle(run)  # derived work still queued counts against sustained throughput
        progress.close()
        return run


def remember_summary(run: LiveRun) -> dict[str, Any]:
    """``remember`` latency by message length and speaker, and the sustained rate."""
    by_bucket: dict[str, Any] = {}
    for low, high in LENGTH_BUCKETS:
        values = [ms for words, _, ms in run.remember if low <= words <= high]
        label = f"{low}-{high} words" if high < 10**9 else f">{low - 1} words"
        if values:
            by_bucket[label] = length_row(values)
    by_speaker: dict[str, Any] = {}
    for speaker in sorted({s for _, s, _ in run.remember}):
        by_speaker[speaker or "(none)"] = length_row([ms for _, s, ms in run.remember if s == speaker])
    around = [ms for words, _, ms in run.remember if 180 <= words <= 300]
    seconds = run.remember_s + run.settle_s
    return {
        "messages": run.stored,
        "seconds_in_remember": round(run.remember_s, 2),
        "seconds_settling": round(run.settle_s, 2),
        "messages_per_s": round(run.stored / seconds, 1) if seconds else 0.0,
        "all": length_row([ms for _, _, ms in run.remember]),
        "replies_180_300_words": length_row(around) if around else None,
        "waiting_at_question": length_row([float(n) for n in run.waiting]) if run.waiting else None,
        "by_length": by_bucket,
        "by_speaker": by_speaker,
    }


def length_row(values: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max of some remember latencies (ms)."""
    return {"p50": round(percentile(values, 50), 1), "p90": round(percentile(values, 90), 1),
            "p99": round(percentile(values, 99), 1), "max": round(max(values), 1), "n": len(values)}  # fmt: skip


def remember_lines(summary: dict[str, Any]) -> list[str]:
    """Markdown: remember latency by message length."""
    lines = [f"`remember`, one message per call: {summary['messages']} messages, "
             f"**{summary['messages_per_s']:.1f} messages/s** sustained "
             f"({summary['seconds_in_remember']:.1f} s in remember + {summary['seconds_settling']:.1f} s "
             "finishing derived work)", "",
             "| messages | n | p50 ms | p90 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]  # fmt: skip
    rows = {"all": summary["all"], **summary["by_length"], **{f"speaker {k}": v for k, v in summary["by_speaker"].items()}}
    if summary.get("replies_180_300_words"):
        rows["replies of 180-300 words"] = summary["replies_180_300_words"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['n']} | {r['p50']:.1f} | {r['p90']:.1f} | {r['p99']:.1f} | {r['max']:.1f} |")
    waiting = summary.get("waiting_at_question")
    if waiting:
        lines += ["", f"Messages accepted and not yet stored when a question was asked (recall searches them by "
                  f"their words): p50 {waiting['p50']:.0f}, p90 {waiting['p90']:.0f}, max {waiting['max']:.0f}."]
    return lines


def latency_rows(run: LiveRun) -> dict[str, dict[str, float]]:
    """Query latency per mode."""
    return {mode: latency_summary(values) for mode, values in run.latencies.items()}
