"""The deterministic query analyzer: same query, same analysis, no LLM, cheap enough for every query.

It decides whether a message needs memory at all (small talk does not), what kind of
answer is expected, which of the user's known entities the query names (by key,
alias, case or accent), and which time window a time expression denotes.
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Protocol

from mnemoplan.extract.names import entity_key, extract_names
from mnemoplan.extract.times import find_times
from mnemoplan.model import AnswerType, EntityRef, QueryAnalysis, TimeWindow

_SMALLTALK_WORDS = frozenset(
    """
    hi hello hey hiya yo howdy greetings good morning afternoon evening night day thanks thank you thx ty
    much a lot so cheers bye goodbye see ya later soon ok okay cool great nice awesome sure yes no yep nope
    how are r u doing going it's what's up sup there all well fine lol haha hmm np welcome again
    mate buddy friend everyone folks
    """.split()
)
_WORD_RE = re.compile(r"[a-z']+")
_STOP = frozenset(
    """
    a an the and or but if of at by for with about to from in on into over after before under again
    is are was were be been being have has had do does did doing i me my we our you your he him his she
    her it its they them their what which who whom this that these those am not no nor so than too very
    can will just should now when where why how all any both each few more most other some such only own
    same s t don would could ever there here up down out off then once also did
    """.split()
)
_LIST_RE = re.compile(
    r"^\s*(list|name|enumerate)\b|\b(what|which) (are|were) (all|some of|the)\b|\ball (of )?(my|the|her|his|their)\b"
    r"|\bwho are (my|her|his|their)\b|\bwhat (kinds?|types?|sorts?) of\b",
    re.I,
)
# "What books has ...", "Which classical musicians does ...": a plural noun asked for.
_PLURAL_ASK_RE = re.compile(
    r"^\s*(what|which)\s+(?:[a-z]+\s+)?(?!(?:is|was|has|does|this|its|his|us)\b)[a-z]{2,}[^s\W]s\s+"
    r"(has|have|does|do|did|are|were|would|might|could|can|will|should)\b",
    re.I,
)
_BROAD_RE = re.compile(
    r"\b(everything|all you know|anything) (about|on|regarding)\b|\btell me (all )?about\b|\bsummar(y|ize|ise)\b"
    r"|\bwhat do (you|we) know about\b|\boverview of\b",
    re.I,
)
# "before the wedding", "after my move to Lisbon": a window relative to an event in memory.
_ANCHOR_RE = re.compile(
    r"\b(before|after|since|until|prior to)\s+((?:the|my|our|his|her|their|that)\s+[\w' -]{3,40}?)(?=[?.!,]|$|\s+(?:and|or|but|when|did|was|were)\b)",
    re.I,
)
_DATE_RE = re.compile(
    r"^\s*(when|what (date|day|time|year|month)|which (date|day|year|month)|how long ago|since when)\b", re.I
)
_NUMBER_RE = re.compile(r"^\s*how (many|much|long|old|often|far)\b", re.I)
_YESNO_RE = re.compile(
    r"^\s*(is|are|was|were|do|does|did|can|could|has|have|had|will|would|should|am)\b", re.I
)
# Generic nouns an aggregation question asks for, and the entity type they stand for.
_TYPE_NOUNS = {
    "person": "friends friend people family kids children child sons daughters siblings brothers sisters "
    "colleagues coworkers parents partners relatives neighbors neighbours",
    "place": "places cities countries towns restaurants cafes destinations locations trips",
    "pet": "pets dogs cats animals",
    "organization": "companies employers organizations organisations teams clubs schools",
}
_TYPE_OF = {noun: etype for etype, nouns in _TYPE_NOUNS.items() for noun in nouns.split()}


def _answer_type(query: str, is_list: bool) -> AnswerType:
    if _DATE_RE.search(query):
        return "date"
    if _NUMBER_RE.search(query):
        return "number"
    if is_list:
        return "list"
    if _YESNO_RE.search(query):
        return "yes_no"
    return "text"


_FOLLOW_UP_RE = re.compile(
    r"^\s*(and|but|so|also|then|what about|how about|and then|how much|how many|how long|which one|why|"
    r"when was that|where was that|it|that|this|they|he|she|those|them)\b",
    re.I,
)


_ANAPHOR_RE = re.compile(r"\b(it|that|this|those|these|they|them|he|him|she|her|there)\b", re.I)


def is_follow_up(query: str) -> bool:
    """True for a query that leans on the conversation: elliptical ("how much?", "what
    brand?"), opening on a follow-up cue ("and her sister?"), or short and pointing back
    ("when did we get her?"). A short complete question is not: "What car do I have?"."""
    words = _WORD_RE.findall(query.lower())
    content = [w for w in words if w not in _STOP and len(w) > 1]
    if not content or (len(content) <= 1 and len(words) <= 3):
        return True
    return len(content) <= 3 and bool(_FOLLOW_UP_RE.search(query) or _ANAPHOR_RE.search(query))


def is_smalltalk(query: str) -> bool:
    """True for greetings, thanks and pleasantries that carry nothing to look up."""
    words = _WORD_RE.findall(query.lower())
    return bool(words) and len(words) <= 8 and all(w.strip("'") in _SMALLTALK_WORDS for w in words)


class KnownEntity(Protocol):
    """What the analyzer reads of an entity a user's memory knows."""

    @property
    def name(self) -> str:
        """The most frequent way the entity is written."""
        ...

    @property
    def type(self) -> str:
        """The most frequent type given to the entity."""
        ...

    @property
    def aliases(self) -> list[str]:
        """Every way the entity has been written."""
        ...

    @property
    def spoke(self) -> int:
        """Messages the entity said (a participant of the conversation when above 0)."""
        ...


class Catalog(Protocol):
    """The entities of one user's memory (``storage.catalog.EntityCatalog``)."""

    @property
    def entities(self) -> Mapping[str, KnownEntity]:
        """Known entities by key."""
        ...

    @property
    def version(self) -> int:
        """Changes whenever ``entities`` does."""
        ...


class QueryAnalyzer:
    """Deterministic analysis of a query against one user's entity catalog.

    Args:
        catalog: Returns a user's entity catalog.
    """

    def __init__(self, catalog: Callable[[str], Catalog]) -> None:
        self._catalog = catalog
        # Per catalog: its version when the map was built, and the map. A map lives as long as
        # its catalog: an LRU of maps by user held the catalogs the store had let go of (a
        # thousand users' on the million store, 435 MB). A rebuilt catalog (after a forget) is
        # a new object.
        self._aliases: weakref.WeakKeyDictionary[Catalog, tuple[int, dict[str, str]]]
        self._aliases = weakref.WeakKeyDictionary()
        self._held = threading.Lock()

    def _alias_map(self, user_id: str) -> tuple[Catalog, dict[str, str]]:
        """alias key -> entity key, rebuilt when the catalog changes."""
        catalog = self._catalog(user_id)
        with self._held:
            cached = self._aliases.get(catalog)
        version = catalog.version  # before the walk: a write meanwhile makes the next call build again
        if cached is not None and cached[0] == version:
            return catalog, cached[1]
        mapping: dict[str, str] = {}
        for key, info in catalog.entities.items():
            mapping.setdefault(key, key)
            for surface in info.aliases:
                mapping.setdefault(entity_key(surface), key)
        with self._held:
            self._aliases[catalog] = (version, mapping)
        return catalog, mapping

    def resolve_entities(self, query: str, user_id: str) -> list[EntityRef]:
        """Entities the query names, resolved against the user's known entities and aliases."""
        catalog, aliases = self._alias_map(user_id)
        words = [w for w in re.findall(r"[\w'’\-]+", query)]
        found: dict[str, EntityRef] = {}
        # Longest n-grams first, so "New York" wins over "York".
        for n in (3, 2, 1):
            for i in range(len(words) - n + 1):
                mention = " ".join(words[i : i + n])
                key = aliases.get(entity_key(mention))
                if key and key not in found and not any(mention in ref.mention for ref in found.values()):
                    info = catalog.entities[key]
                    found[key] = EntityRef(
                        key=key, name=info.name, mention=mention, known=True, type=info.type,
                        participant=info.spoke > 0,
                    )  # fmt: skip
        for key, name in extract_names(query):
            if key not in found and aliases.get(key) is None:
                found[key] = EntityRef(key=key, name=name, mention=name, known=False)
        return list(found.values())

    def analyze(self, query: str, user_id: str, reference_time: datetime | None = None) -> QueryAnalysis:
        """Analyse one query for one user; ``reference_time`` anchors relative times (default: now)."""
        started = time.perf_counter()
        now = reference_time or datetime.now(UTC)
        if is_smalltalk(query):
            return QueryAnalysis(
                query=query, intent="smalltalk", skip_retrieval=True, reference_time=now,
                duration_ms=(time.perf_counter() - started) * 1000,
            )  # fmt: skip
        is_list = bool(_LIST_RE.search(query) or _PLURAL_ASK_RE.search(query))
        answer_type = _answer_type(query, is_list)
        window = None
        times = find_times(query, now)
        anchor = _ANCHOR_RE.search(query)
        if anchor and not times:
            relation = "before" if anchor.group(1).lower() in ("before", "until", "prior to") else "after"
            window = TimeWindow(expression=anchor.group(0), relation=relation, anchor=anchor.group(2).strip())
        elif times:
            t = times[0]
            if t.relation == "before":
                window = TimeWindow(end=t.start, expression=t.text, relation="before")
            elif t.relation == "after":
                window = TimeWindow(start=t.start, expression=t.text, relation="after")
            else:
                window = TimeWindow(start=t.start, end=t.end, expression=t.text)
        words = _WORD_RE.findall(query.lower())
        keywords = [w for w in words if w not in _STOP and len(w) > 1]
        entity_type = next((_TYPE_OF[w] for w in words if w in _TYPE_OF), "") if is_list else ""
        if _BROAD_RE.search(query):
            intent = "broad"
        elif is_list:
            intent = "aggregation"
        elif window is not None:
            intent = "temporal"
        else:
            intent = "lookup"
        return QueryAnalysis(
            query=query,
            intent=intent,
            keywords=keywords,
            entities=self.resolve_entities(query, user_id),
            time_window=window,
            answer_type=answer_type,
            entity_type=entity_type,
            reference_time=now,
            duration_ms=(time.perf_counter() - started) * 1000,
        )
