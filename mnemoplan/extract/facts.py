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
from types import MappingProxyType

from mnemoplan.extract.names import entity_key, extract_names
from mnemoplan.extract.times import TimeMention, find_times

MAX_FACTS = 5
_MAX_CHARS, _MAX_SENTENCES, _MAX_SENTENCE_CHARS = 4000, 20, 400  # huge inputs: only their opening is read
_MAX_OBJECT_WORDS = 12
_CONFIDENT, _HEDGED, _WE, _GUESSED_SUBJECT = 0.9, 0.6, 0.6, 0.7


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


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _table(text: str) -> MappingProxyType[str, tuple[str, ...]]:
    """``"go goes went gone|..."`` -> {"go": ("goes", "went", "gone"), ...}."""
    return MappingProxyType({row.split()[0]: tuple(row.split()[1:]) for row in text.split("|")})


# The verbs read, as base forms; third person, past and participle of irregular ones are spelled out.
_IRREGULAR = _table(
    """have has had had|go goes went gone|buy buys bought bought|begin begins began begun|get gets got gotten|
    take takes took taken|make makes made made|draw draws drew drawn|write writes wrote written|
    read reads read read|see sees saw seen|meet meets met met|run runs ran run|quit quits quit quit|
    lose loses lost lost|win wins won won|find finds found found|build builds built built|
    teach teaches taught taught|grow grows grew grown|sell sells sold sold|come comes came come|
    speak speaks spoke spoken|drive drives drove driven|ride rides rode ridden|eat eats ate eaten|
    prefer prefers preferred preferred|travel travels traveled traveled|plan plans planned planned|
    pay pays paid paid|spend spends spent spent"""
)
_REGULAR = """like love enjoy hate adore dislike own live work study play volunteer move visit adopt start
    join paint finish try attend earn marry celebrate receive collect raise practice open launch rescue host
    organize graduate plant bake cook create knit listen watch perform record publish learn sign""".split()
_SPELLINGS = MappingProxyType({"travel": "travelled", "learn": "learnt", "practice": "practised"})
_PREFERENCE = _words("like love enjoy hate prefer adore dislike")
# Prepositions that belong to the verb ("lives in", "moved to", "works as"), not to its object.
_PARTICLES = _table(
    """live in with near on at|work at as for in on with|go to on for back|move to from into in back out away|
    come from|volunteer at with for|graduate from|travel to around|listen to|sign up|study at|teach at|
    take up|learn about|run into|try out"""
)
_NEEDS_PARTICLE = _words("live come listen graduate sign")  # "we live far apart" says nothing
_SECOND_PARTICLES = _words("to from of for in at with")  # "moved back to", "signed up for"


def _conjugate(base: str) -> tuple[str, ...]:
    """Third person, past and past participle of a verb."""
    if base in _IRREGULAR:
        return _IRREGULAR[base]
    if re.search(r"[^aeiou]y$", base):
        return base[:-1] + "ies", base[:-1] + "ied", base[:-1] + "ied"
    past = base + "d" if base.endswith("e") else base + "ed"
    return (base + "es" if re.search(r"(?:s|sh|ch|x|z|o)$", base) else base + "s"), past, past


