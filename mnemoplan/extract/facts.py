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
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import MappingProxyType

from mnemoplan.extract.lexicon import (
    ADJECTIVE_ENDS,
    ADVERBS,
    BE,
    CLAUSE_BREAK,
    COMMON_VERBS,
    CONTRACTIONS,
    CONTROL,
    DETERMINERS,
    DO,
    FILLER,
    HAVE,
    HEDGE,
    INFINITIVE,
    IRREGULAR_PARTICIPLES,
    LEADING_WORDS,
    MODALS,
    NEEDS_PARTICLE,
    NOT_PROGRESSIVE,
    NOT_SENTENCE_ENDS,
    NOT_SUBJECTS,
    PARTICIPLE,
    PARTICLES,
    PAST,
    PLACE_ABBREVIATIONS,
    PLURAL,
    PREFERENCE,
    PREFIX,
    PRESENT,
    PRONOUN_ENDS,
    PRONOUN_STARTS,
    SECOND_PARTICLES,
    SENTENCE_END,
    SMALL_TALK,
    STANDALONE_STATES,
    STATES,
    TITLES,
    UNRESOLVED,
    VAGUE_OBJECTS,
    VAGUE_START,
    conjugate,
)
from mnemoplan.extract.names import entity_key, extract_names, is_name_word, is_person_noun
from mnemoplan.extract.quantities import find_quantities, is_plural_noun
from mnemoplan.extract.times import TimeMention, find_times

MAX_FACTS = 5
_MAX_CHARS, _MAX_SENTENCES, _MAX_SENTENCE_CHARS = 4000, 20, 400  # huge inputs: only their opening is read
_MAX_OBJECT_WORDS = 12
_CONFIDENT, _HEDGED, _WE, _GUESSED_SUBJECT = 0.9, 0.6, 0.6, 0.7
HEDGED_CONFIDENCE = _HEDGED  # a fact's confidence when hedged (at most)

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
    rf"(?:{_LEG_TIME}?)?(?:,|\s)\s*(?:and|then|later|finally)(?:\s+(?:then|later|finally))*\s+(?:back\s+)?to\s+",
    re.I,
)
_LEG_TIME_AFTER = re.compile(_LEG_TIME, re.I)
_CLAUSE_END = re.compile(r"[,;:!?]|\.(?:\s+[a-z]|\s*$)")  # not the dot of "St. Louis"


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


def _bare(word: str) -> str:
    return word.strip(".,!?;:\"'()[]…*~“”‘’").lower()


def _is_verb(word: str) -> bool:
    return any(word in table for table in (BE, HAVE, DO, PRESENT, PAST, ADVERBS))


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


@dataclass(frozen=True)
class _Subject:
    display: str
    plural: bool
    confidence: float
    end: int  # index of the first word after the subject


def _place(obj: str) -> str:
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


def _move_ends(pred: _Predicate, obj: str) -> tuple[_Predicate, str]:
    """A move named by both its ends is a move to where it ended: "moved from Lyon to Paris (for
    a job)" is "moved to" "Paris (for a job)", so one lives in Paris, not in "Lyon to Paris";
    and "moved to Paris from Lyon" is about Paris. The end named first must be a named place
    (``_place``) and all of its phrase, the other must open with one; else as said ("from my
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
    if _place(ends.group(first)) != ends.group(first) or not _place(ends.group(then)):
        return pred, obj
    return replace(pred, words=(*pred.words[:-1], "to")), ends.group("place")


def _later_legs(after: str, offset: int, mentions: list[TimeMention]) -> list[tuple[str, list[TimeMention]]]:
    """The later legs of a move that the rest of its sentence (``after``, at ``offset`` in the
    sentence) goes on to, each a place and its own times: "...to Paris in 2010 and to Rome in
    2015" gives [("Rome", [2015])]. A leg's times are those in the phrase right after its place."""
    found: list[tuple[str, int]] = []  # each leg's place and where it starts in ``after``
    pos = 0
    while leg := _LATER_LEG.match(after, pos):
        name = _place(_CLAUSE_END.split(after[leg.end() :])[0])
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


def _state(subject: _Subject, slot: str, place: str) -> str:
    """", and lives in Bergen": the state a slot predicate implies, agreeing with the subject.

    Only for the speaker, a name, or someone named by relation ("my sister"), moving to a
    named place (``_place``): "my violin lesson moved to Thursdays" lives nowhere, nor does one
    who "moved to the night shift" or "to my new team".
    """
    owner, _, owned = subject.display.rpartition("'s ")
    if not slot or not place or (owner and not is_person_noun(owned.split()[-1])):
        return ""
    verb, *rest = slot.split()
    if subject.plural:
        verb = PLURAL.get(verb) or PRESENT.get(verb, verb)
    return f", and {' '.join((verb, *rest))} {place}"


