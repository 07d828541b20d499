"""Simple facts from one chat message, by rule: who is, has, likes or did what, and when.

"I adopted a puppy named Max last week", said by Melanie on 8 May 2023, gives the fact
"Melanie adopted a puppy named Max in the week of 1 May 2023." Only clauses that open with
a subject we can name are read: first person (resolved to the speaker), "my X" (the
speaker's X) or a capitalised name. Pronouns (he, she, it, they, you) are never guessed, so
a missed fact is more likely than a wrong one: precision matters more than recall here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from mnemoplan.extract.fact_clauses import (
    CONFIDENT,
    HEDGED,
    Predicate,
    bare_word,
    clauses_of,
    read_clause,
    sentences_of,
)
from mnemoplan.extract.fact_moves import SLOTS, implied_state, later_legs, move_ends, place_named
from mnemoplan.extract.lexicon import (
    ADJECTIVE_ENDS,
    ADVERBS,
    COMMON_VERBS,
    CONTRACTIONS,
    FILLER,
    HEDGE,
    INFINITIVE,
    IRREGULAR_PARTICIPLES,
    LEADING_WORDS,
    PRESENT,
    PREFIX,
    PRONOUN_ENDS,
    PRONOUN_STARTS,
    SMALL_TALK,
    STANDALONE_STATES,
    UNRESOLVED,
    VAGUE_OBJECTS,
    VAGUE_START,
)
from mnemoplan.extract.names import KnownKeys, entity_key, extract_names
from mnemoplan.extract.quantities import find_quantities
from mnemoplan.extract.times import TimeMention, find_times

__all__ = ["HEDGED_CONFIDENCE", "MAX_FACTS", "SLOTS", "FactCandidate", "extract_facts", "find_quantities"]

MAX_FACTS = 5
_MAX_CHARS = 4000  # huge inputs: only their opening is read
_MAX_OBJECT_WORDS = 12
HEDGED_CONFIDENCE = HEDGED  # a fact's confidence when hedged (at most)


@dataclass(frozen=True)
class FactCandidate:
    """One fact read from a message; ``predicate`` is third person singular whatever the subject."""

    subject: str  # first person resolved: "Melanie", "Melanie's sister"
    predicate: str  # "likes", "moved to", "is", "does not like"
    object: str  # "hiking", "a software engineer": first person resolved, times and filler removed
    negated: bool
    text: str  # a standalone third-person sentence, relative times made absolute
    confidence: float  # 0.9; 0.6 when hedged or said of "we"; 0.7 for a guessed subject
    subject_key: str  # entity_key(subject)
    object_key: str  # the key of a name in the object, or of a short noun phrase; "" otherwise
    when: tuple[datetime, datetime] | None  # [start, end) of the time the clause mentions
    quantities: tuple[str, ...]  # money, counts and durations in the sentence
    hedged: bool = False  # "maybe", "I think": it replaces no fact said for sure


def _day(d: datetime) -> str:
    return f"{d.day} {d:%B} {d.year}"


def _time_phrase(mentions: list[TimeMention]) -> str:
    """A relative time made standalone: " on 7 May 2023", " in the week of 1 May 2023", " since 2019"."""
    if len({(t.start, t.end) for t in mentions}) > 1:
        start, end = min(t.start for t in mentions), max(t.end for t in mentions)
        return f" between {_day(start)} and {_day(end - timedelta(days=1))}"
    t = mentions[0]
    lead = "since" if t.relation == "after" else "on" if t.granularity == "day" else "in"
    season = {3: "spring", 6: "summer", 9: "fall", 12: "winter"}.get(t.start.month, "")
    return " " + lead + " " + {
        "day": _day(t.start),
        "week": f"the week of {_day(t.start)}",
        "month": f"{t.start:%B} {t.start.year}",
        "season": f"the {season} of {t.start.year}",
    }.get(t.granularity, str(t.start.year))


def _clean_object(raw: str, speaker: str, mentions: list[TimeMention], pred: Predicate) -> str:
    """The object phrase without times, filler or first person; "" when it is vague or unresolved."""
    for t in mentions:
        raw = re.sub(re.escape(t.text), " ", raw, flags=re.I)
    for m in INFINITIVE.finditer(raw):
        if m.start() > 0 and (PRESENT.get(m.group(1)) == m.group(1) or m.group(1) in COMMON_VERBS):
            raw = raw[: m.start()]
            break
    words: list[str] = []
    for word in raw.split():
        w = bare_word(word)
        if words or w not in ADVERBS:
            owner = f"{speaker}'s" if w in ("my", "our", "mine") else ""
            me = word.strip(".,!?;:") in ("me", "us") and words  # not "the US"
            words.append(owner or (speaker if me else word))
    obj, previous = " ".join(words), None
    while obj != previous:
        previous, obj = obj, re.sub(r"[^\w%$€£)'\"]+$", "", FILLER.sub("", f" {obj}").strip())
    parts = obj.split()
    first, last = (bare_word(parts[0]), bare_word(parts[-1])) if parts else ("", "")
    # "got pushed back", "got done": a passive, not something obtained ("got married" is kept).
    passive = pred.base == "get" and (first.endswith("ed") or first in IRREGULAR_PARTICIPLES)
    rejected = (
        not obj
        or len(parts) > _MAX_OBJECT_WORDS
        or obj.lower() in VAGUE_OBJECTS
        or VAGUE_START.match(obj.lower())
        or first in PRONOUN_STARTS
        or last in PRONOUN_ENDS
        or (last in ADJECTIVE_ENDS and len(parts) <= 3)
        or UNRESOLVED.search(obj)
        or (first == "to" and not pred.preference)
        or (passive and first != "married")
    )
    return "" if rejected else obj


def _object_key(obj: str, names: list[tuple[str, str]]) -> str:
    for key, surface in names:
        if surface in obj:
            return key
    words = obj.split()
    while words and words[0].lower() in LEADING_WORDS:
        words = words[1:]
    if 1 <= len(words) <= 3 and all(re.fullmatch(r"[A-Za-z][A-Za-z-]*", w) for w in words):
        return entity_key(" ".join(words))
    return ""


def extract_facts(
    text: str, speaker: str, said_at: datetime, *, known_names: Iterable[str] = ()
) -> list[FactCandidate]:
    """The simple facts one message states, at most ``MAX_FACTS``, in the order said.

    Args:
        text: the message.
        speaker: who said it; first person ("I", "my", "we") resolves to this name.
        said_at: when it was said; relative times ("last week") resolve against it.
        known_names: names (or entity keys) of known entities, trusted as subjects anywhere.

    Returns:
        Fact candidates; empty for questions, small talk, and text with no readable fact.

    Raises:
        TypeError: only for a ``said_at`` or ``known_names`` of the wrong type; no text, however odd
            (emoji, control characters, unpaired surrogates, 20,000 characters), makes it raise.
    """
    if not isinstance(text, str) or not text.strip():
        return []
    message, speaker = text[:_MAX_CHARS], (speaker or "").strip() or "The speaker"
    known = KnownKeys.of(known_names).plus(entity_key(speaker))
    facts: dict[tuple[str, str, str, bool], FactCandidate] = {}
    names: list[tuple[str, str]] | None = None  # found once, when the first fact needs them
    for raw in sentences_of(message):
        bare = re.sub(r"[\W_]+$", "", raw)
        small_talk = SMALL_TALK.match(bare) and len(bare.split()) <= 6
        if raw.rstrip(" )\"'*~").endswith("?") or not bare or small_talk:
            continue
        sentence = raw
        for pattern, replacement in CONTRACTIONS:
            sentence = pattern.sub(replacement, sentence)
        # Openers are blanked before clauses are cut, so "I think that I ..." keeps its subject;
        # blanked, not removed, so that time positions still line up.
        opener = PREFIX.match(sentence)
        cut = opener.end() if opener else 0
        found = []
        for index, (clause, offset, may_open) in enumerate(clauses_of(" " * cut + sentence[cut:])):
            words = PREFIX.sub("", clause).split()
            read = words[1:] and may_open and read_clause(words, speaker, known, message, index == 0)
            if read:
                found.append((offset, offset + len(clause), *read, words[read[1].end :]))
        if not found:
            continue
        mentions = [t for t in find_times(sentence, said_at) if t.relation != "before"]
        quantities = find_quantities(sentence)
        hedged = bool(HEDGE.search(sentence))
        for start, end, subject, pred, rest in found:
            # A time belongs to its own clause, or to the sentence's only fact.
            own = [t for t in mentions if start <= t.position < end] or (mentions if len(found) == 1 else [])
            obj = _clean_object(" ".join(rest), speaker, own, pred)
            if not obj and pred.words[-1] in STANDALONE_STATES:  # "I'm married (now)"
                obj = pred.words[-1]
                pred = Predicate(pred.words[:-1], True, "be", pred.past, pred.negated, pred.never, pred.end)
            if not obj:
                continue
            names = extract_names(message, known) if names is None else names
            confidence = subject.confidence
            if hedged:
                confidence = min(confidence, HEDGED) - (0.1 if confidence < CONFIDENT else 0.0)
            said = f"{subject.display} {pred.surface(subject.plural)} {obj}"
            pred, obj = move_ends(pred, obj)
            slot = SLOTS.get(pred.canonical(), "")
            legs = later_legs(sentence[end:], end, mentions) if slot else []
            if legs:  # times after the first leg's clause are the later legs', or another clause's
                own = [t for t in own if t.position < end]
            body = said + (_time_phrase(own) if own else "")
            state = implied_state(subject, slot, legs[-1][0] if legs else place_named(obj))
            if state and legs:  # a move in several legs ends where one lives now: the fact is that move
                body += "".join(
                    f", then to {place}" + (_time_phrase(times) if times else "") for place, times in legs
                )
                obj, own = legs[-1][0], own + [t for _, times in legs for t in times]
            text = body[:1].upper() + body[1:] + ("" if hedged else state) + "."
            fact = FactCandidate(
                subject=subject.display,
                predicate=pred.canonical(),
                object=obj,
                negated=pred.negated or pred.never,
                text=f"Perhaps {text}" if hedged else text,
                confidence=round(confidence, 2),
                subject_key=entity_key(subject.display),
                object_key=_object_key(obj, names),
                when=(min(t.start for t in own), max(t.end for t in own)) if own else None,
                quantities=quantities,
                hedged=hedged,
            )
            facts.setdefault((fact.subject_key, fact.predicate, obj.lower(), fact.negated), fact)
        if len(facts) >= MAX_FACTS:
            break
    return list(facts.values())[:MAX_FACTS]
