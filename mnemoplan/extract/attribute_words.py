"""Names and short phrases in a sentence, as attribute values: "The Remains of the Day" is one
name, "Pixel 7" keeps its model number, "Universidade de São Paulo" says it is a university,
and words that open a sentence ("Hey", "Monday") are no value. Used by ``extract.attributes``.
"""

from __future__ import annotations

import re

from mnemoplan.extract.brands import brand_attribute

__all__ = ["EMAIL_RE", "PHONE_RE", "NAMEISH", "NAME_RE", "NOT_VALUES", "by_value", "clean_value", "names_in", "phrase_after"]

NAMEISH = r"(?:[A-ZÀÁÂÄÅÇÉÈÍÑÓÖØÚÜŠŽ][\w'’.\-+&@]*|[a-z]+[A-Z][\w\-]*)"
_JOIN = r"(?:of|de|di|da|del|do|dos|the|la|le|du|von|van|der|y|in the time of)"
NAME_RE = re.compile(rf"{NAMEISH}(?:\s+(?:{_JOIN}\s+){{0,2}}{NAMEISH})*")  # "The Remains of the Day"
EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# a phone number as people write one: 7-15 digits, maybe a +country code, spaces, dots, dashes, brackets
PHONE_RE = re.compile(r"(?<![\w+])(?:\+|00)?\(?\d(?:[\d ().-]{5,18})\d(?![\w])")


def is_phone_number(text: str) -> bool:
    """Whether ``text`` is a phone number as written (7 to 15 digits)."""
    return PHONE_RE.fullmatch(text) is not None and 7 <= sum(ch.isdigit() for ch in text) <= 15

# Words that open a sentence or name no value, though capitalised.
NOT_VALUES = frozenset("""
i i'm i've i'll i'd im my me we we're our us you your it it's this that these those the a an and but so or
he she they his her their him them there here what who when where why how which hi hey hello ok okay
yes no oh ugh lol thanks thank please sorry wait update news big new now just also still dr dr. mr mrs ms
honestly phd ngo mba ceo cto hr it lol omg ok nope yeah yep
monday tuesday wednesday thursday friday saturday sunday january february march april may june july august
september october november december christmas easter today tomorrow yesterday anyway btw omg haha wow
good great morning evening night hmm nooo hola ciao ok. olá hoi oi greetings congrats
""".split())
_MODEL = re.compile(r"(?:\s+(?:[a-zA-Z]?\d{1,4}[a-zA-Z+]*|Pro|Max|Plus|Mini|Ultra|Air|SE))+\b")


def clean_value(value: str) -> str:
    value = re.sub(r"^(?:the|a|an|my|our|Dr\.?|Dr)\s+", "", value.strip(" ,.:;!?\"'()"), flags=re.I)
    value = re.sub(r"\s+(?:in|at|on|near|for|from|with|and|since|now|lol|haha)$", "", value, flags=re.I)
    return value.strip(" ,.:;!?\"'()")


def names_in(text: str) -> list[tuple[int, str]]:
    """Capitalised spans that may be values, with where they start."""
    out = []
    for m in NAME_RE.finditer(text):
        words = m.group().split()
        while words and words[0].lower().strip(".,!") in NOT_VALUES:
            words = words[1:]
        while words and words[-1].lower().strip(".,!") in NOT_VALUES:
            words = words[:-1]
        value = clean_value(" ".join(words))
        if value and brand_attribute(value):  # a product's model number: "Pixel 7", "Hyundai i30"
            model = _MODEL.match(text, m.end())
            value += model.group() if model and value.endswith(words[-1].strip(".,!")) else ""
        if value and value.lower() not in NOT_VALUES and len(value) > 1:
            out.append((m.start() + m.group().find(words[0]) if words else m.start(), value))
    return out


def phrase_after(text: str, start: int, most: int = 4) -> str:
    """The short phrase from ``start`` to the clause's end (at most ``most`` words)."""
    rest = re.split(r"[,.!?;:()]|\s(?:and(?!\s+(?-i:[A-Z]))|but|so|because|which|who|since|at|in|on|for|with|from|now|lol|is|was|"
                    r"are|has|had|of|i|i'm|to|who|that|after|before|until|this|these|every|"
                    r"haha|anymore|though|tho)\s", text[start:] + " ", maxsplit=1, flags=re.I)[0]
    words = rest.split()[:most]
    return clean_value(" ".join(words))


def by_value(value: str) -> str:
    """An attribute a value's own words give away ("University of Edinburgh", an email address)."""
    if EMAIL_RE.fullmatch(value):
        return "email"
    if is_phone_number(value):
        return "phone_number"
    if re.search(r"\b(?:universi[td]\w*|università|universität|college|school|institute|polytechnic|academy|uni)\b",
                 value, re.I):
        return "university"
    if re.search(r"\b(?:fitness|gym|crossfit|boulders?|climbing)\b", value, re.I):
        return "gym"
    if re.search(r"\bbank\b", value, re.I):
        return "bank"
    return brand_attribute(value)  # "Mazda CX-5", "Monzo", "Fairphone 5"
