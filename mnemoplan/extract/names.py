"""Entity names: normalised keys, and deterministic extraction of the names a text mentions."""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

from mnemoplan.extract.lexicon import ADVERBS, BE, COMMON_VERBS, DO, HAVE, MODALS, PARTICIPLE, PAST, PRESENT
from mnemoplan.model import EntityMention

_NON_ALNUM = re.compile(r"[^0-9a-z]+")

# Capitalised words that are rarely names in conversation.
_NOT_NAMES = frozenset(
    """
    i i'm i've i'll i'd im ive a an the and but or so if then than that this these those there here
    hey hi hello yes yeah yep no nope ok okay oh wow aw aww awesome thanks thank great good nice cool sure
    well hmm haha lol omg wait what when where who why how which do does did is are was were be been
    my your his her our their its me you he she we they it us them mine yours
    congrats congratulations sorry please love glad happy sounds that's it's what's you're we're they're
    don't can't won't didn't isn't wasn't also just really totally absolutely definitely maybe
    monday tuesday wednesday thursday friday saturday sunday
    january february march april may june july august september october november december
    today tomorrow yesterday tonight morning evening night week weekend month year
    last next this past whenever wherever however whatever anyway anyways honestly
    mr mrs ms dr
    """.split()
)
_WORD = r"[A-Z][\w'’\-]*"
_CAP_SEQ = re.compile(rf"\b{_WORD}(?:\s+(?:of|de|da|del|van|von|la|le|the)?\s*{_WORD})*")
# a sentence, a line, or an item of a list ("- Speaks Spanish", "2) Based in Lima") opens here
_SENTENCE_START = re.compile(r"(^|[.!?]\s+|\n\s*(?:(?:[-*•·–]|\d{1,2}[.)])\s+)?|[\"“(]\s*)$")
# Words that open a sentence or an agent's note as a verb or an adverb ("Speaks Spanish", "Loves Ana's
# cooking", "Currently at Google"): capitalised only because they come first.
_OPENING_WORDS = frozenset(PRESENT) | frozenset(PAST) | frozenset(PARTICIPLE) | BE.keys() | HAVE.keys() | DO.keys() \
    | MODALS | ADVERBS | COMMON_VERBS | frozenset({"based", "born", "raised", "located", "previously", "formerly"})


def is_name_word(word: str) -> bool:
    """Whether a word can be (part of) a name: capitalised letters, not a capitalised common word
    ("Monday", "March", "My", "Dr")."""
    word = word.strip(".,!?;:\"“”‘’()")
    return re.fullmatch(r"[A-Z][a-zA-Z-]*", word) is not None and word.lower() not in _NOT_NAMES


@functools.lru_cache(maxsize=1 << 16)
def entity_key(name: str) -> str:
    """Normalise a name to its key: lowercase, accents folded, punctuation to '-' (cached: a
    question's analysis keys every alias of the user's entities again whenever one was added).

    ``"José García"``, ``"jose garcia"`` and ``"José-García"`` share the key ``jose-garcia``.
    """
    folded = unicodedata.normalize("NFKD", name)
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch)).lower()
    folded = folded.replace("’", "'").replace("'s", "")
    return _NON_ALNUM.sub("-", folded).strip("-")


def _clean(candidate: str) -> str:
    # "I" is never part of a name ("Whenever I", "Then I").
    words = [w for w in candidate.split() if w not in ("I", "I'm", "I've", "I'll", "I'd")]
    while words and words[0].lower().strip("'’") in _NOT_NAMES:
        words = words[1:]
    while words and words[-1].lower() in {"of", "de", "da", "del", "van", "von", "la", "le", "the"}:
        words = words[:-1]
    name = " ".join(words)
    return re.sub(r"['’]s$", "", name)


class KnownKeys:
    """A user's entity keys, made once per write rather than per message: a user of many entities
    (tens of thousands in a large store) paid a pass over all of them for every message.

    Args:
        keys: Entity keys (``entity_key`` of a name; a key is its own key).
        extra: A few more (a message's speaker).
    """

    __slots__ = ("_keys", "_extra", "max_words")

    def __init__(self, keys: frozenset[str], extra: frozenset[str] = frozenset(), max_words: int = -1) -> None:
        self._keys, self._extra = keys, extra
        self.max_words = max_words if max_words >= 0 else max((k.count("-") + 1 for k in keys | extra), default=0)

    @classmethod
    def of(cls, known: Iterable[str]) -> KnownKeys:
        """Keys of names (or keys) as given; a ``KnownKeys`` as it is."""
        if isinstance(known, KnownKeys):
            return known
        return cls(frozenset(k for k in (entity_key(n) for n in known) if k))

    def plus(self, key: str) -> KnownKeys:
        """These keys and one more ("" adds nothing)."""
        if not key or key in self:
            return self
        return KnownKeys(self._keys, self._extra | {key}, max(self.max_words, key.count("-") + 1))

    def __contains__(self, key: object) -> bool:
        return key in self._extra or key in self._keys

    def __bool__(self) -> bool:
        return bool(self._keys or self._extra)


