"""How a query is understood and answered: analyses, plans and index descriptors.

Plans are data. A named plan (a "recipe") is frozen; a planner that wants a variant
makes a copy with ``model_copy(update=...)`` instead of editing a shared object. A number a
caller sends is finite: NaN and the infinities are no JSON numbers, and no weight or score.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mnemoplan.model.records import UtcDatetime

AnswerType = Literal["text", "yes_no", "number", "date", "list"]
CombinationStrategy = Literal["rrf", "weighted_union", "sequential_filter"]
StepCombine = Literal["union", "intersect", "filter_by"]
ParamType = Literal["string", "integer", "number", "boolean", "datetime", "string_list"]


class EntityRef(BaseModel):
    """An entity named in a query and, when known, the user's entity it resolves to."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    key: str = Field(description="Normalised key (lowercase, accents and punctuation folded).")
    name: str = Field(description="The name as the user's memory knows it, else as written.")
    mention: str = Field("", description="The words of the query that named it.")
    known: bool = Field(False, description="True when the entity exists in this user's memory.")
    participant: bool = Field(False, description="True for someone who speaks in the user's conversations.")
    type: str = ""


class TimeWindow(BaseModel):
    """A resolved time expression: [start, end)."""

    model_config = ConfigDict(frozen=True)

    start: UtcDatetime | None = None
    end: UtcDatetime | None = None
    expression: str = Field("", description="The words that produced the window.")
    relation: Literal["within", "before", "after"] = "within"
    anchor: str = Field("", description="An event the window is relative to ('the wedding'), found in memory.")


class QueryAnalysis(BaseModel):
    """What the deterministic analyzer understood of a query (same query, same analysis)."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    query: str
    intent: Literal["smalltalk", "lookup", "aggregation", "broad", "temporal"] = "lookup"
    skip_retrieval: bool = False
    keywords: list[str] = Field(default_factory=list)
    entities: list[EntityRef] = Field(default_factory=list)
    time_window: TimeWindow | None = None
    answer_type: AnswerType = "text"
    entity_type: str = Field("", description="For aggregation questions: the kind of entity asked for.")
    reference_time: UtcDatetime | None = None
    duration_ms: float = 0.0


class PlanStep(BaseModel):
    """One index query of a plan."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    step_id: str = Field(description="Unique within the plan, e.g. 's1'.")
    index: str = Field(description="Name of a registered index (see explain_plan's indexes).")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters from the index's query_params.")
    rationale: str = ""
    depends_on: list[str] = Field(default_factory=list, description="Steps whose results feed this one.")
    combine: StepCombine = Field(
        "union", description=(
            "How this step's results join those it depends on: union adds them; intersect keeps, of what its "
            "dependencies found, only what it found too; filter_by re-scores what other steps found."
        ),
    )
    weight: float = Field(1.0, ge=0.0, le=10.0, description="Weight of this step in the fusion.")


class QueryPlan(BaseModel):
    """A plan: which indexes to query, with what, and how to combine the results."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field("custom", description="The recipe it came from, or 'custom'.")
    query: str
    analysis: QueryAnalysis | None = None
    steps: list[PlanStep]
    combination_strategy: CombinationStrategy = "weighted_union"
    expected_answer_type: AnswerType = "text"
    max_results: int = Field(10, ge=1, le=100)  # the server caps it lower (deep_max_results, 30 by default)
    source: Literal["deterministic", "llm", "caller", "cache", "replan"] = "deterministic"


class ParamSpec(BaseModel):
    """One query parameter an index accepts."""

    model_config = ConfigDict(frozen=True)

    name: str
    type: ParamType
    required: bool = False
    description: str = ""
    default: Any = None
    minimum: float | None = Field(None, description="Smallest value allowed (numbers).")
    maximum: float | None = Field(None, description="Largest value allowed (numbers).")
    choices: list[str] | None = Field(None, description="The values allowed (strings and string lists).")


class IndexDescriptor(BaseModel):
    """What an index is, for a planner (deterministic, LLM, or the caller's LLM)."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    stores: str = Field(description="What the index holds.")
    best_for: list[str] = Field(default_factory=list)
    query_params: list[ParamSpec] = Field(default_factory=list)
    returns: str = ""
    examples: list[dict[str, Any]] = Field(default_factory=list)
    available: bool = True


class RecallOptions(BaseModel):
    """Safe per-call overrides of recall's defaults."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    weights: dict[str, float] | None = Field(
        None, description="Fusion weight per index (0-5)."
    )
    token_budget: int | None = Field(None, ge=50, le=8000, description="Size of the context string.")
    context_propagation: float | None = Field(
        None, ge=0.0, le=1.0, description="Share of a neighbour's score a turn inherits."
    )
    current_only: bool = Field(
        False, description="Leave out superseded facts and messages."
    )
    kinds: list[Literal["message", "fact", "procedure", "episode", "passage"]] | None = Field(
        None, description="Kinds to rank (default message, fact, procedure)."
    )
