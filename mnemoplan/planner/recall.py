"""The recall pipeline: analyse, plan, run the signals in parallel, fuse, expand, rank, format."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from mnemoplan.errors import InvalidInput, MnemoError, Unavailable
from mnemoplan.search.base import LazyVector, SearchRequest
from mnemoplan.search.registry import IndexRegistry
from mnemoplan.model import (
    MemoryItem,
    PlanStep,
    QueryAnalysis,
    QueryPlan,
    RecallOptions,
    RecallResult,
    RecallTrace,
    Record,
    RecordHead,
    SignalStat,
)
from mnemoplan.model.scope import Scope
from mnemoplan.planner.analyzer import QueryAnalyzer, is_follow_up
from mnemoplan.planner.confidence import ConfidenceScorer, no_match_context
from mnemoplan.planner.deterministic import recall_plan
from mnemoplan.planner.executor import PlanExecutor, StepResult
from mnemoplan.planner.formatter import format_context
from mnemoplan.planner.fusion import Candidate, fuse
from mnemoplan.planner.ranking import RankingConfig, rank
from mnemoplan.planner.slots import slot_first
from mnemoplan.planner.rerank.base import Reranker


class RecordSource(Protocol):
    """Where candidates' records come from (the log)."""

    def get(self, user_id: str, ids: list[str]) -> dict[str, Record]:
        """Records of one user by id."""
        ...

    def heads(self, user_id: str, ids: list[str]) -> dict[str, RecordHead] | None:
        """What ranking reads of some records, if held in memory; else None."""
        ...


@dataclass(frozen=True)
class RecallConfig:
    """Knobs of recall (Settings supply them; a call may override a few).

    Attributes:
        ranking: Expansion and priors.
        modes: Score normalisation per index (see ``fusion.normalise``).
        weights: Fusion weight overrides per index name.
        candidate_pool: How many fused candidates are hydrated and ranked.
        token_budget: Size of the context string.
    """

    ranking: RankingConfig = field(default_factory=RankingConfig)
    modes: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({"semantic": "minmax", "token_match": "minmax"})
    )
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    candidate_pool: int = 120
    token_budget: int = 1_200


def to_item(rec: Record, cand: Candidate, sources: dict[str, Record]) -> MemoryItem:
    """A ranked record as the tools return it."""
    if rec.derived_from:
        source_ids = [sources[s].source_id for s in rec.derived_from if s in sources and sources[s].source_id]
    else:
        source_ids = [rec.source_id] if rec.source_id else []
    return MemoryItem(
        id=rec.id,
        kind=rec.kind,
        text=rec.text,
        speaker=rec.speaker,
        session_id=rec.session_id,
        project_id=rec.project_id,
        occurred_at=rec.occurred_at,
        source_id=rec.source_id,
        score=round(cand.score, 6),
        scores=cand.scores,
        provenance=list(dict.fromkeys(cand.provenance)),
        derived_from=rec.derived_from,
        source_ids=source_ids,
        current=not rec.superseded_by,
        access_count=rec.access_count,
        metadata=_with_validity(rec),
    )


# Indexes whose query is an embedding (or its token vectors): of no use until the model is loaded.
NEEDS_MODEL = frozenset({"semantic", "token_match", "fact_store", "hierarchical", "working_memory"})
MODEL_LOADING = ("the embedding model is still loading (the server has just started): this answer comes from "
                 "keyword search only, and confidence from the words alone; ask again in a few seconds for the full search")


def keyword_only(plan: QueryPlan) -> QueryPlan:
    """The plan without the steps that need the embedding model (and without references to them)."""
    kept = [s for s in plan.steps if s.index not in NEEDS_MODEL]
    names = {s.step_id for s in kept}
    steps = [s.model_copy(update={"depends_on": [d for d in s.depends_on if d in names]}) for s in kept]
    return plan.model_copy(update={"steps": steps})


def _with_validity(rec: Record) -> dict[str, Any]:
    """A record's metadata for its item (a copy: the record may be the cache's, a caller's edits
    stay theirs); an attribute fact's also says when it held: ``valid_from``, ``valid_to``."""
    meta = copy.deepcopy(rec.metadata)
    if rec.kind == "fact" and "attribute" in meta:
        start = rec.valid_from or rec.occurred_at
        meta["valid_from"] = start.isoformat()
        meta["valid_to"] = rec.valid_to.isoformat() if rec.valid_to else None
    return meta


