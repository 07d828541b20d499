"""Extractive episode summaries: one short overview per conversation session, without an LLM.

A session becomes a header (date, participants, message count), a few topics and a few key
sentences. Sentences are scored by corpus-internal TF-IDF (each turn is a document, so words
that recur in some turns but not in all of them weigh most), with bonuses for names and time
expressions, and picked greedily with redundancy control. The same turns always give the same
summary, byte for byte: nothing depends on set or hash order.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from mnemoplan.extract.names import entity_key, extract_names
from mnemoplan.extract.sentences import split_sentences
from mnemoplan.extract.session_points import is_candidate, score, select
from mnemoplan.extract.session_text import (
    DEFAULT_STOPWORDS,
    MAX_TURN_CHARS,
    Sentence,
    Token,
    clean,
    is_alias,
    mentions_time,
    tokenize,
    weights_of,
)
from mnemoplan.extract.session_topics import entities_of, topics_of

__all__ = ["DEFAULT_STOPWORDS", "EpisodeSummary", "SessionTurn", "SentenceCache", "summarize_session"]

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")  # fmt: skip
_IMAGE = re.compile(r"^\[image:", re.I)
_MAX_PARTICIPANTS_SHOWN = 4


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


_SENTENCE_CACHE = 16_384


class SentenceCache:
    """What summaries read of each sentence: its tokens, and the names and times it mentions.

    A session is summarised again every few messages, from all of its turns: reading each
    sentence once, not at every summary, keeps a long session's summaries from growing with it
    (reading them again was most of a summary's time). Tokens are never changed once made. The
    cache holds what people said: its owner empties it when a forget deletes records
    (``forget``), so no copy of what was deleted stays.

    Args:
        size: Sentences kept in each of its two caches.
    """

    def __init__(self, size: int = _SENTENCE_CACHE) -> None:
        self.tokenize = functools.lru_cache(maxsize=size)(tokenize)
        self.mentions = functools.lru_cache(maxsize=size)(_mentions)

    def forget(self, user_id: str) -> None:
        """Drop every sentence read so far, after a forget of ``user_id``'s records (the cache
        does not know who said what, so everyone's go)."""
        self.tokenize.cache_clear()
        self.mentions.cache_clear()


def _mentions(text: str) -> tuple[tuple[str, ...], bool]:
    """The keys of the names a sentence mentions, and whether it mentions a time."""
    return tuple(k for k, _ in extract_names(text)), mentions_time(text)


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


def _sentences(turns: list[SessionTurn], stopwords: frozenset[str], cache: SentenceCache) -> list[Sentence]:
    out: list[Sentence] = []
    for index, turn in enumerate(turns):
        speaker, text = clean(turn.speaker or ""), clean(turn.text or "")
        for position, sentence in enumerate(split_sentences(text) if text else []):
            # An image caption describes what was shared; it is not something anyone said.
            if not sentence or _IMAGE.match(sentence):
                continue
            tokens = cache.tokenize(sentence, stopwords)
            stems = tuple(dict.fromkeys(t.stem for t in tokens if t.content))
            out.append(Sentence(index, position, speaker, sentence, tokens, stems))
    return out


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
        name = clean(turn.speaker or "")
        speakers.setdefault(entity_key(name), name)
    participants = [name for key, name in speakers.items() if key]  # in order of first appearance
    keys = [entity_key(p) for p in participants]
    # Participants, and short forms of their names ("Mel" for Melanie), are who the session
    # is with, not what it is about: they are neither content words nor topics.
    said = " ".join((t.text or "")[:MAX_TURN_CHARS] for t in turns)
    lowercase = set(re.findall(r"\b[a-z]+\b", said))
    aliases = {w.lower() for w in re.findall(r"\b[A-Z][a-z]+\b", said) if w.lower() not in lowercase}
    stop = stop | {w for p in participants for w in p.lower().split()}
    stop |= {a for a in aliases if is_alias(a, keys)}

    cache = sentences if sentences is not None else SentenceCache()
    sentences_read = _sentences(turns, stop, cache)
    weights, df = weights_of(sentences_read)
    topics = topics_of(sentences_read, weights, df)
    entities = entities_of(sentences_read, participants, stop)

    text = _header(len(turns), participants, start, end, position)
    shown_topics = list(topics)
    while shown_topics and len(text) + len(f" Topics: {', '.join(shown_topics)}.") > max_chars:
        shown_topics.pop()
    if shown_topics:
        text += f" Topics: {', '.join(shown_topics)}."

    candidates = [s for s in sentences_read if is_candidate(s, strict=True)]
    if not candidates:  # a session of only chit-chat: better a weak point than none
        candidates = [s for s in sentences_read if is_candidate(s, strict=False)]
    for s in candidates:
        s.score = score(s, weights, keys, cache.mentions(s.text))
    per_turn = 1 if len(turns) >= max_sentences else 2
    budget = max_chars - len(text) - len(" Key points: ")
    chosen = select(candidates, max_sentences=max(max_sentences, 0), per_turn=per_turn, budget=budget)
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
