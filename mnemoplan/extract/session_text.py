"""A session's words, read for its summary: cleaned, tokenised, stemmed and weighted.

Each turn is a document: a word weighs most when the session keeps coming back to it in some
turns but not in all of them.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from mnemoplan.extract.times import find_times

DEFAULT_STOPWORDS: frozenset[str] = frozenset(
    # Function words; then chat fillers, intensifiers, time words (times get their own bonus),
    # light verbs and the praise and platitudes that fill conversations but state no fact.
    """
    a about above after again against all almost along already also although always am among an and
    another any anyone anything anyway are around as at away back be because been before being below
    between both but by can cannot could did do does doing done down during each either else enough even
    ever every everyone everything few for from further had has have having he her here hers herself him
    himself his how however i if in into is it its itself just least less like likely ll made make makes
    making many may me might mine more most much must my myself near need needs neither never next no
    nor not now of off often on once one ones only onto or other others our ours ourselves out over own
    per perhaps quite rather re said same say says see seen she should since so some someone something
    sometimes somewhere still such than that the their theirs them themselves then there these they
    thing things this those though through thus to too toward under until up upon us ve very via was we
    well were what whatever when where whether which while who whom whose why will with within without
    would yet you your yours yourself yourselves don didn doesn isn wasn won couldn wouldn shouldn aren
    weren haven hasn ain im ive id youre thats whats lets
    hey hi hello bye goodbye yeah yes yep yup nope ok okay oh ooh ah aw aww wow whoa haha hahaha lol omg
    hmm um uh gonna wanna gotta kinda sorta ya thanks thank thx please sorry congrats congratulations
    cheers really pretty super totally definitely absolutely actually literally basically honestly
    seriously truly especially probably maybe sure lot lots bit stuff kind sort way ways type bunch couple
    finally together forever always usually enjoy enjoyed fave favorite favourite
    time times day days today tomorrow yesterday tonight week weeks weekend month months year years
    morning evening night ago last recently soon later lately monday tuesday wednesday thursday friday
    saturday sunday january february march april june july august september october november december
    mon tue tues wed thu thur thurs fri sat sun jan feb mar apr jun jul aug sep sept oct nov dec
    get gets getting got gotten go goes going gone went come comes coming came take takes taking took
    give gives giving gave keep keeps kept let know knew known think thought feel feels feeling felt want
    wants wanted try tries trying tried look looks looking looked tell told talk talking talked mean
    means meant guess seem seems seemed sound sounds sounded find found use used put help care
    good great awesome amazing cool nice happy glad love loved loving lovely fun wonderful beautiful
    sweet fantastic incredible excited exciting interesting hope hoping hoped wish new old big little
    long right left first whole real special best part place difference small huge tiny hard easy tough
    busy free blast chance life joy joys journey moment moments memory memories passion passionate dream
    dreams goal goals happiness world people experience experiences proud inspiring inspired inspiration
    grateful thankful important positive encouragement encouraging motivated motivation reminder
    """.split()
)

# Words are letter/digit runs joined by inner apostrophes or hyphens; anything else
# (punctuation, emoji) is a one-character token that breaks a phrase.
_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*(?:-[^\W_]+)*|[^\s\w]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_DETERMINERS = frozenset(
    "a an the my your his her our their its this that these those some any every each another several "
    "more few many no which what whose other all both".split()
)
_TIME_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)  # only whether a time is mentioned matters
MAX_TURN_CHARS = 5000  # bounds the cost of one huge paste; its tail rarely is what a session is about


@dataclass
class Token:
    """A word or a punctuation mark of a sentence, as the summary counts it."""

    raw: str
    stem: str  # "" for punctuation and emoji
    shown: str  # as a topic shows it: lowercase unless an acronym or capitalised mid-sentence
    content: bool
    head: bool = False  # follows a determiner, perhaps with one word between ("my new *pose*")


@dataclass
class Sentence:
    """A sentence of a turn, read once, and its score as a key point."""

    turn: int
    position: int
    speaker: str
    text: str
    tokens: tuple[Token, ...]
    stems: tuple[str, ...]  # distinct content stems, in order of appearance
    score: float = 0.0


def clean(text: str) -> str:
    """A turn's text or speaker, bounded, on one line, without control characters."""
    # Whitespace controls separate words; other control and format characters (NUL, bell,
    # zero-width joiners, bidi marks, terminal colour codes) are noise inside them.
    text = text[:MAX_TURN_CHARS]
    if not text.isprintable():  # the per-character pass is only for the rare text that needs it
        kept = (c for c in _ANSI.sub("", text) if c.isspace() or unicodedata.category(c)[0] != "C")
        text = "".join(" " if c.isspace() else c for c in kept)
    return re.sub(r"\s+", " ", text).strip()


