"""Extractive episode summaries: one short overview per conversation session, without an LLM.

A session becomes a header (date, participants, message count), a few topics and a few key
sentences. Sentences are scored by corpus-internal TF-IDF (each turn is a document, so words
that recur in some turns but not in all of them weigh most), with bonuses for names and time
expressions, and picked greedily with redundancy control. The same turns always give the same
summary, byte for byte: nothing depends on set or hash order.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from mnemoplan.extract.names import entity_key, extract_names
from mnemoplan.extract.sentences import split_sentences
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

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")  # fmt: skip
# Words are letter/digit runs joined by inner apostrophes or hyphens; anything else
# (punctuation, emoji) is a one-character token that breaks a phrase.
_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*(?:-[^\W_]+)*|[^\s\w]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_QUESTION = re.compile(r"\?\W*$")
_IMAGE = re.compile(r"^\[image:", re.I)
_INTERJECTION = re.compile(
    r"^(?:(?:yeah|yes|yep|yup|wow|whoa|oh|ooh|ah|aw+|haha+|hah|lol|well|hey|hi|ok|okay|omg|hmm+|um+|uh+"
    r"|totally|absolutely|definitely|indeed|so|anyway|anyways|also|btw|by the way"
    r"|on (?:a|another) (?:different|other|side) note|speaking of (?:which|that))\b[\s,!.…\-]*)+",
    re.I,
)
_SMALL_TALK = re.compile(
    r"^(?:hey|hi|hello|bye|goodbye|good (?:morning|night|evening|luck)|thanks|thank you|thx|congrat"
    r"|take care|talk (?:to you )?(?:soon|later)|see (?:you|ya)|catch you|have (?:a|fun)|nice (?:to|chatting)"
    r"|good to (?:see|hear)|glad (?:to|you)|so glad|happy to|sounds|that (?:sounds|must|was so)"
    r"|(?:that|it|this)(?:'s|’s| is) (?:so |really |such |just |pretty |truly )?(?:a |an )?"
    r"(?:great|awesome|amazing|cool|wonderful|fantastic|nice|sweet|lovely|beautiful|incredible|inspiring"
    r"|impressive|exciting|important|good|true|tough|hard|huge|crazy)\b"
    r"|you(?:'re|’re| are) (?:so |too |very |really )?(?:kind|sweet|welcome|right|the best)"
    r"|no problem|me too|same here|i agree|totally agree|keep (?:it )?up|you got this|you've got"
    r"|let(?:'s|’s| us) keep|i(?:'ll|’ll| will) (?:keep you|let you)|keep me (?:posted|updated)"
    r"|let me know|can(?:'t|’t|not) wait)",
    re.I,
)
# Guesses about the other speaker's experience ("that must have been so scary") react to news.
_REACTION = re.compile(r"\bmust (?:have been|be so|be really|be such)\b", re.I)
_DETERMINERS = frozenset(
    "a an the my your his her our their its this that these those some any every each another several "
    "more few many no which what whose other all both".split()
)
_FIRST_PERSON = frozenset("i i'm i've i'd i'll my me we we're we've our us".split())
_SECOND_PERSON = frozenset("you your you're you've you'd yours".split())
_ADJECTIVE_ENDINGS = ("ful", "ous", "ly", "less", "able", "ible", "ical")
_TIME_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)  # only whether a time is mentioned matters
_MAX_TURN_CHARS = 5000  # bounds the cost of one huge paste; its tail rarely is what a session is about
_MAX_SENTENCE_CHARS = 240
_MAX_PARTICIPANTS_SHOWN = 4
_MAX_ENTITIES = 8
_MAX_TOPICS = 6
_REDUNDANCY = 0.5


@dataclass(frozen=True)
class SessionTurn:
    """One message of a session: who said it, what, and when."""

    speaker: str
    text: str
    occurred_at: datetime


@dataclass(frozen=True)
class EpisodeSummary:
    """The extractive overview of one session.

    ``key_sentences`` (each prefixed by its speaker) and ``source_indexes`` (into the input
    turns) are the key points the text shows, in conversation order. ``topics`` and
    ``entities`` are complete even when the text had room for fewer topics.
    """

    text: str
    key_sentences: tuple[str, ...]
    entities: tuple[str, ...]
    topics: tuple[str, ...]
    start: datetime
    end: datetime
    source_indexes: tuple[int, ...]


@dataclass
class _Token:
    raw: str
    stem: str  # "" for punctuation and emoji
    shown: str  # as a topic shows it: lowercase unless an acronym or capitalised mid-sentence
    content: bool
    head: bool = False  # follows a determiner, perhaps with one word between ("my new *pose*")


@dataclass
class _Sentence:
    turn: int
    position: int
    speaker: str
    text: str
    tokens: tuple[_Token, ...]
    stems: tuple[str, ...]  # distinct content stems, in order of appearance
    score: float = 0.0


def _clean(text: str) -> str:
    # Whitespace controls separate words; other control and format characters (NUL, bell,
    # zero-width joiners, bidi marks, terminal colour codes) are noise inside them.
    text = text[:_MAX_TURN_CHARS]
    if not text.isprintable():  # the per-character pass is only for the rare text that needs it
        kept = (c for c in _ANSI.sub("", text) if c.isspace() or unicodedata.category(c)[0] != "C")
        text = "".join(" " if c.isspace() else c for c in kept)
    return re.sub(r"\s+", " ", text).strip()


def _stem(word: str) -> str:
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


_SENTENCE_CACHE = 16_384


class SentenceCache:
    """What summaries read of each sentence: its tokens, and the names and times it mentions.

    A session is summarised again every few messages, from all of its turns: reading each
    sentence once, not at every summary, keeps a long session's summaries from growing with it
    (at 2,000 turns, three quarters of a summary's time was these). Tokens are never changed
    once made. The cache holds what people said: its owner empties it when a forget deletes
    records (``forget``), so no copy of what was deleted stays.

    Args:
        size: Sentences kept in each of its two caches.
    """

    def __init__(self, size: int = _SENTENCE_CACHE) -> None:
        self.tokenize = functools.lru_cache(maxsize=size)(_tokenize)
        self.mentions = functools.lru_cache(maxsize=size)(_mentions)

    def forget(self, user_id: str) -> None:
        """Drop every sentence read so far, after a forget of ``user_id``'s records (the cache
        does not know who said what, so everyone's go)."""
        self.tokenize.cache_clear()
        self.mentions.cache_clear()


def _tokenize(sentence: str, stopwords: frozenset[str]) -> tuple[_Token, ...]:
    tokens: list[_Token] = []
    for i, m in enumerate(_TOKEN.finditer(sentence)):
        word = m.group(0)
        if not word[0].isalnum():
            tokens.append(_Token(word, "", "", False))
            continue
        lower = word.lower().replace("’", "'")
        stem = _stem(word)
        content = len(stem) >= 3 and not stem.isdigit() and not stopwords & {lower, lower.split("'")[0], stem}
        keep_case = (word.isupper() and len(word) > 1) or (word[0].isupper() and i > 0)
        tokens.append(_Token(word, stem, word if keep_case else lower, content))
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


def _format_span(start: datetime, end: datetime) -> str:
    def day(d: datetime) -> str:
        return f"{d.day} {_MONTHS[d.month - 1]} {d.year}"

    if start.date() == end.date():
        return day(start)
    if (start.year, start.month) == (end.year, end.month):
        return f"{start.day}-{end.day} {_MONTHS[start.month - 1]} {start.year}"
    return f"{day(start)} - {day(end)}"


def _aware(when: datetime) -> datetime:
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _header(n_turns: int, participants: list[str], start: datetime, end: datetime, position: int = 0) -> str:
    count = "1 message" if n_turns == 1 else f"{n_turns} messages"
    if position:  # a later stretch of a long session: which messages
        count = f"message {position + 1}" if n_turns == 1 else f"messages {position + 1}-{position + n_turns}"
    who = participants[:_MAX_PARTICIPANTS_SHOWN]
    if len(participants) > _MAX_PARTICIPANTS_SHOWN:  # keeps the header short in a group chat
        who = [*who[:-1], f"{who[-1]} and {len(participants) - len(who)} others"]
    inside = f"{', '.join(who)}; {count}" if who else count
    return f"Session of {_format_span(start, end)} ({inside})."


def _sentences(turns: list[SessionTurn], stopwords: frozenset[str], cache: SentenceCache) -> list[_Sentence]:
    out: list[_Sentence] = []
    for index, turn in enumerate(turns):
        speaker, text = _clean(turn.speaker or ""), _clean(turn.text or "")
        for position, sentence in enumerate(split_sentences(text) if text else []):
            # An image caption describes what was shared; it is not something anyone said.
            if not sentence or _IMAGE.match(sentence):
                continue
            tokens = cache.tokenize(sentence, stopwords)
            stems = tuple(dict.fromkeys(t.stem for t in tokens if t.content))
            out.append(_Sentence(index, position, speaker, sentence, tokens, stems))
    return out


def _weights(sentences: list[_Sentence]) -> tuple[dict[str, float], dict[str, int]]:
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


def _is_alias(key: str, participant_keys: list[str]) -> bool:
    # "Mel" for Melanie: a short form of a participant's name is the participant.
    return any(p == key or (len(key) >= 2 and p.startswith(key)) for p in participant_keys)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 1, 0)]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip(" ,;:-") + "…"