_VERBS = (*_IRREGULAR, *_REGULAR)
_PRESENT = MappingProxyType({f: b for b in _VERBS for f in (b, _conjugate(b)[0])})
_PAST = MappingProxyType({f: b for b in _VERBS for f in (_conjugate(b)[1], _SPELLINGS.get(b)) if f})
_PARTICIPLE = MappingProxyType({f: b for b in _VERBS for f in (_conjugate(b)[2], _SPELLINGS.get(b)) if f})
_BE = MappingProxyType({"am": "is", "is": "is", "are": "is", "was": "was", "were": "was"})
_HAVE = MappingProxyType({"have": "has", "has": "has", "had": "had"})
_DO = MappingProxyType({"do": "does", "does": "does", "did": "did"})
_PLURAL = MappingProxyType({"is": "are", "was": "were", "has": "have", "does": "do"})
_MODALS = _words("will would can cannot could should might may must shall want wanna gonna need hope wish")
_ADVERBS = _words(
    """really just also actually recently finally always usually often still totally absolutely definitely
    truly sometimes already even now currently literally kinda mostly both originally officially seriously
    honestly basically certainly personally once first then lately newly only ever generally probably maybe
    perhaps"""
)
# "I am ..." is kept for a noun phrase ("a nurse"), a state with a preposition, or a lasting status.
_STANDALONE_STATES = _words(
    """married single divorced engaged pregnant retired vegan vegetarian widowed unemployed"""
)
_STATES = tuple(
    sorted(
        (tuple(p.split()) for p in """from|into|in|married to|engaged to|allergic to|afraid of|scared of|
        terrified of|interested in|passionate about|fond of|obsessed with|addicted to|good at|great at|bad at|
        a fan of|a big fan of|a huge fan of|born in|born on|based in|involved in|part of|a member of|
        in charge of|responsible for|allergic""".split("|")),
        key=lambda p: -len(p),
    )
) + tuple((s,) for s in _STANDALONE_STATES)
_NOT_PROGRESSIVE = _words(  # "-ing" words after "is" that are adjectives or say nothing lasting
    """doing going getting feeling trying thinking hoping wondering kidding saying talking telling having
    being looking coming giving amazing interesting boring exciting annoying relaxing inspiring exhausting
    thrilling charming stunning loving caring willing outgoing fascinating rewarding challenging surprising
    touching welcoming refreshing encouraging frustrating disappointing overwhelming satisfying
    heartwarming calming uplifting entertaining engaging missing lacking something nothing anything
    everything during"""
)
_IRREGULAR_PARTICIPLES = _words(
    """known been done gone seen taken given written eaten driven forgotten gotten chosen shown grown
    thrown fallen broken spoken stolen begun said told felt heard thought kept left brought caught taught
    sent spent lost found met made put set let become come"""
)
_COMMON_VERBS = _words(  # "equipment to improve my skills": "to" + a verb ends the object
    """be do get help keep improve connect support give show stay relax share spread explore express
    inspire remember feel bring hang chill unwind catch check achieve sit stop change reach push focus put
    set let think say tell ask talk know understand become deal handle manage balance prepare continue"""
)
_DETERMINERS = _words("a an the my our some two three four five six seven eight nine ten eleven twelve")
_LEADING_WORDS = _DETERMINERS | _SECOND_PARTICLES | {"on", "about", "into"}
_PRONOUN_STARTS = _words(
    """it its that this those these they them their theirs he him his she her hers there here what how why
    who which whom whose so too very such me myself us ourselves themselves himself herself itself i if
    when whether something anything nothing everything each other one"""
)
_PRONOUN_ENDS = _words("it them this that these those him her one")
# Objects naming someone or something we cannot resolve: "giving it a try", "helping her find a place".
_UNRESOLVED = re.compile(
    r"\b(?:you|your|yours|yourself|I|he|she|they|we|it|its|them|him|her|his|their|this|these|those)\b(?!-)",
    re.I,
)
_VAGUE_OBJECTS = frozenset(
    """one|stuff|things|much|more|lots|all|some|fun|time|a lot|a blast|a chance|no idea|an idea|a question|
    a feeling|a while|a bit|a little|a fan|hard|well|out|up|off|down|through|over|back|away|on|late|early|
    together|alone|fine|ok|okay|great|good|better|best|worse|in|at|for|with|to|about|around|into|a few|
    a couple|many|it|them|this|that|sure|the chance|the time|people""".replace("\n    ", "").split("|")
)
_VAGUE_START = re.compile(r"(?:a (?:great|good|hard|tough|rough|fun|nice|lovely) time|a blast|fun)\b")
_ADJECTIVE_ENDS = _words(  # "had an amazing": an object cut short before "and emotional wedding"
    """amazing great good awesome beautiful wonderful new old big small little nice cool emotional
    incredible fantastic special huge tough hard busy crazy lovely exciting interesting happy sad proud
    gorgeous cute sweet perfect best fun important"""
)
_FILLER = re.compile(  # trailing words that add nothing to an object
    r"(?:\s+(?:"
    r"too|also|again|anymore|lately|recently|now|already|though|either|yet|haha+|lol|ever|"
    r"more|later|earlier|soon|someday|sometime|so much|a lot|as well|right now|these days|"
    r"very much|for sure|at all|so far|for now|of course|rather|instead|just|itself|"
    r"themselves|together|and stuff|or something|and all|and everything|myself|ourselves|here|"
    r"there|today|tonight|at|on|in|for|with|to|the|a|an|of|from|named|called|and|or|"
    r"like|by|about|really|so|very|how|what|where|why"
    r"))+$",
    re.I,
)
_NOT_SUBJECTS = _words(  # capitalised words that open sentences without being names
    """i a an the and but or so if then than that this these those there here hey hi hello yes yeah yep no
    nope ok okay oh wow aw aww awesome thanks thank great good nice cool sure well hmm haha lol omg wait
    what when where who why how which do does did is are was were be been my your his her our their its me
    you he she we they it us them congrats congratulations sorry please love glad happy sounds also just
    really totally absolutely definitely maybe everything nothing something someone everyone anyone people
    life family art music work school kids friends home time today tomorrow yesterday tonight one both all
    each every some any most many much more other another such same anyway honestly actually luckily sadly
    finally recently plus btw let thankfully hopefully bet guess look check imagine remember hope wish
    seems looks"""
)
_DAYS = r"(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)"
_TIME_WORDS = r"(?:morning|afternoon|evening|night|week|weekend|month|year|summer|winter|spring|fall|autumn)"
_PREFIX = re.compile(  # openers before the subject: "Yeah, so I think that I ..."
    r"^(?:(?:i think|i guess|i believe|i suppose|i feel like|i know|i mean|i bet|i heard|maybe|probably|"
    r"perhaps|honestly|actually|well|so|and|but|also|plus|anyway|btw|oh|yeah|yes|yep|wow|haha+|lol|ok|okay|"
    r"hmm+|oh well|to be honest|as for me|for me|personally|luckily|fortunately|unfortunately|sadly|finally|"
    rf"recently|lately|now|today|yesterday|(?:last|this|next|on) (?:{_TIME_WORDS}|{_DAYS})|{_DAYS}|just|then|"
    r"besides)\b(?:\s+that\b)?[\s,!.:;-]*)+",
    re.I,
)
_HEDGE = re.compile(
    r"\b(?:i think|i guess|i believe|i suppose|i feel like|i assume|maybe|probably|perhaps|possibly|might|"
    r"not sure|kinda|sorta|apparently|i heard|seems? like)\b",
    re.I,
)
_SMALL_TALK = re.compile(
    r"^(?:hi|hey|hello|bye|goodbye|thanks|thank you|thx|congrats|congratulations|good (?:morning|night|luck)|"
    r"goodnight|see (?:you|ya)|talk (?:soon|to you|later)|take care|cheers|sounds (?:good|great)|"
    r"have (?:a|fun)|nice to|good to|great to|glad to|welcome)\b",
    re.I,
)
# Clause boundaries; a subject may open the clause after the first group only ("because I moved ...").
_CLAUSE_BREAK = re.compile(
    r"(\s*(?:[,;:](?!\S)|[()\u2013\u2014]|\s-+|-+\s)\s*(?:(?:and|but|so|because)\s+)?"
    r"|\s+(?:and|but|because|cause|so|though|although|plus)\s+)"
    r"|\s+(?:or|if|when|whenever|while|since|until|unless|that|which|who|where|whereas|than)\s+",
    re.I,
)
_INFINITIVE = re.compile(r"\s+to\s+(?:[a-z]+ly\s+)?([a-z]+)")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\s*\n+\s*")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_CONTRACTIONS = tuple((re.compile(p), r) for p, r in (
    (r"\b([Ii])'m\b", r"\1 am"), (r"\b([Ii]|[Ww]e|[Yy]ou|[Tt]hey)'ve\b", r"\1 have"),
    (r"\b([Ww]e|[Yy]ou|[Tt]hey)'re\b", r"\1 are"), (r"\b([Ii]|[Ww]e)'d\b", r"\1 would"),
    (r"\b([Ii]|[Ww]e)'ll\b", r"\1 will"), (r"\b([Cc])an't\b", r"\1annot"), (r"\b([Ww])on't\b", r"\1ill not"),
    (r"\b(\w+)n't\b", r"\1 not"), (r"\b([A-Z][a-z]+)'s (been|got)\b", r"\1 has \2"),
    (r"\b([A-Z][a-z]+)'s (?=(?:a|an|the|my|not|so|really|very|always|also|just|from|in|such)\b)", r"\1 is "),
))  # fmt: skip
_MONEY = re.compile(
    r"[$€£]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|million|billion|thousand)\b)?"
    r"|\b\d[\d,]*(?:\.\d+)?\s?(?:dollars|bucks|euros|pounds|usd|eur|gbp)\b|\b\d+(?:\.\d+)?\s?%",
    re.I,
)
_COUNT = re.compile(  # a number, then one or two words: "3 kids", "two little dogs"
    r"\b(\d[\d,]*(?:\.\d+)?|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
    r"\s+([a-z-]+)(?:\s+([a-z-]+))?",
    re.I,
)
_NOT_NOUNS = _words("us is was has does its this his hers yours ours theirs as less plus yes of the and or")
_IRREGULAR_PLURALS = _words("children people men women feet teeth mice geese sheep fish km kg lbs")


