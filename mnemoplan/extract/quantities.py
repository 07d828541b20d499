"""Money, percentages and counted things in a text ("$40", "3 kids", "two little dogs")."""

from __future__ import annotations

import re

from mnemoplan.extract.lexicon import words

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
_NOT_NOUNS = words("us is was has does its this his hers yours ours theirs as less plus yes of the and or")
_IRREGULAR_PLURALS = words("children people men women feet teeth mice geese sheep fish km kg lbs")


def is_plural_noun(word: str) -> bool:
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
        if second and is_plural_noun(second) and not (is_plural_noun(first) or first.lower() in _NOT_NOUNS):
            found.append((m.start(), f"{number} {first} {second}"))
        elif is_plural_noun(first):
            found.append((m.start(), f"{number} {first}"))
    return tuple(dict.fromkeys(q for _, q in sorted(found)))
