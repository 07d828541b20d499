"""The LLM as extractor: facts and procedures read from a stretch of conversation.

Used in the background when an LLM is configured; the deterministic rules still run on
every message. The client checks each reply against ``_Reply`` (one repair); one still
unusable is an ``LLMError``: the caller keeps the messages pending and retries later.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from typing import Any

from pydantic import BaseModel, Field, model_validator

from mnemoplan.model import Record
from mnemoplan.inference.llm import LLMClient, LLMUsage
from mnemoplan.inference.llm_json import JSON_ONLY

EXTRACTOR_SYSTEM = (
    "You extract durable memories from a conversation: facts about people, their preferences, plans, "
    "relationships and events, and procedures (how someone does something). Resolve 'I', 'my', 'we' to the "
    "speaker's name and relative times ('yesterday', 'last week') to dates using each message's date. Skip "
    "small talk, questions and anything not stated. A fact that says what one of a person's attributes now is "
    "(where they live or work, their job, partner, pet, car, phone, bank, diet, a favourite, ...) also names "
    "it: attribute (snake_case, e.g. home_city, employer, job_title, partner, pet, car, diet, favourite_food), "
    "value ('' when it ended with no new one: 'I sold my car'), ended, and adds (true for one more beside "
    "others: 'a second cat'); not for a visit, a plan, a wish or someone else's. "
    + JSON_ONLY + ' Schema: {"facts": [{"kind": "fact" | '
    '"procedure", "content": "<one standalone sentence>", "subject": "<name>", "predicate": "<verb phrase>", '
    '"object": "<what>", "negated": false, "entities": ["<name>"], "confidence": <0-1>, '
    '"event_date": "<YYYY-MM-DD or null>", "sources": [<message numbers>], "attribute": "<name or null>", '
    '"value": "<value>", "ended": false, "adds": false}]}'
)


class _Fact(BaseModel):
    kind: str = "fact"
    content: str
    subject: str = ""
    predicate: str = ""
    object: str = ""
    negated: bool = False
    entities: list[str] = Field(default_factory=list)
    confidence: float = 0.8
    event_date: str | None = None
    sources: list[int] = Field(default_factory=list)
    attribute: str | None = None
    value: str | None = ""
    ended: bool = False
    adds: bool = False


class _Reply(BaseModel):
    # Required: a fragment of a cut-off reply (one fact object) must not pass for "no facts".
    facts: list[_Fact]

    @model_validator(mode="before")
    @classmethod
    def _bare_list(cls, data: Any) -> Any:
        return {"facts": data} if isinstance(data, list) else data  # the list without its envelope


@dataclass(frozen=True)
class ExtractedFact:
    """One memory the LLM read, with the messages it came from."""

    kind: str
    text: str
    subject: str
    predicate: str
    object: str
    negated: bool
    entities: tuple[str, ...]
    confidence: float
    event_date: datetime | None
    sources: tuple[str, ...]
    attribute: str = ""  # an attribute of the subject with one current value (or several that add up)
    value: str = ""
    ended: bool = False
    adds: bool = False


@dataclass
class Extraction:
    """What one extraction call produced."""

    facts: list[ExtractedFact] = field(default_factory=list)
    usage: LLMUsage = field(default_factory=LLMUsage)


class LLMFactExtractor:
    """Reads facts and procedures out of messages with the LLM.

    Args:
        client: The shared LLM client.
        max_tokens: Cap on the reply's length.
    """

    def __init__(self, client: LLMClient, *, max_tokens: int = 1500) -> None:
        self._client = client
        self._max_tokens = max_tokens

    def extract(self, messages: list[Record]) -> Extraction:
        """Facts of a stretch of conversation (one session, in order).

        Raises:
            LLMError: the call failed, or the reply did not match the schema even after a repair.
        """
        if not messages:
            return Extraction()
        lines = [
            f"{n}. [{m.occurred_at.date().isoformat()}] {m.speaker or 'user'}: {' '.join(m.text.split())[:1200]}"
            for n, m in enumerate(messages, 1)
        ]
        reply = self._client.complete_json(
            system=EXTRACTOR_SYSTEM, prompt="Conversation:\n" + "\n".join(lines), max_tokens=self._max_tokens,
            purpose="extract", schema=_Reply,
        )  # fmt: skip
        parsed: _Reply = reply.value
        facts = []
        for fact in parsed.facts:
            kind = fact.kind if fact.kind in ("fact", "procedure") else "fact"
            sources = tuple(messages[i - 1].id for i in fact.sources if 1 <= i <= len(messages))
            if not fact.content.strip():
                continue
            facts.append(ExtractedFact(
                kind=kind, text=fact.content.strip(), subject=fact.subject, predicate=fact.predicate,
                object=fact.object, negated=fact.negated, entities=tuple(fact.entities),
                confidence=min(1.0, max(0.0, fact.confidence)), event_date=_date(fact.event_date),
                sources=sources or tuple(m.id for m in messages),
                attribute=(fact.attribute or "").strip(), value=(fact.value or "").strip(), ended=fact.ended,
                adds=fact.adds,
            ))  # fmt: skip
        return Extraction(facts, reply.usage)


def _date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value[:10]).replace(tzinfo=UTC)
    except ValueError:
        return None


__all__ = ["EXTRACTOR_SYSTEM", "ExtractedFact", "Extraction", "LLMFactExtractor"]