def stem_of(word: str) -> str:
    """The key a word is counted under ("painting" and "paints" are one)."""
    # Crude suffix folding, enough to count "paint", "paints", "painted" and "painting" as
    # one word; stems are only keys, what is shown is always a word as written.
    w = word.lower().replace("’", "'").split("'", 1)[0]
    if len(w) > 4 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) > 4 and w.endswith(("sses", "shes", "ches", "xes")):
        w = w[:-2]
    elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    for suffix in ("ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            w = w[: -len(suffix)]
            if len(w) >= 4 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]  # swimming -> swim
            break
    return w[:-1] if len(w) >= 4 and w.endswith("e") else w  # create, creating -> creat


def tokenize(sentence: str, stopwords: frozenset[str]) -> tuple[Token, ...]:
    """A sentence's words and punctuation, each with its stem and whether it is a content word."""
    tokens: list[Token] = []
    for i, m in enumerate(_TOKEN.finditer(sentence)):
        word = m.group(0)
        if not word[0].isalnum():
            tokens.append(Token(word, "", "", False))
            continue
        lower = word.lower().replace("’", "'")
        stem = stem_of(word)
        content = len(stem) >= 3 and not stem.isdigit() and not stopwords & {lower, lower.split("'")[0], stem}
        keep_case = (word.isupper() and len(word) > 1) or (word[0].isupper() and i > 0)
        tokens.append(Token(word, stem, word if keep_case else lower, content))
    # Without a tagger, "a/my/the (+ one word) + word" is the cheapest evidence that a word
    # is a noun (or an adjective, which the stopwords and adjective endings mostly catch),
    # and topics read best as nouns.
    for i, t in enumerate(tokens):
        if not t.content:
            continue
        before = [x.raw.lower() for x in tokens[max(0, i - 2) : i]]
        if before and (before[-1] in _DETERMINERS or before[-1].isdigit()):
            t.head = True
        elif len(before) == 2 and before[0] in _DETERMINERS and tokens[i - 1].stem:
            t.head = True
    return tuple(tokens)


def mentions_time(text: str) -> bool:
    """Whether ``text`` mentions a time ("last Tuesday", "in May")."""
    return bool(find_times(text, _TIME_REFERENCE))


def weights_of(sentences: list[Sentence]) -> tuple[dict[str, float], dict[str, int]]:
    """Each content stem's weight, and the number of turns it appears in."""
    tf: Counter[str] = Counter()
    docs: dict[str, set[int]] = {}
    for s in sentences:
        for t in s.tokens:
            if t.content:
                tf[t.stem] += 1
                docs.setdefault(t.stem, set()).add(s.turn)
    n_docs = len({s.turn for s in sentences}) or 1
    df = {w: len(turns) for w, turns in docs.items()}
    # (1 + log tf) rewards what the session keeps coming back to; log((N+1)/df) discounts
    # words that appear in nearly every turn.
    return {w: (1.0 + math.log(c)) * math.log((n_docs + 1) / df[w]) for w, c in tf.items()}, df


def is_alias(key: str, participant_keys: list[str]) -> bool:
    """Whether an entity key is a participant, or a short form of their name."""
    # "Mel" for Melanie: a short form of a participant's name is the participant.
    return any(p == key or (len(key) >= 2 and p.startswith(key)) for p in participant_keys)