def _entry(s: _Sentence) -> str:
    text = _INTERJECTION.sub("", s.text).strip() or s.text
    text = _truncate(text[0].upper() + text[1:], _MAX_SENTENCE_CHARS)
    return f"{s.speaker}: {text}" if s.speaker else text


def _is_candidate(s: _Sentence, strict: bool) -> bool:
    if not strict or not s.stems:
        return bool(s.stems)
    if _QUESTION.search(s.text) or _SMALL_TALK.match(_INTERJECTION.sub("", s.text)):
        return False
    # Over 80 words is a paste or a run-on (split_sentences folds a long text's tail into
    # one sentence), not a point worth reading.
    n_words = sum(1 for t in s.tokens if t.stem)
    return 5 <= n_words <= 80 and len(s.stems) >= 3


def _mentions(text: str) -> tuple[tuple[str, ...], bool]:
    """The keys of the names a sentence mentions, and whether it mentions a time."""
    return tuple(k for k, _ in extract_names(text)), bool(find_times(text, _TIME_REFERENCE))


def _score(
    s: _Sentence, weights: dict[str, float], participant_keys: list[str], cache: SentenceCache
) -> float:
    base = sum(weights[w] for w in s.stems) / math.sqrt(max(len(s.stems), 3))
    words = [t.raw.lower().replace("’", "'") for t in s.tokens if t.stem]
    if len(words) > 40:  # long sentences hold many words but dilute an overview
        base *= 40 / len(words)
    found, has_time = cache.mentions(s.text)
    names = [k for k in found if not _is_alias(k, participant_keys)]
    bonus = 1.0 + 0.2 * min(len(names), 2) + (0.3 if has_time else 0.0)
    if any(w in _FIRST_PERSON for w in words):
        bonus += 0.15  # the speaker's own news is what a memory should keep
    elif any(w in _SECOND_PERSON for w in words):
        bonus -= 0.3  # remarks about the listener are mostly reactions
    if _REACTION.search(s.text):
        bonus -= 0.3
    return base * max(bonus, 0.1)


