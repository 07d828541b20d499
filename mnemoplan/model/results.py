"""What the tools return. Each is a pydantic model so MCP clients get an output schema."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from mnemoplan.model.plans import IndexDescriptor, QueryAnalysis, QueryPlan


class RememberResult(BaseModel):
    """Receipt of a remember call."""

    user_id: str
    session_id: str = ""
    ids: list[str] = Field(description="One id per input, in order; a repeat gets the id already stored.")
    stored: int = Field(description="Records newly written.")
    duplicates: int = Field(description="Inputs already in memory, not stored again.")
    derived: int = Field(0, description="Facts and other memories extracted from the input (0 when "
                         "answered once accepted: they follow in the background).")
    warnings: list[str] = Field(default_factory=list)


class MemoryItem(BaseModel):
    """One retrieved memory with how it was found."""

    id: str
    kind: str
    text: str
    speaker: str = ""
    session_id: str = ""
    project_id: str = ""
    occurred_at: datetime
    source_id: str = ""
    score: float = Field(description="Final relevance score (higher is better; comparable within one result).")
    confidence: float = Field(
        0.0, description="How sure the search is that this memory bears on the query, 0-1; unlike score, "
        "the same scale for every query and user."
    )
    scores: dict[str, float] = Field(default_factory=dict, description="Per-signal contributions.")
    provenance: list[str] = Field(default_factory=list, description="Indexes or plan steps that found it.")
    derived_from: list[str] = Field(default_factory=list, description="Source records of a derived memory.")
    source_ids: list[str] = Field(default_factory=list, description="Host ids of the source messages.")
    current: bool = Field(
        True, description="False for a fact a newer one superseded, or a message all of whose facts were "
        "(or a newer message contradicts it: metadata.outdated_by)."
    )
    access_count: int = Field(
        0, description="How often searches returned it before, when the server counts them (count_accesses; "
        "counts land at upkeep)."
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="What was stored with it: the caller's metadata for a memory it stored; for a derived "
        "memory, what its extractor recorded (a fact's subject, predicate, object, negated, confidence; an "
        "episode's topics, entities and sources).",
    )


class SignalStat(BaseModel):
    """How one signal (or plan step) did."""

    name: str
    count: int = 0
    ms: float = 0.0
    error: str = ""


class RecallTrace(BaseModel):
    """What recall did: the plan, and per-signal counts and timings."""

    plan: QueryPlan | None = None
    signals: list[SignalStat] = Field(default_factory=list)
    timings_ms: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class RecallResult(BaseModel):
    """Result of recall: ranked items and a ready-to-paste context."""

    query: str
    user_id: str
    items: list[MemoryItem]
    context: str = Field(description="Token-budgeted text to paste into a prompt.")
    no_match: bool = Field(False, description="True when memory holds nothing relevant (no item is confident).")
    total_candidates: int = 0
    duration_ms: float = 0.0
    skipped_retrieval: bool = Field(False, description="True for small talk that needs no memory.")
    analysis: QueryAnalysis | None = None
    trace: RecallTrace = Field(default_factory=RecallTrace)
    warnings: list[str] = Field(default_factory=list)


class StepReport(BaseModel):
    """Execution report of one plan step, with the evaluator's assessment."""

    round: int
    step_id: str
    index: str
    count: int = 0
    ms: float = 0.0
    error: str = ""
    useful: bool | None = None
    quality: float | None = None
    issue: str = ""


class DeepSearchStats(BaseModel):
    """Counters and timings of a deep search."""

    rounds: int = 0
    candidates_per_index: dict[str, int] = Field(default_factory=dict)
    durations_ms: dict[str, float] = Field(default_factory=dict)
    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    rerank_fallbacks: int = 0


class DeepSearchResult(BaseModel):
    """Result of deep_memory_search."""

    query: str
    user_id: str
    items: list[MemoryItem]
    context: str = Field("", description="Token-budgeted text to paste into a prompt.")
    no_match: bool = Field(False, description="True when memory holds nothing relevant (no item is confident).")
    sufficient: bool = False
    confidence: float = 0.0
    plans: list[QueryPlan] = Field(default_factory=list, description="Every plan executed, in order.")
    steps: list[StepReport] = Field(default_factory=list)
    evaluations: list[dict[str, Any]] = Field(default_factory=list)
    stats: DeepSearchStats = Field(default_factory=DeepSearchStats)
    warnings: list[str] = Field(default_factory=list, description="One line per degraded component.")


class ForgetReceipt(BaseModel):
    """What forget removed, per store."""

    user_id: str
    scope: str = Field(description="ids, session, project or user.")
    ids: list[str] = Field(
        default_factory=list, description="Ids of the records this call removed (the first 20; removed counts them all)."
    )
    removed: int = Field(0, description="How many records this call removed.")
    deleted: dict[str, int] = Field(default_factory=dict, description="Records or rows removed per store.")
    finished_ids: list[str] = Field(
        default_factory=list,
        description=(
            "Ids of records an earlier forget of this user removed without finishing (its purge failed, "
            "say), which this call finished removing and purging (the first 20). Any forget of the user "
            "finishes them, even one that finds nothing left to delete."
        ),
    )
    purged: bool = Field(
        False,
        description=(
            "True when the bytes of every record in ids and finished_ids have left the disk (old log "
            "versions, index segments, graph pages). False when the server was shutting down or the purge "
            "failed (warnings says why): the records are deleted and out of every search, and the next "
            "forget of the user, or the next start, purges them."
        ),
    )
    warnings: list[str] = Field(default_factory=list, description="What did not go as it should, e.g. a "
                                "purge left for later.")  # fmt: skip
    duration_ms: float = 0.0


class ExplainPlanResult(BaseModel):
    """The plans the server would run, and everything a caller needs to write its own."""

    query: str
    user_id: str
    analysis: QueryAnalysis
    recall_plan: QueryPlan
    deep_plan: QueryPlan
    cached_plan: bool = Field(False, description="True when deep search would reuse a cached plan.")
    indexes: list[IndexDescriptor] = Field(default_factory=list, description="Every index's descriptor (full=true).")
    index_summaries: dict[str, str] = Field(
        default_factory=dict, description="Per index: what it is for, its parameters and their defaults."
    )
    planner_instructions: str
    plan_schema: dict[str, Any] = Field(default_factory=dict, description="JSON schema of a QueryPlan (full=true).")


class UserSummary(BaseModel):
    """One user a store holds: ``mnemoplan users``."""

    user_id: str
    records: int = Field(description="Stored records: messages, facts and what was derived from them.")
    sessions: int = Field(description="Distinct sessions.")