@dataclass(frozen=True)
class _Predicate:
    words: tuple[str, ...]  # third person singular: ("has", "been", "to"), ("went", "to"), ("is",)
    has_aux: bool  # the first word takes the "not": "is not", "has not", "does not"
    base: str  # "I never liked it" -> "did not like"
    past: bool
    negated: bool
    never: bool
    end: int  # index of the first word of the object
    preference: bool = False  # "loves to paint": an object may start with "to"

    def canonical(self) -> str:
        if not (self.negated or self.never):
            return " ".join(self.words)
        if self.has_aux:
            return " ".join((self.words[0], "not", *self.words[1:]))
        return " ".join(("did" if self.past else "does", "not", self.base, *self.words[1:]))

    def surface(self, plural: bool) -> str:
        words = list(self.canonical().split() if self.negated and not self.never else self.words)
        if plural:
            words[0] = PLURAL.get(words[0]) or PRESENT.get(words[0], words[0])
        if self.never:
            words.insert(1 if self.has_aux else 0, "never")
        return " ".join(words)


def _parse_subject(
    words: list[str], speaker: str, known: frozenset[str], message: str, start: bool
) -> _Subject | None:
    first = _bare(words[0])
    if first in ("i", "we"):
        return _Subject(speaker, False, _WE if first == "we" else _CONFIDENT, 1)
    if first in ("my", "our"):  # "my sister is ...": up to three words, then a verb
        for i in range(1, min(len(words), 5)):
            w = _bare(words[i])
            nxt = _bare(words[i + 1]) if i + 1 < len(words) else ""
            auxiliary = w in BE or w in HAVE or w in DO  # "my friend has moved": "has" is no noun
            if w.endswith("s") and not auxiliary and (nxt in PRESENT or _is_verb(nxt) and nxt not in ADVERBS):
                continue  # "my dance moves get me going": "moves" is a noun
            if i > 1 and (_is_verb(w) or w in ("never", "used")):
                owned = " ".join(x.strip(".,!?;:") if x[:1].isupper() else _bare(x) for x in words[1:i])
                plural = is_plural_noun(_bare(words[i - 1])) or " and " in f" {owned} "
                return _Subject(f"{speaker}'s {owned}", plural, _CONFIDENT, i)
            shaped = re.fullmatch(r"[a-z][a-z'-]*|[A-Z][a-z'-]+", words[i].strip(".,!;:"))
            if w in PRONOUN_STARTS or not shaped:
                return None
        return None
    name_words: list[str] = []
    for word in words[:5]:
        if word == "and" and name_words and name_words[-1] != "and":  # "Pepper and Panda are ..."
            name_words.append(word)
        elif re.fullmatch(r"[A-Z](?:[a-zA-Z-]|'(?=[A-Z]))+", word) and not (
            _bare(word) in NOT_SUBJECTS or _is_verb(_bare(word))
        ):
            name_words.append(word)
        else:
            break
    while name_words and name_words[-1] == "and":
        name_words.pop()
    if not name_words or len(name_words) == len(words) or name_words[0].endswith("ing"):
        return None
    name, plural = " ".join(name_words), "and" in name_words
    if entity_key(name) in known or len(name_words) > 1 or not start:
        return _Subject(name, plural, _CONFIDENT, len(name_words))
    # A capitalised first word may be any noun ("Nature has ..."): trust it as a name when the message
    # uses it as one elsewhere, or when the sentence introduces it ("Max is my dog").
    introduced = re.fullmatch(r"(?:is|was) (?:my|our)", " ".join(_bare(w) for w in words[1:3]))
    if introduced or re.search(rf"[a-z,;:]\s+{re.escape(name)}\b", message):
        return _Subject(name, plural, _GUESSED_SUBJECT, len(name_words))
    return None


def _skip_adverbs(
    words: list[str], i: int, negated: bool = False, never: bool = False
) -> tuple[int, bool, bool]:
    """Index of the first word after adverbs at ``i``, and whether "not" or "never" was among them."""
    while i < len(words) and (_bare(words[i]) in ADVERBS or _bare(words[i]) in ("not", "never")):
        negated, never = negated or _bare(words[i]) == "not", never or _bare(words[i]) == "never"
        i += 1
    return i, negated, never


def _particles(words: list[str], i: int, base: str) -> tuple[tuple[str, ...], int]:
    allowed, taken = PARTICLES.get(base, ()), []
    while i < len(words) and len(taken) < 2 and _bare(words[i]) in (SECOND_PARTICLES if taken else allowed):
        taken.append(_bare(words[i]))
        i += 1
    return tuple(taken), i