def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> float:
    return len(set(a) & set(b)) / max(min(len(a), len(b)), 1)


def _select(
    candidates: list[_Sentence], *, max_sentences: int, per_turn: int, budget: int
) -> list[tuple[_Sentence, str]]:
    ranked = sorted(candidates, key=lambda s: (-s.score, s.turn, s.position))
    chosen: list[tuple[_Sentence, str]] = []
    per_speaker: Counter[str] = Counter()
    used: Counter[int] = Counter()
    spent = 0
    # First pass: no speaker takes more than two thirds of the points, so the overview of a
    # dialogue shows both sides, though only with sentences at least half as good as the
    # best; the second pass fills what is left from anyone.
    best = ranked[0].score if ranked else 0.0
    passes = [(math.ceil(max_sentences * 2 / 3), best / 2)] if len({s.speaker for s in ranked}) > 1 else []
    for cap, floor in [*passes, (max_sentences, -math.inf)]:
        for s in ranked:
            if len(chosen) >= max_sentences or s.score < floor:
                break
            if used[s.turn] >= per_turn or per_speaker[s.speaker] >= cap:
                continue
            if any(c is s or _overlap(s.stems, c.stems) > _REDUNDANCY for c, _ in chosen):
                continue
            entry = _entry(s)
            cost = len(entry) + (3 if chosen else 0)  # " | " between entries
            if spent + cost > budget:
                continue  # a shorter, slightly weaker sentence may still fit
            chosen.append((s, entry))
            used[s.turn] += 1
            per_speaker[s.speaker] += 1
            spent += cost
    if not chosen and ranked and max_sentences > 0 and budget >= 24:
        chosen.append((ranked[0], _truncate(_entry(ranked[0]), budget)))  # cut to the room left
    chosen.sort(key=lambda pair: (pair[0].turn, pair[0].position))
    return chosen


