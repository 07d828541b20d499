"""What a session is about: its topics (recurring phrases) and the names it mentions."""

from __future__ import annotations

from collections import Counter

from mnemoplan.extract.names import entity_key, extract_names
from mnemoplan.extract.session_text import Sentence, Token, is_alias, mentions_time

_ADJECTIVE_ENDINGS = ("ful", "ous", "ly", "less", "able", "ible", "ical")
_MAX_ENTITIES = 8
_MAX_TOPICS = 6


def _surface(forms: Counter[str]) -> str:
    # "painting" reads as a topic, "painted" does not: prefer forms not ending in -ed.
    return sorted(forms.items(), key=lambda f: (f[0].endswith("ed"), -f[1], f[0]))[0][0]


def topics_of(sentences: list[Sentence], weights: dict[str, float], df: dict[str, int]) -> list[str]:
    """The phrases a session keeps coming back to, best first, as written."""
    # Candidates are runs of 1-3 adjacent content words (no stopword or punctuation between).
    counts: Counter[tuple[str, ...]] = Counter()
    shown: dict[tuple[str, ...], Counter[str]] = {}
    for s in sentences:
        run: list[Token] = []
        for t in [*s.tokens, Token("", "", "", False)]:
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
    return not mentions_time(name)  # "Last Tuesday" is a time, not a name


def entities_of(sentences: list[Sentence], participants: list[str], stopwords: frozenset[str]) -> list[str]:
    """The participants, then the names the session mentions most, first said first."""
    keys = [entity_key(p) for p in participants]
    common = {t.raw for s in sentences for t in s.tokens if t.raw.islower()}
    counts: Counter[str] = Counter()
    names: dict[str, str] = {}
    for s in sentences:
        for key, name in extract_names(s.text):
            if not is_alias(key, keys) and _is_name(name, common, stopwords):
                counts[key] += 1
                names.setdefault(key, name)
    for key in list(counts):  # "Potter" after "Harry Potter" is the same name, said shorter
        longer = [k for k in counts if k != key and f"-{key}-" in f"-{k}-"]
        if longer:
            counts[longer[0]] += counts.pop(key)
    order = {k: i for i, k in enumerate(names)}
    others = sorted(counts, key=lambda k: (-counts[k], order[k]))
    return (participants + [names[k] for k in others])[: max(_MAX_ENTITIES, len(participants))]
