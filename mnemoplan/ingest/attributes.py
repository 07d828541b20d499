"""Attributes of a person that change: a newer value replaces the older one, an ending closes it.

Each message a person says of themselves ("I work at Rakuten", "now I'm at Mercari", "we sold
the car", "KPMG, not Deloitte") gives attribute facts (``extract.attributes``); an agent may
send one too (``remember``'s ``fact``). Deciding one against that person's current attribute
facts (``UserLedger``):

- the same value again: nothing new is stored;
- a new value of a single-valued attribute (employer, home city, partner, ...): stored, and
  every current value of that attribute is superseded by it;
- a value of a multi-valued attribute (hobbies, languages), or one said to add ("I also
  have a work phone"): stored beside the others;
- an ending ("I quit", "not vegan anymore"): the attribute's values are superseded by the
  ending, with no new value;
- a correction naming the old value ("not Deloitte"): the named value is superseded at once.

What is superseded is the old fact, and with it every record that stated the old value: the
person's own messages and facts and what an assistant said back, before the change, naming
the old value and not the new (``MemoryStore.supersede_mentions``). They stay, as history.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from mnemoplan.extract.attribute_patterns import CHANGE
from mnemoplan.extract.attributes import (
    ATTRIBUTES,
    FAVOURITE_OF_SOME_KIND,
    AttributeStatement,
    attribute_statements,
    mentions,
)
from mnemoplan.extract.names import entity_key
from mnemoplan.errors import InvalidInput
from mnemoplan.model import EntityMention, FactIn, Record
from mnemoplan.model.records import as_utc, check_scope
from mnemoplan.storage.ledger import KnownFact

PREDICATE = "attribute "  # the predicate of an attribute fact: "attribute employer"
# Speakers who answer a person rather than speak of themselves: their "I" is not the person.
ANSWERING_ROLES = ("assistant", "ai", "bot", "system", "agent", "model", "tool")
ATTRIBUTE_CONFIDENCE = 0.8
# Attributes a person always has: a value is replaced, never ended
LASTING = frozenset({"age", "home_city", "neighbourhood", "hair_colour", "favourite_food", "favourite_band",
                     "favourite_book"})
# Attributes whose value one is "at": "now I'm at X" names one of these
AT_ATTRIBUTES = ("employer", "university", "gym", "bank", "doctor", "internet_provider", "streaming_service",
                 "favourite_team")


def attribute_key(name: str) -> str:
    """An attribute's key as a caller or the LLM names it: "Favourite food" -> ``favourite_food``."""
    return re.sub(r"\W+", "_", name.strip().lower()).strip("_")


def label(attribute: str) -> str:
    """``favourite_band`` -> ``favourite band``."""
    return attribute.replace("_", " ")


def fact_text(subject: str, attribute: str, value: str) -> str:
    """The sentence an attribute fact says: "User works at Mercari."; an ending: "User has no car any more."."""
    spec = ATTRIBUTES.get(attribute)
    if not value:
        return f"{subject} has no {label(attribute)} any more."
    template = spec.template if spec else "{s}'s " + label(attribute) + " is {v}"
    return template.format(s=subject, v=value) + "."


def attribute_record(
    message: Record, subject: str, attribute: str, value: str, *, ending: bool = False, adds: bool = False,
    replaces: str = "", sentence: str = "", extractor: str = "attributes",
) -> Record:
    """A fact record of one attribute statement, derived from ``message``."""
    shown = subject[:1].upper() + subject[1:] if subject else "The speaker"
    key = entity_key(subject)
    digest = hashlib.sha256("\x1f".join((message.user_id, "attribute", key, attribute, value.lower(), str(ending),
                                          message.id)).encode("utf-8")).hexdigest()
    return Record(
        id=uuid.uuid4().hex, user_id=message.user_id, project_id=message.project_id, session_id=message.session_id,
        kind="fact", text=fact_text(shown, attribute, value) if attribute else f"{shown}: {value}.",
        occurred_at=message.occurred_at, created_at=message.created_at, content_hash=digest,
        derived_from=[message.id],
        metadata={"subject": subject, "predicate": PREDICATE + attribute, "object": value, "negated": ending,
                  "confidence": ATTRIBUTE_CONFIDENCE, "extractor": extractor, "attribute": attribute,
                  "value": value, "ending": ending, "adds": adds, "replaces": replaces, "hedged": False,
                  "_sentence": sentence},
        importance=0.7, entities=[EntityMention(key=key, name=subject, role="subject")] if key else [],
        valid_from=message.occurred_at,
    )