def _surface(forms: Counter[str]) -> str:
    # "painting" reads as a topic, "painted" does not: prefer forms not ending in -ed.
    return sorted(forms.items(), key=lambda f: (f[0].endswith("ed"), -f[1], f[0]))[0][0]


def _topics(sentences: list[_Sentence], weights: dict[str, float], df: dict[str, int]) -> list[str]:
    # Candidates are runs of 1-3 adjacent content words (no stopword or punctuation between).
    counts: Counter[tuple[str, ...]] = Counter()
    shown: dict[tuple[str, ...], Counter[str]] = {}
    for s in sentences:
        run: list[_Token] = []
        for t in [*s.tokens, _Token("", "", "", False)]:
            if t.content:
                run.append(t)
                continue
            for n in (1, 2, 3):
                for i in range(len(run) - n + 1):
                    key = tuple(x.stem for x in run[i : i + n])
                    counts[key] += 1
                    shown.setdefault(key, Counter())[" ".join(x.shown for x in run[i : i + n])] += 1
            run = []
    nouns = {t.stem for s in sentences for t in s.tokens if t.head}
    # In a real conversation a topic is something it comes back to: a phrase said twice, a
    # word in two turns. A session of two or three turns gets the benefit of the doubt.
    recurring = len({s.turn for s in sentences}) >= 4
    scored: list[tuple[float, tuple[str, ...]]] = []
    for key, c in counts.items():
        if len(set(key)) < len(key) or (len(key) > 1 and c < 2):
            continue
        if len(key) == 1:
            form = _surface(shown[key])
            if not (key[0] in nouns or form[0].isupper()) or form.endswith(_ADJECTIVE_ENDINGS):
                continue
            if recurring and df.get(key[0], 0) < 2:
                continue
        mean = sum(weights.get(w, 0.0) for w in key) / len(key)
        scored.append((mean * (1 + 0.5 * (len(key) - 1)), key))
    picked: list[tuple[str, ...]] = []
    for _, key in sorted(scored, key=lambda p: (-p[0], p[1])):
        if set(key) <= {w for p in picked for w in p}:
            continue
        # A phrase replaces the words it contains ("support group" over "group").
        picked = [p for p in picked if not set(p) <= set(key)] + [key]
        if len(picked) >= _MAX_TOPICS:
            break
    return [_surface(shown[k]) for k in picked]


def _is_name(name: str, common: set[str], stopwords: frozenset[str]) -> bool:
    words = name.lower().split()
    if len(words) == 1 and words[0] in common:
        return False  # a capitalised word the session also writes in lowercase opened a sentence
    if any(w.replace("’", "'").split("'")[0] == "i" for w in words) or all(w in stopwords for w in words):
        return False  # "Whenever I", "So We": a sentence opener glued to a pronoun
    return not find_times(name, _TIME_REFERENCE)  # "Last Tuesday" is a time, not a name


def _entities(sentences: list[_Sentence], participants: list[str], stopwords: frozenset[str]) -> list[str]:
    keys = [entity_key(p) for p in participants]
    common = {t.raw for s in sentences for t in s.tokens if t.raw.islower()}
    counts: Counter[str] = Counter()
    names: dict[str, str] = {}
    for s in sentences:
        for key, name in extract_names(s.text):
            if not _is_alias(key, keys) and _is_name(name, common, stopwords):
                counts[key] += 1
                names.setdefault(key, name)
    for key in list(counts):  # "Potter" after "Harry Potter" is the same name, said shorter
        longer = [k for k in counts if k != key and f"-{key}-" in f"-{k}-"]
        if longer:
            counts[longer[0]] += counts.pop(key)
    order = {k: i for i, k in enumerate(names)}
    others = sorted(counts, key=lambda k: (-counts[k], order[k]))
    return (participants + [names[k] for k in others])[: max(_MAX_ENTITIES, len(participants))]


