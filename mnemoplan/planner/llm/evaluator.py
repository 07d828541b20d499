"""The LLM as judge of a round of retrieval: enough to answer, and what each step contributed."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, model_validator

from mnemoplan.model import MemoryItem, QueryAnalysis, QueryPlan, StepReport
from mnemoplan.planner.evaluate import Evaluation
from mnemoplan.planner.fingerprint import normalise
from mnemoplan.inference.llm import LLMClient
from mnemoplan.inference.llm_json import JSON_ONLY
from mnemoplan.planner.llm.prompts import analysis_json, clamp, compact, item_line

MAX_ITEMS = 20

EVALUATOR_SYSTEM = (
    "You judge whether memories retrieved for a query are enough to answer it, from the memories "
    "shown only. " + JSON_ONLY + ' Schema: {"sufficient": true | false, "confidence": <0-1>, '
    '"diagnosis": "<what is missing or wrong, one or two sentences>", "step_assessments": '
    '[{"step_id": "<id>", "useful": true | false, "quality": <0-1>, "issue": "<short, or empty>"}], '
    '"suggested_changes": ["<concrete change to the plan>"]}'
)


class _StepAssessment(BaseModel):
    step_id: str
    useful: bool = False
    quality: float = 0.0
    issue: str = ""


class _EvaluationReply(BaseModel):
    sufficient: bool
    confidence: float = 0.5
    diagnosis: str = ""
    step_assessments: list[_StepAssessment] = []
    suggested_changes: list[str] = []

    @model_validator(mode="before")
    @classmethod
    def _steps(cls, data: Any) -> Any:
        if isinstance(data, dict) and "step_assessments" not in data and "steps" in data:
            return {**data, "step_assessments": data["steps"]}  # a common slip, harmless to accept
        return data


class LLMEvaluator:
    """Asks the LLM whether a round's items answer the query, and what each step contributed.

    Args:
        client: The shared LLM client.
        max_tokens: Cap on the reply's length.
    """

    def __init__(self, client: LLMClient, *, max_tokens: int = 600) -> None:
        self._client = client
        self._max_tokens = max_tokens

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
        """Judge one round of retrieval.

        Args:
            query: The user's query.
            analysis: The deterministic analysis of the query.
            plan: The plan that ran.
            steps: Step reports (of this round, or of every round: others are ignored).
            items: The ranked items; the first 20 are shown, text cut to 300 characters.
            round_no: The round being judged, from 1.
            deadline: ``time.monotonic()`` instant the LLM's answer must come by.

        Returns:
            The evaluation, with only assessments of the plan's own steps.

        Raises:
            LLMError: When the call fails or the reply does not match the schema, even after a
                repair; the caller falls back to the deterministic evaluator.
        """
        reports = {s.step_id: s for s in steps if s.round == round_no} or {s.step_id: s for s in steps}
        lines = [f"Query: {json.dumps(query, ensure_ascii=False)}", f"Analysis: {analysis_json(analysis)}",
                 f"Round {round_no}. Plan steps (id, index, params -> found):"]  # fmt: skip
        for step in plan.steps:
            report = reports.get(step.step_id)
            found = "not run" if report is None else f"{report.count} found"
            if report is not None and report.error:
                found += f", error: {report.error[:200]}"
            lines.append(f"- {step.step_id} {step.index} {compact(normalise(step.params))} -> {found}")
        shown = items[:MAX_ITEMS]
        lines.append(f"Top {len(shown)} of {len(items)} items (id, kind, date, speaker, via steps: text):")
        lines.extend(item_line(item) for item in shown)
        reply = self._client.complete_json(
            system=EVALUATOR_SYSTEM, prompt="\n".join(lines), max_tokens=self._max_tokens, purpose="evaluate",
            deadline=deadline, schema=_EvaluationReply,
        )
        parsed: _EvaluationReply = reply.value
        known = {s.step_id for s in plan.steps}
        return Evaluation(
            sufficient=parsed.sufficient,
            confidence=clamp(parsed.confidence),
            diagnosis=parsed.diagnosis,
            step_assessments=[
                {"step_id": a.step_id, "useful": a.useful, "quality": clamp(a.quality), "issue": a.issue}
                for a in parsed.step_assessments
                if a.step_id in known
            ],
            suggested_changes=[s for s in parsed.suggested_changes if s.strip()],
            source="llm",
            usage=reply.usage,
        )