def extract_names(text: str, known: Iterable[str] = ()) -> list[tuple[str, str]]:
    """Names a text mentions: (key, surface form), each key once, in order.

    Capitalised word runs count unless they are common words; a run that opens a
    sentence counts only if it is a known name or has several words. Known names
    (keys of the user's entities) are found whatever their case.
    """
    found: dict[str, str] = {}
    known_keys = KnownKeys.of(known)
    for match in _CAP_SEQ.finditer(text):
        name = _clean(match.group(0))
        if not name or len(name) < 2:
            continue
        key = entity_key(name)
        if not key or key in _NOT_NAMES:
            continue
        at_start = bool(_SENTENCE_START.search(text[: match.start()]))
        bare = re.sub(r"['’]s$", "", match.group(0))
        first, _, rest = name.partition(" ")
        if at_start and rest and name.startswith(bare.split()[0]) and first.lower() in _OPENING_WORDS \
                and entity_key(first) not in known_keys:
            name, bare = _clean(rest), _clean(rest)  # "Speaks Spanish": the name is what follows the verb
            key = entity_key(name)
            at_start = False
            if not key or key in _NOT_NAMES or len(name) < 2:
                continue
        if at_start and name == bare and " " not in name and key not in known_keys:
            continue
        found.setdefault(key, name)
    if known_keys:  # the text's runs of up to max_words words, each looked up (not every key searched for)
        tokens = entity_key(text).split("-")
        for i in range(len(tokens)):
            for n in range(1, min(known_keys.max_words, len(tokens) - i) + 1):
                key = "-".join(tokens[i : i + n])
                if key not in found and len(key) > 2 and key in known_keys:
                    found[key] = key.replace("-", " ")
    return list(found.items())


_RELATIONS = (
    "friend|friends|buddy|pal|sister|brother|mom|mother|dad|father|son|daughter|wife|husband|partner|"
    "boyfriend|girlfriend|cousin|aunt|uncle|niece|nephew|grandma|grandmother|grandpa|grandfather|"
    "colleague|coworker|boss|neighbor|neighbour|teacher|mentor|roommate|kid|child|fiance|fiancee"
)
_PEOPLE = frozenset(_RELATIONS.split("|")) | {"parent", "parents", "family", "children", "folks", "grandparents"}


def is_person_noun(word: str) -> bool:
    """Whether a noun names a person or people by their relation: "sister", "parents", "friends"."""
    word = word.lower()
    return word in _PEOPLE or word.endswith("s") and word[:-1] in _PEOPLE


_PERSON_CUE = re.compile(rf"\b(?:my|our|his|her|their)\s+(?:best\s+|old\s+|new\s+|little\s+|big\s+)?"
                         rf"(?:{_RELATIONS})s?,?\s+(?:named\s+|called\s+)?$", re.I)  # fmt: skip
_PET_CUE = re.compile(r"\b(?:dog|puppy|pup|cat|kitten|pet|horse|bird|rabbit|hamster)s?,?\s+(?:named\s+|called\s+)?$", re.I)
_PLACE_CUE = re.compile(r"\b(?:in|to|from|at|visited|visiting|near|around|moved to)\s+(?:the\s+)?$", re.I)


def guess_type(text: str, name: str) -> str:
    """A name's type from the words before it: "my sister Ana" -> person, "a pup named Max" -> pet,
    "moved to Lisbon" -> place; "" when nothing says."""
    at = text.find(name)
    if at < 0:
        return ""
    before = text[max(0, at - 40) : at]
    if _PERSON_CUE.search(before):
        return "person"
    if _PET_CUE.search(before):
        return "pet"
    if _PLACE_CUE.search(before):
        return "place"
    return ""


def mentions_for(text: str, speaker: str, known: Iterable[str] = ()) -> list[EntityMention]:
    """The entity mentions of one record: its speaker, then the names in its text (typed when the
    words before a name say what it is)."""
    out: list[EntityMention] = []
    seen: set[str] = set()
    if speaker:
        key = entity_key(speaker)
        if key:
            out.append(EntityMention(key=key, name=speaker, type="person", role="speaker"))
            seen.add(key)
    for key, name in extract_names(text, known):
        if key not in seen:
            out.append(EntityMention(key=key, name=name, type=guess_type(text, name), role="mention"))
            seen.add(key)
    return out
