"""Moves of home: the place a move names, where it ended, its later legs, and the state it implies.

"I moved from Lyon to Paris in 2010 and to Rome in 2015" is a move to Paris, then to Rome, and
says where one lives now: Rome.
"""

from __future__ import annotations

import re
from dataclasses import replace
from types import MappingProxyType

from mnemoplan.extract.fact_clauses import Predicate, Subject
from mnemoplan.extract.lexicon import PLACE_ABBREVIATIONS, PLURAL, PRESENT
from mnemoplan.extract.names import is_name_word, is_person_noun
from mnemoplan.extract.times import TimeMention

# Predicates that fill the slot of another: one who moved to Bergen lives in Bergen. The fact's
# text says the state too, so that "Where do I live?" finds the move by its words, and a new
# value replaces the old one whichever way either was said (``derive.base_predicate``).
SLOTS = MappingProxyType({
    f"{has}{verb} {back}to": "lives in"
    for has in ("", "has ") for verb in ("moved", "relocated") for back in ("", "back ")
})  # fmt: skip
# A later leg of the same move, which is where one lives now: "...to Paris in 2010 and to Rome".
# It follows straight on from the place before it (and that place's time: "in 2015", "last
# year"); "...and my sister moved to Lyon and then to Rome" is another clause's.
_LEG_TIME = r"\s+(?:in|on|since|during|around|last|this)(?:\s+[\w']+){1,3}"  # "in 2015", "last year"
_LATER_LEG = re.compile(
    rf"(?:{_LEG_TIME}?)?(?:,|\s)\s*(?:and|then|later|finally)"
    r"(?:\s+(?:then|later|finally))*\s+(?:back\s+)?to\s+",
    re.I,
)
_LEG_TIME_AFTER = re.compile(_LEG_TIME, re.I)
_CLAUSE_END = re.compile(r"[,;:!?]|\.(?:\s+[a-z]|\s*$)")  # not the dot of "St. Louis"


def place_named(obj: str) -> str:
    """The name a move's object opens with, if that is all of its start: "Paris" of "Paris with
    Melanie's husband", "the Bay Area", "St. Louis"; "" for "Melanie's new team", "Dr. Smith's practice",
    "March", "the night shift"."""
    words = obj.split()
    lead = words[:1] if words[:1] == ["the"] else []
    name = []
    for i, word in enumerate(words[len(lead) :], len(lead)):
        if word in PLACE_ABBREVIATIONS and words[i + 1 : i + 2] and is_name_word(words[i + 1]):
            name.append(word)  # "St. Louis"
            continue
        if not is_name_word(word) or word[-1] in ".,;:!?":
            if word[:1].isupper() or "'" in word or "’" in word:  # "Dr.", "Smith's": not a plain name
                return ""
            break
        name.append(word)
    return " ".join(lead + name) if name else ""


_ORIGIN_THEN_PLACE = re.compile(r"(?P<origin>.+?)\s+(?:back\s+)?to\s+(?P<place>.+)")  # "Lyon to Paris"
_PLACE_THEN_ORIGIN = re.compile(r"(?P<place>.+?)\s+from\s+(?P<origin>.+)")  # "Paris from Lyon"


def move_ends(pred: Predicate, obj: str) -> tuple[Predicate, str]:
    """A move named by both its ends is a move to where it ended: "moved from Lyon to Paris (for
    a job)" is "moved to" "Paris (for a job)", so one lives in Paris, not in "Lyon to Paris";
    and "moved to Paris from Lyon" is about Paris. The end named first must be a named place
    (``place_named``) and all of its phrase, the other must open with one; else as said ("from my
    old team to Stripe" is no move of home). A rule cannot tell "from Google to Meta" from
    "from Lyon to Paris", as it cannot tell "moved to Google" from "moved to Lyon"."""
    if pred.base not in ("move", "relocate") or pred.negated or pred.never:
        return pred, obj
    if pred.words[-1] not in ("to", "from"):
        return pred, obj
    origin_first = pred.words[-1] == "from"
    ends = (_ORIGIN_THEN_PLACE if origin_first else _PLACE_THEN_ORIGIN).fullmatch(obj)
    if not ends:
        return pred, obj
    first, then = ("origin", "place") if origin_first else ("place", "origin")
    if place_named(ends.group(first)) != ends.group(first) or not place_named(ends.group(then)):
        return pred, obj
    return replace(pred, words=(*pred.words[:-1], "to")), ends.group("place")


def later_legs(after: str, offset: int, mentions: list[TimeMention]) -> list[tuple[str, list[TimeMention]]]:
    """The later legs of a move that the rest of its sentence (``after``, at ``offset`` in the
    sentence) goes on to, each a place and its own times: "...to Paris in 2010 and to Rome in
    2015" gives [("Rome", [2015])]. A leg's times are those in the phrase right after its place."""
    found: list[tuple[str, int]] = []  # each leg's place and where it starts in ``after``
    pos = 0
    while leg := _LATER_LEG.match(after, pos):
        name = place_named(_CLAUSE_END.split(after[leg.end() :])[0])
        if not name:
            break
        found.append((name, leg.end()))
        pos = leg.end() + len(name)
    legs = []
    for name, start in found:
        time = _LEG_TIME_AFTER.match(after, start + len(name))
        stop = time.end() if time else start + len(name)
        legs.append((name, [t for t in mentions if offset + start <= t.position < offset + stop]))
    return legs


def implied_state(subject: Subject, slot: str, place: str) -> str:
    """", and lives in Bergen": the state a slot predicate implies, agreeing with the subject.

    Only for the speaker, a name, or someone named by relation ("my sister"), moving to a
    named place (``place_named``): "my violin lesson moved to Thursdays" lives nowhere, nor does one
    who "moved to the night shift" or "to my new team".
    """
    owner, _, owned = subject.display.rpartition("'s ")
    if not slot or not place or (owner and not is_person_noun(owned.split()[-1])):
        return ""
    verb, *rest = slot.split()
    if subject.plural:
        verb = PLURAL.get(verb) or PRESENT.get(verb, verb)
    return f", and {' '.join((verb, *rest))} {place}"