def records_of(message: Record) -> list[Record]:
    """The attribute facts a message states of its speaker, when the speaker is the person an
    agent serves (a requesting role: user, human). Between named people (a chat of Caroline
    and Melanie) who says what of whom is read less surely, and closing the messages that name
    an old value cost LoCoMo recall 1.3 points of R@10 (bench/README.md); there the sentence
    rules' six slots (lives in, works at, ...) still replace each other, and an agent can state
    a fact of anyone (``stated_record``)."""
    if not message.requests:
        return []
    # Precision first: a loose reading (a name beside a cue, or one its kind gives away, in no frame
    # of the speaker's) neither states a value nor changes one; an answer that finds a newer message
    # naming another value says the held one may have changed (``planner.slots``)
    statements = [st for st in attribute_statements(message.text) if not st.loose]
    valued = {st.attribute for st in statements if st.value and st.attribute}
    endings, values, seen = [], [], set()
    first_of: dict[str, Record] = {}
    for st in statements:
        if st.ending and not st.replaces:
            if st.attribute not in valued:  # "I left Farfetch, now at Booking.com": the new value says it
                endings.append(_record(message, st))
        elif st.value and (st.attribute not in seen or st.adds or st.replaces or _multi(st.attribute)):
            seen.add(st.attribute)  # one value of an attribute per message, unless it adds
            values.append(_record(message, st))
            first_of.setdefault(st.attribute, values[-1])
        elif st.value and st.attribute in first_of and not CHANGE.search(message.text):
            # "my work phone is a Pixel 7 and my own is an iPhone 14": said together, both hold
            first_of[st.attribute].metadata["adds"] = True
            values.append(_record(message, AttributeStatement(st.attribute, st.value, adds=True)))
        elif st.value and st.attribute in first_of:
            # "I replaced the ThinkPad with a MacBook Air": two values of one attribute; which is
            # new is known only against what the person holds (``decide``)
            first_of[st.attribute].metadata.setdefault("_alternatives", []).append(st.value)
    for rec in endings:  # what the message itself states anew is not what it ends
        rec.metadata["_new"] = [r.metadata["value"] for r in values]
    return values + endings  # a new value first: "I left Rakuten, now at Mercari" replaces; the ending then finds nothing


def _multi(attribute: str) -> bool:
    spec = ATTRIBUTES.get(attribute)
    return spec is not None and spec.multi


def _record(message: Record, st: AttributeStatement) -> Record:
    rec = attribute_record(message, message.speaker, st.attribute, st.value, ending=st.ending, adds=st.adds,
                           replaces=st.replaces, sentence=message.text)
    if st.closes:
        rec.metadata["_closes"] = st.closes
    if st.loose:
        rec.metadata["loose"] = True
    if st.mention:
        rec.metadata["_mention"] = True
    return rec


def stated_record(
    user_id: str, fact: FactIn, *, session_id: str = "", project_id: str = "", at: datetime | None = None,
) -> Record:
    """The fact record of a fact an agent states (``remember``'s ``fact``).

    Raises:
        InvalidInput: no attribute, or neither a value nor ``ended``.
    """
    attribute = attribute_key(fact.attribute)
    value = (fact.value or "").strip()
    if not attribute:
        raise InvalidInput("fact.attribute is empty.", hint="e.g. {\"attribute\": \"employer\", \"value\": \"Mercari\"}")
    if not value and not fact.ended:
        raise InvalidInput("fact needs a value, or ended: true.", hint="e.g. {\"attribute\": \"car\", \"ended\": true}")
    when = as_utc(fact.occurred_at or at or datetime.now(UTC))  # a caller's naive time is UTC
    subject = check_scope(fact.subject, what="fact.subject") or "user"
    base = Record(id=uuid.uuid4().hex, user_id=user_id, project_id=project_id, session_id=session_id,
                  text=f"{attribute}: {value}", occurred_at=when, created_at=datetime.now(UTC))
    rec = attribute_record(base, subject, attribute, "" if fact.ended else value, ending=fact.ended, extractor="agent")
    rec.derived_from = []
    rec.metadata["confidence"] = 0.9
    return rec