def _parse_be(words: list[str], i: int, aux: tuple[str, ...], neg: bool, never: bool) -> _Predicate | None:
    i, neg, never = _skip_adverbs(words, i, neg, never)
    if i >= len(words):
        return None
    past = aux[0] in ("was", "had")
    lowered = tuple(_bare(w) for w in words[i : i + 4])
    if lowered[0] in ("named", "called") and i + 1 < len(words) and is_name_word(words[i + 1]):
        return _Predicate((*aux, "named"), True, "be", past, neg, never, i + 1)  # "my cat is called Miso"
    for state in STATES:
        if lowered[: len(state)] == state:
            return _Predicate((*aux, *state), True, "be", past, neg, never, i + len(state))
    w = lowered[0]
    if aux[-1] == "been" and w == "to":  # "I've been to Paris"
        return _Predicate((*aux, "to"), True, "be", past, neg, never, i + 1)
    if w.endswith("ing") and len(w) > 4 and w not in NOT_PROGRESSIVE:
        return _Predicate((*aux, w), True, "be", past, neg, never, i + 1)
    capitalised = re.fullmatch(r"[A-Z][\w'-]*", words[i].strip("\"'“‘")) and w != "i"
    noun_phrase = w in DETERMINERS or w[:1].isdigit() or capitalised
    if noun_phrase and not re.match(r"a (?:bit|little|lot)\b", " ".join(lowered)):  # "a bit tired"
        return _Predicate(aux, True, "be", past, neg, never, i)
    return None


def _parse_have(words: list[str], i: int, aux: str, neg: bool, never: bool) -> _Predicate | None:
    j, neg, never = _skip_adverbs(words, i, neg, never)
    nxt, past = (_bare(words[j]) if j < len(words) else ""), aux == "had"
    if nxt == "been":
        return _parse_be(words, j + 1, (aux, "been"), neg, never)
    if nxt in PARTICIPLE:
        particles, end = _particles(words, j + 1, PARTICIPLE[nxt])
        return _Predicate((aux, nxt, *particles), True, PARTICIPLE[nxt], past, neg, never, end)
    if nxt == "got":
        return _Predicate((aux,), False, "have", past, neg, never, j + 1)
    if not nxt or nxt == "to" or nxt.endswith("ed") or nxt in IRREGULAR_PARTICIPLES:  # "have to go"
        return None
    if nxt == "no" or neg:  # "I have no kids", "I don't have kids": "does not have"
        aux_do = "did" if past else "does"
        return _Predicate((aux_do, "have"), True, "have", past, True, never, j + (nxt == "no"))
    return _Predicate((aux,), False, "have", past, neg, never, j)


def _parse_predicate(words: list[str], i: int) -> _Predicate | None:
    i, neg, never = _skip_adverbs(words, i)
    w = _bare(words[i]) if i < len(words) else ""
    if not w or w in MODALS:
        return None
    if w in BE:
        return _parse_be(words, i + 1, (BE[w],), neg, never)
    if w in HAVE:
        return _parse_have(words, i + 1, HAVE[w], neg, never)
    if w == "used" and i + 2 < len(words) and _bare(words[i + 1]) == "to" and _bare(words[i + 2]) in PRESENT:
        base = PRESENT[_bare(words[i + 2])]
        particles, end = _particles(words, i + 3, base)
        return _Predicate(("used", "to", base, *particles), False, base, True, neg, never, end)
    if w in DO:
        j, neg, never = _skip_adverbs(words, i + 1, neg, never)
        base, past = (_bare(words[j]) if j < len(words) else ""), DO[w] == "did"
        if PRESENT.get(base) != base:
            return None
        particles, end = _particles(words, j + 1, base)
        if not neg:  # emphatic "I do love it" is just "loves"
            verb = conjugate(base)[1 if past else 0]
            return _Predicate((verb, *particles), False, base, past, False, never, end, base in PREFERENCE)
        return _Predicate((DO[w], base, *particles), True, base, past, True, never, end, base in PREFERENCE)
    past = w in PAST and (w not in PRESENT or PRESENT[w] == PAST[w])  # "quit", "read": take the past
    base = PAST[w] if past else PRESENT.get(w)
    if base is None or (base == "find" and not past):  # "I find music helps" is an opinion
        return None
    particles, end = _particles(words, i + 1, base)
    if not particles and base in NEEDS_PARTICLE:
        return None
    verb = conjugate(base)[1 if past else 0]
    return _Predicate((verb, *particles), False, base, past, neg, never, end, base in PREFERENCE)