def _is_plural_noun(word: str) -> bool:
    word = word.lower()
    if word in _NOT_NOUNS:
        return False
    return word in _IRREGULAR_PLURALS or (len(word) > 2 and word.endswith("s") and not word.endswith("ss"))


def find_quantities(text: str) -> tuple[str, ...]:
    """Money, percentages and counted things ("3 kids", "two dogs", "10 years") in ``text``, in order.

    A count needs a plural noun after its number (one adjective may sit between), so "2 of them" and
    "one day" are not quantities; each quantity is listed once.
    """
    money = list(_MONEY.finditer(text))
    found = [(m.start(), m.group(0).strip()) for m in money]
    for m in _COUNT.finditer(text):
        if any(a.start() < m.end() and m.start() < a.end() for a in money):
            continue
        number, first, second = m.groups()
        if second and _is_plural_noun(second) and not (_is_plural_noun(first) or first.lower() in _NOT_NOUNS):
            found.append((m.start(), f"{number} {first} {second}"))
        elif _is_plural_noun(first):
            found.append((m.start(), f"{number} {first}"))
    return tuple(dict.fromkeys(q for _, q in sorted(found)))


def _bare(word: str) -> str:
    return word.strip(".,!?;:\"'()[]…*~“”‘’").lower()


def _is_verb(word: str) -> bool:
    return any(word in table for table in (_BE, _HAVE, _DO, _PRESENT, _PAST, _ADVERBS))


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
            words[0] = _PLURAL.get(words[0]) or _PRESENT.get(words[0], words[0])
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
            if w.endswith("s") and (nxt in _PRESENT or _is_verb(nxt) and nxt not in _ADVERBS):
                continue  # "my dance moves get me going": "moves" is a noun
            if i > 1 and (_is_verb(w) or w in ("never", "used")):
                owned = " ".join(x.strip(".,!?;:") if x[:1].isupper() else _bare(x) for x in words[1:i])
                plural = _is_plural_noun(_bare(words[i - 1])) or " and " in f" {owned} "
                return _Subject(f"{speaker}'s {owned}", plural, _CONFIDENT, i)
            shaped = re.fullmatch(r"[a-z][a-z'-]*|[A-Z][a-z'-]+", words[i].strip(".,!;:"))
            if w in _PRONOUN_STARTS or not shaped:
                return None
        return None
    name_words: list[str] = []
    for word in words[:5]:
        if word == "and" and name_words and name_words[-1] != "and":  # "Pepper and Panda are ..."
            name_words.append(word)
        elif re.fullmatch(r"[A-Z](?:[a-zA-Z-]|'(?=[A-Z]))+", word) and not (
            _bare(word) in _NOT_SUBJECTS or _is_verb(_bare(word))
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
    while i < len(words) and (_bare(words[i]) in _ADVERBS or _bare(words[i]) in ("not", "never")):
        negated, never = negated or _bare(words[i]) == "not", never or _bare(words[i]) == "never"
        i += 1
    return i, negated, never


def _particles(words: list[str], i: int, base: str) -> tuple[tuple[str, ...], int]:
    allowed, taken = _PARTICLES.get(base, ()), []
    while i < len(words) and len(taken) < 2 and _bare(words[i]) in (_SECOND_PARTICLES if taken else allowed):
        taken.append(_bare(words[i]))
        i += 1
    return tuple(taken), i


def _parse_be(words: list[str], i: int, aux: tuple[str, ...], neg: bool, never: bool) -> _Predicate | None:
    i, neg, never = _skip_adverbs(words, i, neg, never)
    if i >= len(words):
        return None
    past = aux[0] in ("was", "had")
    lowered = tuple(_bare(w) for w in words[i : i + 4])
    for state in _STATES:
        if lowered[: len(state)] == state:
            return _Predicate((*aux, *state), True, "be", past, neg, never, i + len(state))
    w = lowered[0]
    if aux[-1] == "been" and w == "to":  # "I've been to Paris"
        return _Predicate((*aux, "to"), True, "be", past, neg, never, i + 1)
    if w.endswith("ing") and len(w) > 4 and w not in _NOT_PROGRESSIVE:
        return _Predicate((*aux, w), True, "be", past, neg, never, i + 1)
    capitalised = re.fullmatch(r"[A-Z][\w'-]*", words[i].strip("\"'“‘")) and w != "i"
    noun_phrase = w in _DETERMINERS or w[:1].isdigit() or capitalised
    if noun_phrase and not re.match(r"a (?:bit|little|lot)\b", " ".join(lowered)):  # "a bit tired"
        return _Predicate(aux, True, "be", past, neg, never, i)
    return None


def _parse_have(words: list[str], i: int, aux: str, neg: bool, never: bool) -> _Predicate | None:
    j, neg, never = _skip_adverbs(words, i, neg, never)
    nxt, past = (_bare(words[j]) if j < len(words) else ""), aux == "had"
    if nxt == "been":
        return _parse_be(words, j + 1, (aux, "been"), neg, never)
    if nxt in _PARTICIPLE:
        particles, end = _particles(words, j + 1, _PARTICIPLE[nxt])
        return _Predicate((aux, nxt, *particles), True, _PARTICIPLE[nxt], past, neg, never, end)
    if nxt == "got":
        return _Predicate((aux,), False, "have", past, neg, never, j + 1)
    if not nxt or nxt == "to" or nxt.endswith("ed") or nxt in _IRREGULAR_PARTICIPLES:  # "have to go"
        return None
    if nxt == "no" or neg:  # "I have no kids", "I don't have kids": "does not have"
        aux_do = "did" if past else "does"
        return _Predicate((aux_do, "have"), True, "have", past, True, never, j + (nxt == "no"))
    return _Predicate((aux,), False, "have", past, neg, never, j)


def _parse_predicate(words: list[str], i: int) -> _Predicate | None:
    i, neg, never = _skip_adverbs(words, i)
    w = _bare(words[i]) if i < len(words) else ""
    if not w or w in _MODALS:
        return None
    if w in _BE:
        return _parse_be(words, i + 1, (_BE[w],), neg, never)
    if w in _HAVE:
        return _parse_have(words, i + 1, _HAVE[w], neg, never)
    if w == "used" and i + 2 < len(words) and _bare(words[i + 1]) == "to" and _bare(words[i + 2]) in _PRESENT:
        base = _PRESENT[_bare(words[i + 2])]
        particles, end = _particles(words, i + 3, base)
        return _Predicate(("used", "to", base, *particles), False, base, True, neg, never, end)
    if w in _DO:
        j, neg, never = _skip_adverbs(words, i + 1, neg, never)
        base, past = (_bare(words[j]) if j < len(words) else ""), _DO[w] == "did"
        if _PRESENT.get(base) != base:
            return None
        particles, end = _particles(words, j + 1, base)
        if not neg:  # emphatic "I do love it" is just "loves"
            verb = _conjugate(base)[1 if past else 0]
            return _Predicate((verb, *particles), False, base, past, False, never, end, base in _PREFERENCE)
        return _Predicate((_DO[w], base, *particles), True, base, past, True, never, end, base in _PREFERENCE)
    past = w in _PAST and (w not in _PRESENT or _PRESENT[w] == _PAST[w])  # "quit", "read": take the past
    base = _PAST[w] if past else _PRESENT.get(w)
    if base is None or (base == "find" and not past):  # "I find music helps" is an opinion
        return None
    particles, end = _particles(words, i + 1, base)
    if not particles and base in _NEEDS_PARTICLE:
        return None
    verb = _conjugate(base)[1 if past else 0]
    return _Predicate((verb, *particles), False, base, past, neg, never, end, base in _PREFERENCE)


def _clean_object(raw: str, speaker: str, mentions: list[TimeMention], pred: _Predicate) -> str:
    """The object phrase without times, filler or first person; "" when it is vague or unresolved."""
    for t in mentions:
        raw = re.sub(re.escape(t.text), " ", raw, flags=re.I)
    for m in _INFINITIVE.finditer(raw):
        if m.start() > 0 and (_PRESENT.get(m.group(1)) == m.group(1) or m.group(1) in _COMMON_VERBS):
            raw = raw[: m.start()]
            break
    words: list[str] = []
    for word in raw.split():
        w = _bare(word)
        if words or w not in _ADVERBS:
            owner = f"{speaker}'s" if w in ("my", "our", "mine") else ""
            words.append(owner or (speaker if w in ("me", "us") and words else word))
    obj, previous = " ".join(words), None
    while obj != previous:
        previous, obj = obj, re.sub(r"[^\w%$€£)'\"]+$", "", _FILLER.sub("", f" {obj}").strip())
    parts = obj.split()
    first, last = (_bare(parts[0]), _bare(parts[-1])) if parts else ("", "")
    # "got pushed back", "got done": a passive, not something obtained ("got married" is kept).
    passive = pred.base == "get" and (first.endswith("ed") or first in _IRREGULAR_PARTICIPLES)
    rejected = (
        not obj
        or len(parts) > _MAX_OBJECT_WORDS
        or obj.lower() in _VAGUE_OBJECTS
        or _VAGUE_START.match(obj.lower())
        or first in _PRONOUN_STARTS
        or last in _PRONOUN_ENDS
        or (last in _ADJECTIVE_ENDS and len(parts) <= 3)
        or _UNRESOLVED.search(obj)
        or (first == "to" and not pred.preference)
        or (passive and first != "married")
    )
    return "" if rejected else obj


def _object_key(obj: str, names: list[tuple[str, str]]) -> str:
    for key, surface in names:
        if surface in obj:
            return key
    words = obj.split()
    while words and words[0].lower() in _LEADING_WORDS:
        words = words[1:]
    if 1 <= len(words) <= 3 and all(re.fullmatch(r"[A-Za-z][A-Za-z-]*", w) for w in words):
        return entity_key(" ".join(words))
    return ""


def _sentences(text: str) -> list[str]:
    text = _CONTROL.sub(" ", text).replace("’", "'").replace("‘", "'")
    return [s.strip()[:_MAX_SENTENCE_CHARS] for s in _SENTENCE_END.split(text) if s.strip()][:_MAX_SENTENCES]


def _clauses(sentence: str) -> list[tuple[str, int, bool]]:
    """(clause, its start in the sentence, whether a subject may open it)."""
    out, start, may_open = [], 0, True
    for m in _CLAUSE_BREAK.finditer(sentence):
        after = sentence[m.end() :].split(None, 1)
        if m.group(0).strip().lower() == "and" and after:
            nxt, before = _bare(after[0]), sentence[start : m.start()]
            if re.fullmatch(r"\s*(?:[A-Z][\w-]*\s*){1,2}", before) and after[0][:1].isupper():
                continue  # "Pepper and Panda are ...": one subject
            if re.search(r"\b(?:a|an|the|so|very)\s+\w+$", before, re.I) and after[0].islower() and not (
                _is_verb(nxt) or nxt in _PRONOUN_STARTS or nxt in _DETERMINERS or nxt.endswith(("ed", "ing"))
            ):
                continue  # "a tasty and easy recipe": "and" joins adjectives, not clauses
        out.append((sentence[start : m.start()], start, may_open))
        start, may_open = m.end(), m.group(1) is not None
    return [*out, (sentence[start:], start, may_open)]


def _read_clause(
    words: list[str], speaker: str, known: frozenset[str], message: str, first: bool
) -> tuple[_Subject, _Predicate] | None:
    subject = _parse_subject(words, speaker, known, message, first)
    if subject is None and first and _bare(words[0]) in _PAST and words[0][:1].isupper():
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
        small_talk = _SMALL_TALK.match(bare) and len(bare.split()) <= 6
        if raw.rstrip(" )\"'*~").endswith("?") or not bare or small_talk:
            continue
        sentence = raw
        for pattern, replacement in _CONTRACTIONS:
            sentence = pattern.sub(replacement, sentence)
        # Openers are blanked before clauses are cut, so "I think that I ..." keeps its subject;
        # blanked, not removed, so that time positions still line up.
        opener = _PREFIX.match(sentence)
        cut = opener.end() if opener else 0
        found = []
        for index, (clause, offset, may_open) in enumerate(_clauses(" " * cut + sentence[cut:])):
            words = _PREFIX.sub("", clause).split()
            read = words[1:] and may_open and _read_clause(words, speaker, known, message, index == 0)
            if read:
                found.append((offset, offset + len(clause), *read, words[read[1].end :]))
        if not found:
            continue
        mentions = [t for t in find_times(sentence, said_at) if t.relation != "before"]
        quantities = find_quantities(sentence)
        hedged = bool(_HEDGE.search(sentence))
        for start, end, subject, pred, rest in found:
            # A time belongs to its own clause, or to the sentence's only fact.
            own = [t for t in mentions if start <= t.position < end] or (mentions if len(found) == 1 else [])
            obj = _clean_object(" ".join(rest), speaker, own, pred)
            if not obj and pred.words[-1] in _STANDALONE_STATES:  # "I'm married (now)"
                obj = pred.words[-1]
                pred = _Predicate(pred.words[:-1], True, "be", pred.past, pred.negated, pred.never, pred.end)
            if not obj:
                continue
            names = extract_names(message, known) if names is None else names
            confidence = subject.confidence
            if hedged:
                confidence = min(confidence, _HEDGED) - (0.1 if confidence < _CONFIDENT else 0.0)
            body = f"{subject.display} {pred.surface(subject.plural)} {obj}"
            fact = FactCandidate(
                subject=subject.display,
                predicate=pred.canonical(),
                object=obj,
                negated=pred.negated or pred.never,
                text=body[:1].upper() + body[1:] + (_time_phrase(own) if own else "") + ".",
                confidence=round(confidence, 2),
                subject_key=entity_key(subject.display),
                object_key=_object_key(obj, names),
                when=(min(t.start for t in own), max(t.end for t in own)) if own else None,
                quantities=quantities,
            )
            facts.setdefault((fact.subject_key, fact.predicate, obj.lower(), fact.negated), fact)
        if len(facts) >= MAX_FACTS:
            break
    return list(facts.values())[:MAX_FACTS]