def state_fact(ingestor: Any, user_id: str, fact: FactIn, **where: Any) -> list[Record]:
    """Store a fact an agent states, decided like those read from messages; the records stored
    (none when it says what is already current)."""
    return list(ingestor.add_facts(user_id, [stated_record(user_id, fact, **where)], read=[]))


def is_attribute_fact(fact: Record) -> bool:
    """Whether a fact record is an attribute statement (decided by ``decide``, not ``derive.decide``)."""
    return "attribute" in fact.metadata and str(fact.metadata.get("predicate", "")).startswith(PREDICATE)


@dataclass
class Decision:
    """What to do with an attribute fact: store it or not, what it supersedes, which values end."""

    store: bool
    supersede: list[str] = field(default_factory=list)  # old fact ids
    ended: list[str] = field(default_factory=list)  # the old values, to close the records naming them


def _current(known: list[KnownFact], attribute: str = "") -> list[KnownFact]:
    return [f for f in known if f.predicate.startswith(PREDICATE) and not f.negated
            and (not attribute or f.predicate == PREDICATE + attribute)]  # fmt: skip


def _same(a: str, b: str) -> bool:
    return bool(a and b) and (mentions(a, b, loose=False) or mentions(b, a, loose=False))


def decide(fact: Record, known: list[KnownFact]) -> Decision:
    """Decide an attribute fact against its subject's current facts (see the module's doc);
    may fill in the fact's attribute (a correction's is the corrected value's) and its text."""
    meta = fact.metadata
    attribute, value = str(meta["attribute"]), str(meta.get("value", ""))
    sentence = str(meta.pop("_sentence", ""))
    new_values = [str(v) for v in meta.pop("_new", [])]
    replaces = str(meta.get("replaces", ""))
    if replaces:  # "KPMG, not Deloitte": only a value the person holds can be corrected
        named = [f for f in _current(known, attribute) if _same(f.object, replaces)]
        if not named:
            return Decision(store=False)
        attribute = attribute or named[0].predicate[len(PREDICATE):]
        _set_attribute(fact, attribute, value)
        if not value:
            return Decision(store=True, supersede=[f.id for f in named], ended=[f.object for f in named])
        if any(_same(f.object, value) for f in _current(known, attribute)):
            return Decision(store=False, supersede=[f.id for f in named], ended=[f.object for f in named])
        return Decision(store=True, supersede=[f.id for f in named], ended=[f.object for f in named])
    if _said_before(fact, _current(known, attribute)):
        return Decision(store=False)
    if meta.get("ending"):
        # what the message itself states anew is not what it ends ("vegetarian now, not vegan anymore")
        held = [f for f in _current(known, attribute) if not any(_same(f.object, v) for v in new_values)]
        named = [f for f in held if sentence and mentions(sentence, f.object)]
        if not attribute:  # an ending with no attribute named ends what it names: "I left Rakuten"
            held = named
            if not held:
                return Decision(store=False)
            attribute = held[0].predicate[len(PREDICATE):]
            _set_attribute(fact, attribute, "")
        elif named and (attribute in LASTING or _multi(attribute)):
            held = named  # "I quit climbing" ends climbing, not every hobby
        elif attribute in LASTING:
            return Decision(store=False)
        if not held:
            return Decision(store=False)
        if attribute in LASTING or (_multi(attribute) and held == named):
            # the named value ends, the attribute does not: "sushi dropped to second place" leaves a
            # favourite food, "I gave up climbing" other hobbies; no "has no hobbies any more" fact
            return Decision(store=False, supersede=[f.id for f in held], ended=[f.object for f in held])
        return Decision(store=True, supersede=[f.id for f in held], ended=[f.object for f in held])
    if attribute in ("?", FAVOURITE_OF_SOME_KIND):
        # "now I'm at Mercari": the attribute of the latest value said with "at";
        # "my favourite is now X": the kind of the latest favourite
        kinds = AT_ATTRIBUTES if attribute == "?" else tuple(k for k in ATTRIBUTES if k.startswith("favourite_"))
        latest = [f for f in _current(known) if f.predicate[len(PREDICATE):] in kinds]
        if not latest:
            return Decision(store=False)
        attribute = latest[-1].predicate[len(PREDICATE):]
        _set_attribute(fact, attribute, value)
    held = _current(known, attribute)
    alternatives = [str(v) for v in meta.pop("_alternatives", [])]
    if alternatives and any(_same(f.object, value) for f in held):
        # of the values a message names, the one the person does not hold yet is the change
        fresh = [v for v in alternatives if not any(_same(f.object, v) for f in held)]
        if fresh:
            value = fresh[0]
            _set_attribute(fact, attribute, value)
    closes = str(meta.pop("_closes", ""))  # an old value the message names, held or not
    if any(_same(f.object, value) for f in held):
        return Decision(store=False)
    if meta.get("loose") and not held:
        return Decision(store=False)  # a loose reading changes a value, it never states the first one
    spec = ATTRIBUTES.get(attribute)
    if meta.pop("_mention", False) and held:
        # "my iPhone 14 screen cracked" while a Pixel 7 is held: not said to be a change, so both
        # hold (precision first: a value is closed only on a statement of its change)
        meta["adds"] = True
        meta["possibly_changes"] = [f.object for f in held if not _same(f.object, value)][:3]
    if (spec is not None and spec.multi) or meta.get("adds"):
        held = [f for f in held if closes and _same(f.object, closes)]  # "Arabic instead of Spanish"
    ended = [f.object for f in held]
    if closes and not _same(closes, value) and not any(_same(old, closes) for old in ended):
        ended.append(closes)
    return Decision(store=True, supersede=[f.id for f in held], ended=ended)