def _clean_object(raw: str, speaker: str, mentions: list[TimeMention], pred: _Predicate) -> str:
    """The object phrase without times, filler or first person; "" when it is vague or unresolved."""
    for t in mentions:
        raw = re.sub(re.escape(t.text), " ", raw, flags=re.I)
    for m in INFINITIVE.finditer(raw):
        if m.start() > 0 and (PRESENT.get(m.group(1)) == m.group(1) or m.group(1) in COMMON_VERBS):
            raw = raw[: m.start()]
            break
    words: list[str] = []
    for word in raw.split():
        w = _bare(word)
        if words or w not in ADVERBS:
            owner = f"{speaker}'s" if w in ("my", "our", "mine") else ""
            words.append(owner or (speaker if word.strip(".,!?;:") in ("me", "us") and words else word))  # not "the US"
    obj, previous = " ".join(words), None
    while obj != previous:
        previous, obj = obj, re.sub(r"[^\w%$€£)'\"]+$", "", FILLER.sub("", f" {obj}").strip())
    parts = obj.split()
    first, last = (_bare(parts[0]), _bare(parts[-1])) if parts else ("", "")
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


def _sentences(text: str) -> list[str]:
    text = CONTROL.sub(" ", text).replace("’", "'").replace("‘", "'")
    out: list[str] = []
    for part in SENTENCE_END.split(text):
        if not part.strip():
            continue
        words = out[-1].split() if out else [""]
        last, before = words[-1], words[-2] if len(words) > 1 else ""
        if last in NOT_SENTENCE_ENDS or (last in TITLES and not before[:1].isupper()):  # "to St.", "Main St."
            out[-1] = f"{out[-1]} {part.strip()}"
        else:
            out.append(part.strip())
    return [s[:_MAX_SENTENCE_CHARS] for s in out][:_MAX_SENTENCES]


def _clauses(sentence: str) -> list[tuple[str, int, bool]]:
    """(clause, its start in the sentence, whether a subject may open it)."""
    out, start, may_open = [], 0, True
    for m in CLAUSE_BREAK.finditer(sentence):
        after = sentence[m.end() :].split(None, 1)
        if m.group(0).strip().lower() == "and" and after:
            nxt, before = _bare(after[0]), sentence[start : m.start()]
            if re.fullmatch(r"\s*(?:[A-Z][\w-]*\s*){1,2}", before) and after[0][:1].isupper():
                continue  # "Pepper and Panda are ...": one subject
            if re.search(r"\b(?:a|an|the|so|very)\s+\w+$", before, re.I) and after[0].islower() and not (
                _is_verb(nxt) or nxt in PRONOUN_STARTS or nxt in DETERMINERS or nxt.endswith(("ed", "ing"))
            ):
                continue  # "a tasty and easy recipe": "and" joins adjectives, not clauses
        out.append((sentence[start : m.start()], start, may_open))
        start, may_open = m.end(), m.group(1) is not None
    return [*out, (sentence[start:], start, may_open)]


def _read_clause(
    words: list[str], speaker: str, known: frozenset[str], message: str, first: bool
) -> tuple[_Subject, _Predicate] | None:
    subject = _parse_subject(words, speaker, known, message, first)
    if subject is None and first and _bare(words[0]) in PAST and words[0][:1].isupper():
        subject = _Subject(speaker, False, _GUESSED_SUBJECT, 0)  # "Adopted a puppy!": the "I" was dropped
    predicate = _parse_predicate(words, subject.end) if subject else None
    return (subject, predicate) if subject and predicate else None


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
    known = frozenset({entity_key(n) for n in known_names} | {entity_key(speaker)}) - {""}
    facts: dict[tuple[str, str, str, bool], FactCandidate] = {}
    names: list[tuple[str, str]] | None = None  # found once, when the first fact needs them
    for raw in _sentences(message):
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
        for index, (clause, offset, may_open) in enumerate(_clauses(" " * cut + sentence[cut:])):
            words = PREFIX.sub("", clause).split()
            read = words[1:] and may_open and _read_clause(words, speaker, known, message, index == 0)
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
                pred = _Predicate(pred.words[:-1], True, "be", pred.past, pred.negated, pred.never, pred.end)
            if not obj:
                continue
            names = extract_names(message, known) if names is None else names
            confidence = subject.confidence
            if hedged:
                confidence = min(confidence, _HEDGED) - (0.1 if confidence < _CONFIDENT else 0.0)
            said = f"{subject.display} {pred.surface(subject.plural)} {obj}"
            pred, obj = _move_ends(pred, obj)
            slot = SLOTS.get(pred.canonical(), "")
            legs = _later_legs(sentence[end:], end, mentions) if slot else []
            if legs:  # times after the first leg's clause are the later legs', or another clause's
                own = [t for t in own if t.position < end]
            body = said + (_time_phrase(own) if own else "")
            state = _state(subject, slot, legs[-1][0] if legs else _place(obj))
            if state and legs:  # a move in several legs ends where one lives now: the fact is that move
                body += "".join(f", then to {place}" + (_time_phrase(times) if times else "") for place, times in legs)
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