def once_per_message(order: list[Candidate], records: Mapping[str, Record]) -> list[Candidate]:
    """The candidates whose records are known, a message once: a long message and its passages
    count as one, at the rank of the best of them, shown as its best passage when one matched
    (the part of the message that matched, not all of it)."""
    at: dict[str, int] = {}
    out: list[Candidate] = []
    for cand in order:
        rec = records.get(cand.id)
        if rec is None:
            continue
        passage = rec.kind == "passage" and bool(rec.derived_from)
        key = rec.derived_from[0] if passage else rec.id
        if key not in at:
            at[key] = len(out)
            out.append(cand)
        elif passage and records[out[at[key]].id].kind != "passage":  # the message ranked first
            first = out[at[key]]
            out[at[key]] = Candidate(cand.id, first.score, {**cand.scores, **first.scores},
                                     list(dict.fromkeys(first.provenance + cand.provenance)), first.details)  # fmt: skip
    return out


HISTORY_WORDS = 40  # of the conversation, at most, added to a follow-up


def history_context(history: list[str], most: int = HISTORY_WORDS) -> str:
    """The start of the last turn, then of the one before, within ``most`` words: enough to
    resolve "how much?" or "her", too little to swamp the question (a 180-word reply did)."""
    picked: list[str] = []
    for turn in reversed(history[-2:]):
        words = turn.split()[:most]
        if words:
            picked.insert(0, " ".join(words))
            most -= len(words)
    return " ".join(picked)


