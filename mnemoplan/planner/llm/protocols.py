"""What deep search asks of an LLM, as protocols: a planner, a replanner, an evaluator and a
query expander, and the values they answer with. The LLM-backed roles in this package are one
implementation; deep search depends on these alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from mnemoplan.inference.llm import LLMUsage
from mnemoplan.model import IndexDescriptor, MemoryItem, PlanStep, QueryAnalysis, QueryPlan, StepReport
from mnemoplan.planner.evaluate import Evaluation

Validate = Callable[[QueryPlan], QueryPlan]


@dataclass
class PlannerOutcome:
    """What a planning call produced.

    Attributes:
        plan: The validated plan, or None when the caller must fall back.
        usage: Tokens and cost of every LLM call made (a failed call counts only as a failure).
        attempts: Plans asked of the LLM: 1, or 2 when a repair was needed.
        fallback_reason: Why ``plan`` is None, for the caller's warnings; empty on success.
    """

    plan: QueryPlan | None
    usage: LLMUsage = field(default_factory=LLMUsage)
    attempts: int = 0
    fallback_reason: str = ""


@dataclass
class Expansion:
    """What the LLM proposed, and what it cost."""

    rewrite: str
    hypothetical: str
    usage: LLMUsage | None = None

    def steps(self, plan: QueryPlan) -> list[PlanStep]:
        """Extra steps for a plan: BM25 on the rewrite, vectors on the hypothetical memory.

        Each takes the parameters and weight of the plan's own step on that index, so kinds
        and depth match; nothing is added for an index the plan does not use.
        """
        taken = {s.step_id for s in plan.steps}
        extra: list[PlanStep] = []
        for index, text, step_id, why in (
            ("bm25", self.rewrite, "rewrite", "the query rewritten with the words an answer would use"),
            ("semantic", self.hypothetical, "hyde", "vectors of a hypothetical answering memory (HyDE)"),
        ):
            base = next((s for s in plan.steps if s.index == index and not s.depends_on), None)
            if base is None or not text or step_id in taken:
                continue
            extra.append(PlanStep(step_id=step_id, index=index, params={**base.params, "query": text},
                                  weight=base.weight * 0.5, rationale=why))  # fmt: skip
        return extra


class Planner(Protocol):
    """Writes the first plan of a deep search."""

    def plan(
        self,
        query: str,
        analysis: QueryAnalysis,
        descriptors: list[IndexDescriptor],
        baseline: QueryPlan,
        validate: Validate,
        max_results: int,
        *,
        deadline: float | None = None,
    ) -> PlannerOutcome:
        """A validated plan for the query, or none and why (see ``LLMPlanner.plan``)."""
        ...


class Replanner(Protocol):
    """Writes the next plan after an evaluation found the results lacking."""

    def revise(
        self,
        query: str,
        analysis: QueryAnalysis,
        descriptors: list[IndexDescriptor],
        previous: list[QueryPlan],
        evaluation: Evaluation,
        validate: Validate,
        max_results: int,
        *,
        deadline: float | None = None,
    ) -> PlannerOutcome:
        """A validated plan unlike every previous one, or none and why (see ``LLMReplanner.revise``)."""
        ...


class Evaluator(Protocol):
    """Judges whether a round's items answer the query."""

    def evaluate(
        self,
        query: str,
        analysis: QueryAnalysis,
        plan: QueryPlan,
        steps: list[StepReport],
        items: list[MemoryItem],
        round_no: int,
        *,
        deadline: float | None = None,
    ) -> Evaluation:
        """The judgement of one round (see ``LLMEvaluator.evaluate``).

        Raises:
            LLMError: When no judgement could be had; deep search falls back on its rules.
        """
        ...


class Expander(Protocol):
    """Proposes other wordings of a query: a keyword rewrite, a hypothetical answering memory."""

    def expand(self, query: str, analysis: QueryAnalysis, *, deadline: float | None = None) -> Expansion:
        """The query's expansions (see ``LLMExpander.expand``).

        Raises:
            LLMError: When none could be had; deep search runs with the query alone.
        """
        ...
