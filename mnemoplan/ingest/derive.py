"""Derived memories: facts read from messages and episode summaries of sessions.

A derived record always names the records it came from (``derived_from``), so
forgetting a message forgets what was derived from it, and a ranking can credit the
source turns.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from mnemoplan.extract.facts import SLOTS, FactCandidate
from mnemoplan.extract.lexicon import conjugate
from mnemoplan.extract.names import entity_key, is_person_noun
from mnemoplan.extract.summary import EpisodeSummary
from mnemoplan.model import EntityMention, Record
from mnemoplan.storage.ledger import SUMMARIZER, KnownFact, is_hedged
from mnemoplan.extract.passages import split_passages

FACT_IMPORTANCE = 0.7
EPISODE_IMPORTANCE = 0.6


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


def subject_key(fact: Record) -> str:
    """The key a fact is decided and filed under, as the ledger files it: its subject as said, else
    its subject's mention (the graph's entity may be the owner: ``subject_entity``)."""
    said = entity_key(str(fact.metadata.get("subject", "")))
    return said or next((m.key for m in fact.entities if m.role == "subject"), "")


def subject_entity(subject: str, key: str) -> EntityMention | None:
    """The entity a fact is about: its subject, or for "user's starter" and "Caroline's painting"
    the owner (a thing one has is no entity of its own; "Melanie's sister" is a person, and stays)."""
    owned = re.fullmatch(r"(?P<owner>.+?)['’]s\s+(?P<thing>.+)", subject)
    thing = owned.group("thing").split() if owned else []
    if owned and not any(is_person_noun(w) or w[:1].isupper() for w in thing):  # "user's friend Eva" stays
        owner = owned.group("owner")
        return EntityMention(key=entity_key(owner), name=owner, role="subject") if entity_key(owner) else None
    return EntityMention(key=key, name=subject, role="subject") if key else None


def fact_record(message: Record, fact: FactCandidate, *, extractor: str = "rules") -> Record:
    """A fact record derived from one message."""
    subject = subject_entity(fact.subject, fact.subject_key)
    entities = [subject] if subject is not None else []
    if fact.object_key and fact.object_key not in (fact.subject_key, subject.key if subject else ""):
        entities.append(EntityMention(key=fact.object_key, name=fact.object, role="object"))
    start, end = fact.when if fact.when else (None, None)
    return Record(
        id=uuid.uuid4().hex,
        user_id=message.user_id,
        project_id=message.project_id,
        session_id=message.session_id,
        kind="fact",
        text=fact.text,
        occurred_at=message.occurred_at,
        created_at=message.created_at,
        # a hedge is another claim than the same said for sure, which replaces it (``decide``)
        content_hash=_digest(message.user_id, "fact", fact.subject_key, fact.predicate, fact.object, str(fact.negated),
                             *(["hedged"] if fact.hedged else [])),
        derived_from=[message.id],
        metadata={
            "subject": fact.subject,
            "predicate": fact.predicate,
            "object": fact.object,
            "negated": fact.negated,
            "confidence": fact.confidence,
            "quantities": list(fact.quantities),
            "extractor": extractor,
            "hedged": fact.hedged,
        },
        importance=round(FACT_IMPORTANCE * (0.5 + fact.confidence / 2), 3),
        entities=entities,
        event_start=start,
        event_end=end,
        valid_from=message.occurred_at,
    )


def episode_record(messages: list[Record], summary: EpisodeSummary, now: datetime) -> Record:
    """The episode memory of a session, or of a stretch of a long one: its extractive summary,
    derived from every message of it."""
    first = messages[0]
    key_sources = [messages[i].id for i in summary.source_indexes if 0 <= i < len(messages)]
    return Record(
        id=uuid.uuid4().hex,
        user_id=first.user_id,
        project_id=first.project_id,
        session_id=first.session_id,
        kind="episode",
        text=summary.text,
        occurred_at=summary.start,
        created_at=now,
        content_hash=_digest(first.user_id, "episode", first.session_id, summary.text),
        derived_from=[m.id for m in messages],
        metadata={
            "topics": list(summary.topics),
            "entities": list(summary.entities),
            "message_count": len(messages),
            "first_message": first.id,
            "last_message": messages[-1].id,
            "key_sources": list(dict.fromkeys(key_sources)),
            "summarizer": SUMMARIZER,
        },
        importance=EPISODE_IMPORTANCE,
        event_start=summary.start,
        event_end=summary.end,
    )


# Predicates with one value at a time: a new value replaces the old (a move, ``SLOTS``, counts
# as "lives in"). Not a bare "is": "John is a shooting guard" and "John is a total movie fan" are
# both true (LoCoMo had exactly those two replacing each other). Not "is named": "my son is
# named Tom", then "my son is named Max" are two sons.
FUNCTIONAL_PREDICATES = frozenset({"lives in", "works at", "works as", "is from", "is married to", "studies"})


@dataclass(frozen=True)
class FactDecision:
    """What to do with a new fact: store it, or reinforce an old one; maybe supersede or contradict one."""

    store: bool
    reinforce: str = ""
    supersede: tuple[str, ...] = ()
    contradicts: str = ""


def base_predicate(predicate: str) -> str:
    """``does not like`` -> ``likes``, ``moved to`` -> ``lives in``; others unchanged."""
    words = predicate.split()
    if words[:2] in (["does", "not"], ["is", "not"], ["has", "not"]):
        rest = words[2:]
        if words[0] == "does":  # "does not live in" -> "lives in", "does not study" -> "studies"
            rest = [conjugate(rest[0])[0], *rest[1:]] if rest else []
        else:
            rest = [words[0], *rest]
        predicate = " ".join(rest)
    return SLOTS.get(predicate, predicate)


def decide(fact: Record, vector: np.ndarray, known: list[KnownFact], similarity: float) -> FactDecision:
    """Compare a new fact with the user's current facts about the same subject.

    - same claim (near-identical vector, same polarity): reinforce the old fact, store nothing;
      but said for sure after a hedge ("I think I moved to Porto", then "I moved to Porto"),
      store it and supersede the hedge;
    - same subject and base predicate, opposite polarity, same object: a contradiction,
      stored and flagged, the old one kept;
    - a functional predicate (lives in, works at, ...) with a new object: supersede the old,
      unless the new one is hedged and the old one is not ("I think I moved to Porto" leaves
      where one lives as it was; a move said for sure then replaces both).
    """
    meta = fact.metadata
    subject = next((m.key for m in fact.entities if m.role == "subject"), "")
    pred = base_predicate(str(meta.get("predicate", "")))
    negated = bool(meta.get("negated"))
    hedged = is_hedged(meta)
    about = [old for old in known if old.subject_key == subject]
    replaced: list[str] = []
    for old in about:
        if float(np.dot(vector, old.vector)) >= similarity and old.negated == negated:
            if not old.hedged or hedged:
                return FactDecision(store=False, reinforce=old.id)
            replaced.append(old.id)
    contradicts = ""
    for old in about:
        same_pred = base_predicate(old.predicate) == pred
        same_object = old.object.lower() == str(meta["object"]).lower()
        if same_pred and old.negated != negated and same_object:
            contradicts = contradicts or old.id
        # A new value replaces the old one, and a value said for sure replaces a hedge, the same
        # value too; "I don't live in Paris" or "I live in Porto" after "I moved to Porto" replace nothing.
        functional = same_pred and pred in FUNCTIONAL_PREDICATES and not old.negated and not negated
        surer = old.hedged and not hedged
        if functional and (surer or (not same_object and (old.hedged or not hedged))) and old.id not in replaced:
            replaced.append(old.id)
    return FactDecision(store=True, supersede=tuple(replaced), contradicts=contradicts)


def passage_records(message: Record) -> list[Record]:
    """The passages of a long message (``extract.passages``), each a record derived from it:
    searched on its own, shown as itself, counted as its message."""
    return [
        Record(
            id=uuid.uuid4().hex, user_id=message.user_id, project_id=message.project_id,
            session_id=message.session_id, kind="passage", speaker=message.speaker, text=text,
            occurred_at=message.occurred_at, created_at=message.created_at,
            content_hash=_digest(message.user_id, "passage", message.id, str(i)), derived_from=[message.id],
            metadata={"passage": i, "message": message.id}, importance=message.importance,
            event_start=message.event_start, event_end=message.event_end,
        )  # fmt: skip
        for i, text in enumerate(split_passages(message.text))
    ]

