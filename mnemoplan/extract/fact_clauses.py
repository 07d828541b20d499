"""How a message's sentences are read for facts: sentences, clauses, a subject and a predicate.

A clause is read only when it opens with a subject that can be named: first person (resolved to
the speaker), "my X" (the speaker's X) or a capitalised name. Pronouns are never guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mnemoplan.extract.lexicon import (
    ADVERBS,
    BE,
    CLAUSE_BREAK,
    CONTROL,
    DETERMINERS,
    DO,
    HAVE,
    IRREGULAR_PARTICIPLES,
    MODALS,
    NEEDS_PARTICLE,
    NOT_PROGRESSIVE,
    NOT_SENTENCE_ENDS,
    NOT_SUBJECTS,
    PARTICIPLE,
    PARTICLES,
    PAST,
    PLURAL,
    PREFERENCE,
    PRESENT,
    PRONOUN_STARTS,
    SECOND_PARTICLES,
    SENTENCE_END,
    STATES,
    TITLES,
    conjugate,
)
from mnemoplan.extract.names import KnownKeys, entity_key, is_name_word
from mnemoplan.extract.quantities import is_plural_noun

_MAX_SENTENCES, _MAX_SENTENCE_CHARS = 20, 400  # huge inputs: only their opening is read
# A fact's confidence: said for sure; hedged or said of "we"; its subject guessed.
CONFIDENT, HEDGED, _WE, GUESSED_SUBJECT = 0.9, 0.6, 0.6, 0.7


def bare_word(word: str) -> str:
    """A word without the punctuation around it, lowercased."""
    return word.strip(".,!?;:\"'()[]…*~“”‘’").lower()


def is_verb(word: str) -> bool:
    """Whether a bare word is a verb or an adverb the predicate tables know."""
    return any(word in table for table in (BE, HAVE, DO, PRESENT, PAST, ADVERBS))


@dataclass(frozen=True)
class Subject:
    """Who a clause is about, as the fact will name them, and where the predicate starts."""

    display: str
    plural: bool
    confidence: float
    end: int  # index of the first word after the subject


@dataclass(frozen=True)
class Predicate:
    """What a clause says of its subject, in the third person singular, with its negation."""

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
    words: list[str], speaker: str, known: KnownKeys, message: str, start: bool
) -> Subject | None:
    first = bare_word(words[0])
    if first in ("i", "we"):
        return Subject(speaker, False, _WE if first == "we" else CONFIDENT, 1)
    if first in ("my", "our"):  # "my sister is ...": up to three words, then a verb
        for i in range(1, min(len(words), 5)):
            w = bare_word(words[i])
            nxt = bare_word(words[i + 1]) if i + 1 < len(words) else ""
            auxiliary = w in BE or w in HAVE or w in DO  # "my friend has moved": "has" is no noun
            if w.endswith("s") and not auxiliary and (nxt in PRESENT or is_verb(nxt) and nxt not in ADVERBS):
                continue  # "my dance moves get me going": "moves" is a noun
            if i > 1 and (is_verb(w) or w in ("never", "used")):
                owned = " ".join(x.strip(".,!?;:") if x[:1].isupper() else bare_word(x) for x in words[1:i])
                plural = is_plural_noun(bare_word(words[i - 1])) or " and " in f" {owned} "
                return Subject(f"{speaker}'s {owned}", plural, CONFIDENT, i)
            shaped = re.fullmatch(r"[a-z][a-z'-]*|[A-Z][a-z'-]+", words[i].strip(".,!;:"))
            if w in PRONOUN_STARTS or not shaped:
                return None
        return None
    name_words: list[str] = []
    for word in words[:5]:
        if word == "and" and name_words and name_words[-1] != "and":  # "Pepper and Panda are ..."
            name_words.append(word)
        elif re.fullmatch(r"[A-Z](?:[a-zA-Z-]|'(?=[A-Z]))+", word) and not (
            bare_word(word) in NOT_SUBJECTS or is_verb(bare_word(word))
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
        return Subject(name, plural, CONFIDENT, len(name_words))
    # A capitalised first word may be any noun ("Nature has ..."): trust it as a name when the message
    # uses it as one elsewhere, or when the sentence introduces it ("Max is my dog").
    introduced = re.fullmatch(r"(?:is|was) (?:my|our)", " ".join(bare_word(w) for w in words[1:3]))
    if introduced or re.search(rf"[a-z,;:]\s+{re.escape(name)}\b", message):
        return Subject(name, plural, GUESSED_SUBJECT, len(name_words))
    return None


def _skip_adverbs(
    words: list[str], i: int, negated: bool = False, never: bool = False
) -> tuple[int, bool, bool]:
    """Index of the first word after adverbs at ``i``, and whether "not" or "never" was among them."""
    while i < len(words) and (bare_word(words[i]) in ADVERBS or bare_word(words[i]) in ("not", "never")):
        negated, never = negated or bare_word(words[i]) == "not", never or bare_word(words[i]) == "never"
        i += 1
    return i, negated, never


def _particles(words: list[str], i: int, base: str) -> tuple[tuple[str, ...], int]:
    allowed, taken = PARTICLES.get(base, ()), []
    while i < len(words) and len(taken) < 2 and bare_word(words[i]) in (
        SECOND_PARTICLES if taken else allowed
    ):
        taken.append(bare_word(words[i]))
        i += 1
    return tuple(taken), i


def _parse_be(words: list[str], i: int, aux: tuple[str, ...], neg: bool, never: bool) -> Predicate | None:
    i, neg, never = _skip_adverbs(words, i, neg, never)
    if i >= len(words):
        return None
    past = aux[0] in ("was", "had")
    lowered = tuple(bare_word(w) for w in words[i : i + 4])
    if lowered[0] in ("named", "called") and i + 1 < len(words) and is_name_word(words[i + 1]):
        return Predicate((*aux, "named"), True, "be", past, neg, never, i + 1)  # "my cat is called Miso"
    for state in STATES:
        if lowered[: len(state)] == state:
            return Predicate((*aux, *state), True, "be", past, neg, never, i + len(state))
    w = lowered[0]
    if aux[-1] == "been" and w == "to":  # "I've been to Paris"
        return Predicate((*aux, "to"), True, "be", past, neg, never, i + 1)
    if w.endswith("ing") and len(w) > 4 and w not in NOT_PROGRESSIVE:
        return Predicate((*aux, w), True, "be", past, neg, never, i + 1)
    capitalised = re.fullmatch(r"[A-Z][\w'-]*", words[i].strip("\"'“‘")) and w != "i"
    noun_phrase = w in DETERMINERS or w[:1].isdigit() or capitalised
    if noun_phrase and not re.match(r"a (?:bit|little|lot)\b", " ".join(lowered)):  # "a bit tired"
        return Predicate(aux, True, "be", past, neg, never, i)
    return None


def _parse_have(words: list[str], i: int, aux: str, neg: bool, never: bool) -> Predicate | None:
    j, neg, never = _skip_adverbs(words, i, neg, never)
    nxt, past = (bare_word(words[j]) if j < len(words) else ""), aux == "had"
    if nxt == "been":
        return _parse_be(words, j + 1, (aux, "been"), neg, never)
    if nxt in PARTICIPLE:
        particles, end = _particles(words, j + 1, PARTICIPLE[nxt])
        return Predicate((aux, nxt, *particles), True, PARTICIPLE[nxt], past, neg, never, end)
    if nxt == "got":
        return Predicate((aux,), False, "have", past, neg, never, j + 1)
    if not nxt or nxt == "to" or nxt.endswith("ed") or nxt in IRREGULAR_PARTICIPLES:  # "have to go"
        return None
    if nxt == "no" or neg:  # "I have no kids", "I don't have kids": "does not have"
        aux_do = "did" if past else "does"
        return Predicate((aux_do, "have"), True, "have", past, True, never, j + (nxt == "no"))
    return Predicate((aux,), False, "have", past, neg, never, j)


def _parse_predicate(words: list[str], i: int) -> Predicate | None:
    i, neg, never = _skip_adverbs(words, i)
    w = bare_word(words[i]) if i < len(words) else ""
    if not w or w in MODALS:
        return None
    if w in BE:
        return _parse_be(words, i + 1, (BE[w],), neg, never)
    if w in HAVE:
        return _parse_have(words, i + 1, HAVE[w], neg, never)
    used_to = i + 2 < len(words) and bare_word(words[i + 1]) == "to" and bare_word(words[i + 2]) in PRESENT
    if w == "used" and used_to:
        base = PRESENT[bare_word(words[i + 2])]
        particles, end = _particles(words, i + 3, base)
        return Predicate(("used", "to", base, *particles), False, base, True, neg, never, end)
    if w in DO:
        j, neg, never = _skip_adverbs(words, i + 1, neg, never)
        base, past = (bare_word(words[j]) if j < len(words) else ""), DO[w] == "did"
        if PRESENT.get(base) != base:
            return None
        particles, end = _particles(words, j + 1, base)
        if not neg:  # emphatic "I do love it" is just "loves"
            verb = conjugate(base)[1 if past else 0]
            return Predicate((verb, *particles), False, base, past, False, never, end, base in PREFERENCE)
        return Predicate((DO[w], base, *particles), True, base, past, True, never, end, base in PREFERENCE)
    past = w in PAST and (w not in PRESENT or PRESENT[w] == PAST[w])  # "quit", "read": take the past
    base = PAST[w] if past else PRESENT.get(w)
    if base is None or (base == "find" and not past):  # "I find music helps" is an opinion
        return None
    particles, end = _particles(words, i + 1, base)
    if not particles and base in NEEDS_PARTICLE:
        return None
    verb = conjugate(base)[1 if past else 0]
    return Predicate((verb, *particles), False, base, past, neg, never, end, base in PREFERENCE)


def sentences_of(text: str) -> list[str]:
    """The opening sentences of a message, not cut after "St." or "Dr." (a title, not an end)."""
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


def clauses_of(sentence: str) -> list[tuple[str, int, bool]]:
    """(clause, its start in the sentence, whether a subject may open it)."""
    out, start, may_open = [], 0, True
    for m in CLAUSE_BREAK.finditer(sentence):
        after = sentence[m.end() :].split(None, 1)
        if m.group(0).strip().lower() == "and" and after:
            nxt, before = bare_word(after[0]), sentence[start : m.start()]
            if re.fullmatch(r"\s*(?:[A-Z][\w-]*\s*){1,2}", before) and after[0][:1].isupper():
                continue  # "Pepper and Panda are ...": one subject
            if re.search(r"\b(?:a|an|the|so|very)\s+\w+$", before, re.I) and after[0].islower() and not (
                is_verb(nxt) or nxt in PRONOUN_STARTS or nxt in DETERMINERS or nxt.endswith(("ed", "ing"))
            ):
                continue  # "a tasty and easy recipe": "and" joins adjectives, not clauses
        out.append((sentence[start : m.start()], start, may_open))
        start, may_open = m.end(), m.group(1) is not None
    return [*out, (sentence[start:], start, may_open)]


def read_clause(
    words: list[str], speaker: str, known: KnownKeys, message: str, first: bool
) -> tuple[Subject, Predicate] | None:
    """The subject and predicate a clause opens with, or None when either cannot be read."""
    subject = _parse_subject(words, speaker, known, message, first)
    if subject is None and first and bare_word(words[0]) in PAST and words[0][:1].isupper():
        subject = Subject(speaker, False, GUESSED_SUBJECT, 0)  # "Adopted a puppy!": the "I" was dropped
    predicate = _parse_predicate(words, subject.end) if subject else None
    return (subject, predicate) if subject and predicate else None
