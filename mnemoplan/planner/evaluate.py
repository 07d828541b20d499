"""Judging a round of retrieval, and revising the plan, without an LLM.

The evaluator asks what a careful reader would: are the query's entities and key terms
covered by the top results, is the expected kind of answer there (a date for a "when"
question, a number for "how many", several sources for a list), did a step come back
empty, is there a clear leader. The replanner then tries, in order, the revisions that
address what is missing: other indexes, a traversal from the entities found so far,
wider candidate lists, no time filter, an expanded query. It never proposes a plan
that already ran.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mnemoplan.inference.llm import LLMUsage
from mnemoplan.search.base import widened
from mnemoplan.model import MemoryItem, PlanStep, QueryAnalysis, QueryPlan
from mnemoplan.planner.executor import StepResult
from mnemoplan.planner.fingerprint import plan_fingerprint

_WORD = re.compile(r"[a-z][a-z']+")
_NUMBER = re.compile(r"\b\d+([.,]\d+)?\b|\b(one|two|three|four|five|six|seven|eight|nine|ten|dozen|hundred)\b", re.I)
_DATEISH = re.compile(
    r"\b(19|20)\d{2}\b|\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\b|\b(yesterday|today|ago|"
    r"last|next|week|weekend|month|year|monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
    re.I,
)
TOP = 10


@dataclass
class Evaluation:
    """A judgement of one round."""

    sufficient: bool
    confidence: float
    diagnosis: str
    step_assessments: list[dict[str, Any]] = field(default_factory=list)
    suggested_changes: list[str] = field(default_factory=list)
    source: str = "rules"
    coverage: dict[str, float] = field(default_factory=dict)
    usage: LLMUsage | None = None  # the LLM's tokens and cost, when an LLM judged

    def as_dict(self) -> dict[str, Any]:
        """For the result's ``evaluations``."""
        return {
            "sufficient": self.sufficient, "confidence": round(self.confidence, 3), "diagnosis": self.diagnosis,
            "suggested_changes": self.suggested_changes, "source": self.source,
            "coverage": {k: round(v, 3) for k, v in self.coverage.items()},
        }  # fmt: skip


def _stem(word: str) -> str:
    for suffix in ("ing", "ies", "ied", "es", "ed", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _terms(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower())}


def assess_steps(results: list[StepResult], items: list[MemoryItem]) -> list[dict[str, Any]]:
    """Per step: did it contribute to the top results, how much, and what went wrong."""
    top = [i.id for i in items[:TOP]]
    out = []
    for r in results:
        found = {h.id for h in r.hits}
        share = sum(1 for rid in top if rid in found) / max(1, len(top))
        issue = r.error or ("returned nothing" if not r.hits else ("nothing in the top results" if not share else ""))
        out.append({"step_id": r.step.step_id, "index": r.step.index, "useful": share > 0,
                    "quality": round(share, 3), "issue": issue})  # fmt: skip
    return out


def evaluate(analysis: QueryAnalysis, results: list[StepResult], items: list[MemoryItem]) -> Evaluation:
    """Judge whether the top results can answer the query (deterministic)."""
    steps = assess_steps(results, items)
    if not items:
        return Evaluation(False, 0.0, "no results", steps, ["try other indexes", "widen the search"])
    top = items[:TOP]
    text = " ".join(f"{i.speaker} {i.text}" for i in top)
    found_terms = _terms(text)
    keywords = {_stem(k) for k in analysis.keywords}
    term_cov = len(keywords & found_terms) / len(keywords) if keywords else 1.0
    entities = [e for e in analysis.entities if e.known]
    lowered = text.lower()
    ent_cov = sum(1 for e in entities if e.name.lower() in lowered or e.mention.lower() in lowered) / len(
        entities
    ) if entities else 1.0  # fmt: skip
    answer_ok = True
    kind = analysis.answer_type
    if kind == "date":
        answer_ok = any(_DATEISH.search(i.text) for i in top[:5])
    elif kind == "number":
        answer_ok = any(_NUMBER.search(i.text) for i in top[:5])
    elif kind == "list":
        answer_ok = len({i.session_id for i in top}) >= 2
    scores = [i.score for i in top]
    margin = (scores[0] - scores[-1]) / scores[0] if scores and scores[0] > 0 else 0.0
    confidence = 0.4 * term_cov + 0.3 * ent_cov + 0.2 * (1.0 if answer_ok else 0.0) + 0.1 * min(1.0, margin * 2)
    missing = []
    suggestions = []
    if term_cov < 0.6:
        missing.append(f"key terms covered {term_cov:.0%}")
        suggestions.append("expand the query; add hierarchical search")
    if ent_cov < 1.0:
        missing.append(f"entities covered {ent_cov:.0%}")
        suggestions.append("traverse the graph from the entities found")
    if not answer_ok:
        missing.append(f"no {kind} in the top results")
        suggestions.append("look for dated / quantified facts" if kind in ("date", "number") else "widen across sessions")
    empty = [s["step_id"] for s in steps if s["issue"] == "returned nothing"]
    if empty:
        missing.append(f"empty steps: {', '.join(empty)}")
    sufficient = term_cov >= 0.6 and ent_cov >= 0.5 and answer_ok
    diagnosis = "covered" if sufficient and not missing else "; ".join(missing) or "weak coverage"
    return Evaluation(sufficient, round(confidence, 3), diagnosis, steps, suggestions,
                      coverage={"terms": term_cov, "entities": ent_cov, "answer_type": float(answer_ok)})  # fmt: skip