def summarize_session(
    turns: list[SessionTurn],
    *,
    max_sentences: int = 6,
    max_chars: int = 900,
    stopwords: frozenset[str] | None = None,
    position: int = 0,
    sentences: SentenceCache | None = None,
) -> EpisodeSummary:
    """Summarise one conversation session extractively: header, topics and key sentences.

    Greetings, small talk, questions and very short sentences are left out (unless nothing
    else is left); the rest are scored by TF-IDF over the session's turns and chosen
    greedily, skipping any sentence that shares more than half its content words with one
    already chosen, at most one per turn (two when the session has fewer turns than
    ``max_sentences``). The text stays within ``max_chars`` unless the header alone is
    longer: the header is never cut; topics and key points are dropped or shortened instead.

    Args:
        turns: the session's messages, in conversation order.
        max_sentences: the most key sentences to keep.
        max_chars: the longest the summary text may be.
        stopwords: words never counted as content, used instead of ``DEFAULT_STOPWORDS``.
        position: the place in the session of the first turn, when ``turns`` are a later
            stretch of a long session (the header then says which messages they are).
        sentences: what earlier summaries read of each sentence (by default, nothing is kept
            past this call).

    Returns:
        The summary, with the key sentences' turn indexes and the session's time span.

    Raises:
        ValueError: ``turns`` is empty.
    """
    if not turns:
        raise ValueError("summarize_session needs at least one turn; the session is empty.")
    stop = DEFAULT_STOPWORDS if stopwords is None else frozenset(stopwords)  # hashable: a cache key
    start = min((t.occurred_at for t in turns), key=_aware)
    end = max((t.occurred_at for t in turns), key=_aware)
    speakers: dict[str, str] = {}
    for turn in turns:
        name = _clean(turn.speaker or "")
        speakers.setdefault(entity_key(name), name)
    participants = [name for key, name in speakers.items() if key]  # in order of first appearance
    keys = [entity_key(p) for p in participants]
    # Participants, and short forms of their names ("Mel" for Melanie), are who the session
    # is with, not what it is about: they are neither content words nor topics.
    said = " ".join((t.text or "")[:_MAX_TURN_CHARS] for t in turns)
    lowercase = set(re.findall(r"\b[a-z]+\b", said))
    aliases = {w.lower() for w in re.findall(r"\b[A-Z][a-z]+\b", said) if w.lower() not in lowercase}
    stop = stop | {w for p in participants for w in p.lower().split()}
    stop |= {a for a in aliases if _is_alias(a, keys)}

    cache = sentences if sentences is not None else SentenceCache()
    read = _sentences(turns, stop, cache)
    weights, df = _weights(read)
    topics = _topics(read, weights, df)
    entities = _entities(read, participants, stop)

    text = _header(len(turns), participants, start, end, position)
    shown_topics = list(topics)
    while shown_topics and len(text) + len(f" Topics: {', '.join(shown_topics)}.") > max_chars:
        shown_topics.pop()
    if shown_topics:
        text += f" Topics: {', '.join(shown_topics)}."

    candidates = [s for s in read if _is_candidate(s, strict=True)]
    if not candidates:  # a session of only chit-chat: better a weak point than none
        candidates = [s for s in read if _is_candidate(s, strict=False)]
    for s in candidates:
        s.score = _score(s, weights, keys, cache)
    per_turn = 1 if len(turns) >= max_sentences else 2
    budget = max_chars - len(text) - len(" Key points: ")
    chosen = _select(candidates, max_sentences=max(max_sentences, 0), per_turn=per_turn, budget=budget)
    if chosen:
        text += " Key points: " + " | ".join(entry for _, entry in chosen)
    return EpisodeSummary(
        text=text,
        key_sentences=tuple(entry for _, entry in chosen),
        entities=tuple(entities),
        topics=tuple(t.lower() for t in topics),
        start=start,
        end=end,
        source_indexes=tuple(s.turn for s, _ in chosen),
    )