def _said_before(fact: Record, held: list[KnownFact]) -> bool:
    """Whether a value or an ending was said before the attribute's held value: read late (an
    LLM reads a session after the rules) or dated back (an agent's fact, an import), it is
    history, and must not replace what was said after it. A value beside the others may still
    add; an unnamed attribute ("now I'm at X") is resolved later, against the latest value."""
    meta = fact.metadata
    attribute = str(meta["attribute"])
    if (not held or not attribute or attribute in ("?", FAVOURITE_OF_SOME_KIND) or meta.get("adds")
            or meta.get("replaces") or _multi(attribute)):
        return False  # an attribute still to be resolved is checked against none (not against all)
    return any(f.said_at is not None and f.said_at > fact.occurred_at for f in held)


def _set_attribute(fact: Record, attribute: str, value: str) -> None:
    meta = fact.metadata
    meta["attribute"], meta["predicate"] = attribute, PREDICATE + attribute
    if value or meta.get("ending"):
        meta["value"] = meta["object"] = value
    subject = str(meta.get("subject", "")) or "The speaker"
    fact.text = fact_text(subject[:1].upper() + subject[1:], attribute, value)


def speakers_of(subject: str) -> tuple[str, ...]:
    """Whose records state a person's values: the person's own, and an assistant's replies to them."""
    return (subject, *ANSWERING_ROLES)


def is_history_question(query: str) -> bool:
    """Whether a question asks about the past of a value ("before", "used to", "when did I move")."""
    return bool(re.search(r"\b(?:before|used to|previous\w*|formerly|originally|back then|when did|ex)\b", query, re.I))


def validity(rec: Record) -> tuple[datetime | None, datetime | None]:
    """When a fact held: from when it was said to when it was superseded (None: still holds)."""
    return rec.valid_from or rec.occurred_at, rec.valid_to