def _expansion_terms(query: str, items: list[MemoryItem], n: int = 6) -> list[str]:
    """Pseudo-relevance feedback: frequent words of the top results the query lacks."""
    have = _terms(query)
    counts: Counter[str] = Counter()
    for item in items[:5]:
        counts.update(w for w in set(_WORD.findall(item.text.lower())) if len(w) > 3 and _stem(w) not in have)
    stop = {"that", "this", "with", "have", "what", "just", "really", "been", "they", "your", "about", "when",
            "there", "their", "from", "were", "would", "could", "like", "it's", "i'm", "that's", "much", "some"}  # fmt: skip
    return [w for w, c in counts.most_common(n * 2) if w not in stop and c >= 2][:n]


def revise(plan: QueryPlan, evaluation: Evaluation, items: list[MemoryItem], tried: set[str]) -> QueryPlan | None:
    """The next plan to try, or None when every revision has run."""
    base = [s for s in plan.steps if s.index in ("bm25", "semantic")] or list(plan.steps)
    upstream = [s.step_id for s in base]
    candidates: list[tuple[str, list[PlanStep]]] = []
    if "hierarchical" not in {s.index for s in plan.steps}:
        candidates.append(("add hierarchical search", [*plan.steps, PlanStep(
            step_id="hier", index="hierarchical", weight=0.3, rationale="answers spread over a session")]))  # fmt: skip
    if "graph_traversal" not in {s.index for s in plan.steps} and evaluation.coverage.get("entities", 1.0) < 1.0:
        candidates.append(("traverse from the entities found", [*plan.steps, PlanStep(
            step_id="walk", index="graph_traversal", depends_on=upstream, weight=0.15,
            rationale="entities of the records found so far")]))  # fmt: skip
    if "fact_store" not in {s.index for s in plan.steps}:
        candidates.append(("add facts", [*plan.steps, PlanStep(
            step_id="facts", index="fact_store", weight=0.3, rationale="distilled facts")]))  # fmt: skip
    temporal = [s for s in plan.steps if s.index == "temporal" and not s.params.get("dated_only")]
    if temporal:
        candidates.append(("drop the time filter", [s for s in plan.steps if s not in temporal]))
    wider = [s.model_copy(update={"params": {**s.params, "top_k": widened(s.params["top_k"], 2)}})
             if "top_k" in s.params and s.index in ("bm25", "semantic") else s for s in plan.steps]  # fmt: skip
    candidates.append(("widen candidate lists", wider))
    extra = _expansion_terms(plan.query, items)
    if extra:
        expanded = f"{plan.query} {' '.join(extra)}"
        candidates.append(("expand the query", [*plan.steps, PlanStep(
            step_id="prf", index="bm25", params={"query": expanded, "top_k": 100}, weight=0.25,
            rationale=f"query expanded with {', '.join(extra)}")]))  # fmt: skip
    for label, steps in candidates:
        used = set()
        unique = []
        for s in steps:  # step ids stay unique when a revision re-adds a step kind
            sid = s.step_id
            while sid in used:
                sid += "'"
            used.add(sid)
            unique.append(s if sid == s.step_id else s.model_copy(update={"step_id": sid}))
        nxt = plan.model_copy(update={"steps": unique, "source": "replan", "name": f"{plan.name}+{label}"})
        if plan_fingerprint(nxt) not in tried:
            return nxt
    return None