class RecallPipeline:
    """Deterministic multi-signal retrieval.

    Args:
        registry: Searchable indexes.
        analyzer: The deterministic query analyzer.
        executor: Runs plans.
        records: Hydrates candidates from the log.
        embed_query: Embeds a query string.
        config: Fusion, ranking and formatting knobs.
        reranker: Reorders the ranked items (an LLM or a cross-encoder, see planner.rerank);
            None, the default, keeps the formula's order.
        rerank_deadline_s: Time the reranker may take before the formula's order is kept.
        confidence: Gives each item its confidence and says when nothing is relevant; None
            leaves confidence at 0 and says no_match only for an empty result.
        model_ready: Whether the embedding model is loaded; until it is, recall runs the steps
            that need no embedding (keywords, dates) and says so in its warnings, rather than
            keep the first call of a freshly started server waiting for the model.
    """

    def __init__(
        self,
        *,
        registry: IndexRegistry,
        analyzer: QueryAnalyzer,
        executor: PlanExecutor,
        records: RecordSource,
        embed_query: Callable[[str], np.ndarray],
        config: RecallConfig,
        reranker: Reranker | None = None,
        rerank_deadline_s: float = 2.0,
        confidence: ConfidenceScorer | None = None,
        model_ready: Callable[[], bool] | None = None,
    ) -> None:
        self.registry = registry
        self.analyzer = analyzer
        self.executor = executor
        self.records = records
        self.embed_query = embed_query
        self.config = config
        self.reranker = reranker
        self.rerank_deadline_s = rerank_deadline_s
        self.confidence = confidence
        self.model_ready = model_ready

    def plan(self, analysis: QueryAnalysis, limit: int) -> QueryPlan:
        """The plan recall runs for an analysed query (without the steps of an index this server
        lacks: ``token_match`` needs an embedding model that gives token vectors)."""
        plan = recall_plan(analysis, max_results=limit)
        names = set(self.registry.names)
        if all(step.index in names for step in plan.steps):
            return plan
        return plan.model_copy(update={"steps": [s for s in plan.steps if s.index in names]})

    def execute(self, plan: QueryPlan, scope: Scope, analysis: QueryAnalysis | None) -> list[StepResult]:
        """Run a plan's steps for one scope."""
        base = SearchRequest(
            user_id=scope.user_id,
            query=plan.query,
            params={},
            vector=LazyVector(self.embed_query),
            analysis=analysis,
            project_id=scope.project_id,
            after=scope.after,
            before=scope.before,
        )
        return self.executor.execute(plan, base)

    def single_index(self, index: str, query: str, scope: Scope, params: dict[str, Any]) -> list[MemoryItem]:
        """Query one index and return its hits in its own order, hydrated."""
        plan = QueryPlan(query=query, steps=[PlanStep(step_id=index, index=index, params=params)])
        plan = self.registry.validate(plan)
        [result] = self.execute(plan, scope, None)
        if result.error:
            raise Unavailable(f"index {index} failed: {result.error}")
        ids = list(dict.fromkeys(h.id for h in result.hits))
        records = {rid: r for rid, r in self.records.get(scope.user_id, ids).items() if scope.admits(r)}
        score = {h.id: h.score for h in reversed(result.hits)}
        return [to_item(records[rid], Candidate(rid, score[rid]), records) for rid in ids if rid in records]

    def rank(
        self,
        results: list[StepResult],
        plan: QueryPlan,
        scope: Scope,
        limit: int,
        config: RecallConfig,
        now: datetime,
    ) -> tuple[list[MemoryItem], int]:
        """Fuse, hydrate, filter, expand and rank; returns the items and the candidate count."""
        cands = fuse(results, plan.combination_strategy, modes=config.modes, weights=config.weights)
        pool = sorted(cands.values(), key=lambda c: -c.score)[: config.candidate_pool]
        wants_list = plan.expected_answer_type == "list"
        # Rank on what memory holds of the candidates and read only the records returned: on
        # a large store, reading the whole pool from the log was much of recall's time.
        ids = [c.id for c in pool]
        heads = self.records.heads(scope.user_id, ids) if config.ranking.use_weight <= 0 else None
        rows = heads if heads is not None else self.records.get(scope.user_id, ids)
        rows = {rid: row for rid, row in rows.items() if scope.admits(row)}
        order = rank({c.id: c for c in pool}, rows, config.ranking, now, wants_list=wants_list)
        order, newer = slot_first(self.records, plan.query, order, scope.user_id)
        if heads is None:
            missing = [c.id for c in order[:limit] if c.id not in rows]
            rows = {**rows, **(self.records.get(scope.user_id, missing) if missing else {})}
            ranked, records = once_per_message(order, rows)[:limit], rows
        else:
            ranked, records = self._read_best(order, scope.user_id, limit)
        wanted = [s for c in ranked for s in records[c.id].derived_from if s not in records]
        sources = {**records, **(self.records.get(scope.user_id, wanted) if wanted else {})}
        items = [to_item(records[c.id], c, sources) for c in ranked]
        return (newer.mark(items) if newer is not None else items), len(cands)

    def _read_best(self, order: list[Candidate], user_id: str, limit: int) -> tuple[list[Candidate], dict[str, Record]]:
        """The records of the best ``limit`` candidates; one forgotten since ranking makes room
        for the next (read at least 8 at a time, so many gone at once cost few reads)."""
        ranked: list[Candidate] = []
        records: dict[str, Record] = {}
        start = 0
        while len(ranked) < limit and start < len(order):
            batch = order[start : start + max(limit - len(ranked), 8)]
            start += len(batch)
            records.update(self.records.get(user_id, [c.id for c in batch]))
            ranked = once_per_message(order[:start], records)
        return ranked[:limit], records

    def judge(
        self, query: str, analysis: QueryAnalysis | None, items: list[MemoryItem], user_id: str
    ) -> tuple[list[MemoryItem], bool]:
        """The items with their confidence, and whether memory holds nothing relevant."""
        if self.confidence is None or not items:
            return items, not items
        return self.confidence.annotate(query, analysis, items, user_id)

    def with_options(self, options: RecallOptions | None) -> tuple[RecallConfig, list[str] | None, bool]:
        """Recall's config with a call's overrides; and the kinds to rank, and whether only current facts.

        Raises:
            InvalidInput: a weight for an index that does not exist, or out of range.
        """
        config = self.config
        if options is None:
            return config, None, False
        if options.weights:
            unknown = sorted(set(options.weights) - set(self.registry.names))
            if unknown:
                raise InvalidInput(
                    f"options.weights: unknown index {', '.join(unknown)}.",
                    hint=f"Indexes: {', '.join(self.registry.names)}.",
                )
            outside = sorted(name for name, w in options.weights.items() if not 0.0 <= w <= 5.0)
            if outside:
                raise InvalidInput(f"options.weights: {', '.join(outside)} outside 0-5.", hint="Weights are 0 to 5.")
            config = replace(config, weights=MappingProxyType({**config.weights, **options.weights}))
        if options.token_budget is not None:
            config = replace(config, token_budget=options.token_budget)
        if options.context_propagation is not None:
            config = replace(config, ranking=replace(config.ranking, context_propagation=options.context_propagation))
        return config, options.kinds, options.current_only

    def run(
        self,
        query: str,
        scope: Scope,
        *,
        limit: int,
        reference_time: datetime | None = None,
        options: RecallOptions | None = None,
        history: list[str] | None = None,
    ) -> RecallResult:
        """Recall for one query: the items, a context string, and a trace of what ran.

        A follow-up that leans on the conversation ("how much?") is searched together with
        the last turns of ``history``.
        """
        started = time.perf_counter()
        config, kinds, current_only = self.with_options(options)
        notes: list[str] = []
        searched = query
        if history and is_follow_up(query):
            context = history_context(history)
            searched = f"{context} {query}".strip()
            notes.append(f"follow-up: searched with {len(context.split())} words of the last turns of history")
        analysis = self.analyzer.analyze(searched, scope.user_id, reference_time)
        timings = {"analyze": round(analysis.duration_ms, 3)}
        if analysis.skip_retrieval:
            return RecallResult(
                query=query, user_id=scope.user_id, items=[], context="", skipped_retrieval=True,
                analysis=analysis, duration_ms=round((time.perf_counter() - started) * 1000, 3),
                trace=RecallTrace(timings_ms=timings, notes=["small talk: no retrieval"]),
            )  # fmt: skip
        plan = self.plan(analysis, limit)
        warnings: list[str] = []
        if self.model_ready is not None and not self.model_ready():
            plan = keyword_only(plan)
            warnings.append(MODEL_LOADING)
        if kinds:
            plan = plan.model_copy(update={"steps": [
                s.model_copy(update={"params": {**s.params, "kinds": list(kinds)}}) if "kinds" in s.params else s
                for s in plan.steps]})  # fmt: skip
        t0 = time.perf_counter()
        results = self.execute(plan, scope, analysis)
        timings["signals"] = round((time.perf_counter() - t0) * 1000, 3)
        t0 = time.perf_counter()
        items, total = self.rank(results, plan, scope, limit, config, reference_time or datetime.now(UTC))
        if current_only:  # what the store replaced; not what this answer only doubts (``slots.HeldValue``)
            items = [i for i in items if i.current or "outdated_by" in i.metadata]
        timings["rank"] = round((time.perf_counter() - t0) * 1000, 3)
        warnings += [f"{r.step.step_id} ({r.step.index}) failed: {r.error}" for r in results if r.error]
        if self.reranker is not None and items:
            t0 = time.perf_counter()
            try:
                outcome = self.reranker.rerank(
                    query, items, deadline_s=self.rerank_deadline_s, user_id=scope.user_id
                )
                items = outcome.items
                notes.extend(outcome.notes)
            except MnemoError as exc:
                warnings.append(f"rerank skipped: {exc.message}")
            timings["rerank"] = round((time.perf_counter() - t0) * 1000, 3)
        t0 = time.perf_counter()
        items, nothing = self.judge(searched, analysis, items, scope.user_id)
        context = no_match_context(items) if nothing else format_context(items, config.token_budget)
        timings["format"] = round((time.perf_counter() - t0) * 1000, 3)
        return RecallResult(
            query=query,
            user_id=scope.user_id,
            items=items,
            context=context,
            no_match=nothing,
            total_candidates=total,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
            analysis=analysis,
            trace=RecallTrace(
                plan=plan,
                signals=[
                    SignalStat(name=r.step.step_id, count=len(r.hits), ms=round(r.ms, 3), error=r.error)
                    for r in results
                ],
                timings_ms=timings,
                notes=notes,
            ),
            warnings=warnings,
        )
