"""The attributes of a person that memory keeps one current value of, and how they are named.

Each attribute has cue words that make a clause about it ("work", "job", "manager at" for the
employer), a fact template, whether values add up (hobbies, languages) and, for a closed class,
its values (diets, hair colours). ``extract.attributes`` reads statements with them;
``asked_attribute`` tells which one a question asks about; ``mentions`` whether a text names a
value, as a person would ("Galaxy S21" for "Samsung Galaxy S21").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ATTRIBUTES", "FAVOURITE_KINDS", "FAVOURITE_OF_SOME_KIND", "FAVOURITE_WORD", "Attribute", "asked_attribute",
           "mentions", "value_terms"]


@dataclass(frozen=True)
class Attribute:
    """One attribute of a person: its cues, whether it holds several values, how a fact says it."""

    key: str
    cues: str  # a regex of the head nouns and verbs that make a clause about it
    template: str  # the fact's text: {s} the person, {v} the value
    multi: bool = False  # hobbies, languages: values add up instead of replacing each other
    closed: str = ""  # a regex of the values of a closed class (diets, colours), if it is one
    asks: str = ""  # extra words of a question about it (beyond the cues)


ATTRIBUTES: dict[str, Attribute] = {a.key: a for a in (
    Attribute("home_city", r"live|living|lived|moved|move|relocated|based|city|town|flat|apartment|house|"
              r"neighbou?rs?|here in|settled", "{s} lives in {v}", asks="where|home"),
    Attribute("neighbourhood", r"neighbou?rhood|district|area|borough|quarter|suburb", "{s} lives in the {v} neighbourhood"),
    Attribute("employer", r"work|working|works|job|employer|company|firm|joined|hired|manager|boss|team lead|"
              r"colleagues?|coworkers?|office|internship|started at|first (?:week|day|month) at|retired|laid off|fired",
              "{s} works at {v}", asks="employer|company|work for"),
    Attribute("job_title", r"job|role|title|position|promoted|profession|career|for a living|retired|retirement|"
              r"laid off",
              "{s} works as {v}", asks="do for (?:a living|work|a job)|role|title|job"),
    Attribute("university", r"universi[td]\w*|uni|college|school|study|studying|studies|degree|phd|master'?s|"
              r"bachelor'?s|professor|lecturer|campus|semester|enrolled|transferred|graduated|student|thesis",
              "{s} studies at {v}", asks="study|attend|school|uni"),
    Attribute("partner", r"girlfriend|boyfriend|wife|husband|partner|fianc[ée]e?|spouse|dating|engaged|married|"
              r"together|going out with|broke up|broken up|split up|divorced|single", "{s}'s partner is {v}", asks="relationship|partner"),
    Attribute("pet", r"pet|dog|cat|kitten|puppy|hamster|guinea pig|rabbit|parrot|goldfish|bird|tortoise|turtle",
              "{s}'s pet is {v}"),
    Attribute("car", r"car|drive|driving|drove|car-free", "{s} drives {v}"),
    # a number only when the words say whose and what: "my (new) number", "phone number", "call me on"
    Attribute("phone_number", r"(?:phone|mobile|cell|cellphone|telephone|whatsapp|contact)[ -]?(?:number|no\.?)|"
              r"(?<=my )(?:new )?number|(?:reach|call|text|ring) me", "{s}'s phone number is {v}"),
    Attribute("phone", r"phone|smartphone|mobile", "{s}'s phone is {v}"),
    Attribute("laptop", r"laptop|notebook|macbook|computer", "{s}'s laptop is {v}"),
    Attribute("email", r"e-?mail|address|inbox|mailbox", "{s}'s email is {v}"),
    Attribute("bank", r"bank|banking|account|current account|credit card|debit card", "{s} banks with {v}"),
    Attribute("gym", r"gym|fitness|membership|work ?out|trainer|lifting", "{s} goes to the gym {v}"),
    Attribute("doctor", r"doctor|gp|dentist|physician|dermatologist|therapist|dr\.?", "{s}'s doctor is {v}"),
    Attribute("internet_provider", r"internet|broadband|wi-?fi|fib(?:re|er)|provider|isp|router",
              "{s}'s internet provider is {v}"),
    Attribute("streaming_service", r"stream\w*|subscription|subscribed", "{s} streams on {v}",
              asks="watch"),
    Attribute("running_shoes", r"running shoes?|runners|trainers|sneakers|shoes", "{s} runs in {v}"),
    Attribute("coffee_order", r"coffee|order|latte|espresso|cappuccino|flat white|americano|cortado|macchiato|"
              r"mocha|frappuccino|cold brew|long black|barista|café|cafe", "{s}'s usual coffee order is {v}",
              closed=r"(?:(?:oat|soy|almond|double|triple|iced|caramel|vanilla|decaf|skinny|single|chai|matcha)\s+)*"
                     r"(?:flat white|cortado|latte|espresso|cappuccino|americano|macchiato|mocha|frappuccino|"
                     r"cold brew|long black|short black|filter coffee|piccolo|ristretto|lungo|affogato)"),
    Attribute("commute", r"commute|commuting|get to work|ride to work|to work|to the office|into work", "{s}'s commute: {v} to work",
              closed=r"e-bike|e-scooter|bike|bicycle|cycling|cycle|train|bus|tram|metro|subway|underground|tube|car|driving|drive|"
                     r"walk|walking|scooter|e-scooter|ferry|carpool|motorbike|motorcycle", asks="get to work"),
    Attribute("diet", r"diet|eat|eating|vegan|vegetarian|pescatarian|keto|meat", "{s}'s diet is {v}",
              closed=r"vegan|vegetarian|pescatarian|keto|paleo|carnivore|omnivore|flexitarian|gluten-free|"
                     r"dairy-free|low-fodmap|halal|kosher|raw vegan|plant-based|whole30|mediterranean",
              asks="eat"),
    Attribute("hair_colour", r"hair|dyed|dye|hairdresser|stylist|roots|balayage|highlights", "{s}'s hair is {v}",
              closed=r"(?:(?:dark|light|ash|strawberry|bright|deep|pastel|platinum)\s+)?(?:blonde?|brunette|brown|black|"
                     r"red|ginger|auburn|grey|gray|silver|white|pink|blue|purple|green|orange|platinum|copper|lilac|"
                     r"teal)", asks="colou?r"),
    Attribute("age", r"years old|turned|turning|birthday|age|aged", "{s} is {v} years old", asks="how old"),
    Attribute("languages", r"speak|speaks|language|fluent|native|learning|classes|lessons?|tutor|course|duolingo",
              "{s} speaks {v}", multi=True,
              closed=r"english|spanish|french|german|italian|portuguese|dutch|swedish|norwegian|danish|finnish|"
                     r"icelandic|polish|russian|ukrainian|czech|slovak|hungarian|romanian|bulgarian|croatian|serbian|"
                     r"greek|turkish|arabic|hebrew|persian|farsi|hindi|urdu|bengali|punjabi|tamil|telugu|japanese|"
                     r"korean|mandarin|chinese|cantonese|vietnamese|thai|indonesian|malay|tagalog|swahili|catalan|"
                     r"basque|welsh|irish|gaelic|latin|esperanto|sign language|asl|bsl"),
    Attribute("hobbies", r"hobby|hobbies|took up|taken up|into|passion|pastime|free time", "{s}'s hobby is {v}",
              multi=True),
    Attribute("favourite_band", r"band|music|listen\w*|concert|album", "{s}'s favourite band is {v}"),
    Attribute("favourite_book", r"book|novel|read|reading", "{s}'s favourite book is {v}"),
    Attribute("favourite_food", r"food|dish|meal|eat|cuisine", "{s}'s favourite food is {v}"),
    Attribute("favourite_team", r"team|club|fan|support|supports|supported|supporting|supporter|root for|follow", "{s} supports {v}",
              asks="support|root"),
)}

FAVOURITE_WORD = r"(?:favou?rite|fave|fav|number one|no\.? ?1)"
FAVOURITE_OF_SOME_KIND = "favourite?"  # "my favourite is now X": the kind of the favourite said last (``ingest``)
# A clause about a favourite names its kind by the noun after (or before) the word.
FAVOURITE_KINDS = {"band": "favourite_band", "bands": "favourite_band", "group": "favourite_band",
             "artist": "favourite_band", "book": "favourite_book", "books": "favourite_book",
             "novel": "favourite_book", "food": "favourite_food", "foods": "favourite_food",
             "dish": "favourite_food", "meal": "favourite_food", "team": "favourite_team",
             "club": "favourite_team"}


def value_terms(value: str) -> list[str]:
    """The words of a value that name it in other text: "Samsung Galaxy S21" is named by "Galaxy S21"
    or "Samsung"; "University of Melbourne" by "Melbourne", not "University"."""
    generic = {"university", "universidad", "università", "universidade", "college", "school", "fitness", "gym",
               "the", "of", "de", "di", "da", "do", "bank", "club", "fc", "city", "team", "band", "new", "old",
               "dr", "dr.", "and", "in", "time", "my", "a", "an", "la", "le", "du", "van", "von", "del", "y"}
    words = [w for w in re.findall(r"[\w'’.@+-]+", value) if w.lower().strip(".") not in generic]
    return [w.strip(".") for w in words if len(w.strip(".")) >= 3 or any(ch.isdigit() for ch in w)]


def mentions(text: str, value: str, *, loose: bool = True, unlike: str = "") -> bool:
    """Whether ``text`` names ``value`` (whole words, any case; ``loose``: or a distinctive word of
    it, one that ``unlike``, another value, does not share: "project manager" is not named by
    "manager" when told from "program manager")."""
    if re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text, re.I):
        return True
    if not loose:
        return False
    shared = {w.lower() for w in value_terms(unlike)}
    terms = [w for w in value_terms(value) if w.lower() not in shared]
    return any(re.search(rf"(?<![\w@.]){re.escape(w)}(?:s|es)?(?!\w)", text, re.I) for w in terms)  # "Octavias"


_HISTORY = re.compile(r"\b(?:before|used to|previous\w*|formerly|(?:my|the) old|originally|back then|earlier|"
                      r"in the past|when did|ex|prior|switch(?:ed)? from|left)\b", re.I)


# A question about one's own attribute is short ("Where do I work these days?"); a cue word
# named in passing in a long message ("My guy, I already told you... where do we start?") is not one.
QUESTION_WORDS = 16
_ASKING = re.compile(r"(?:what|what's|whats|where|which|who|who's|when|how|do|does|did|am|is|are|remind|tell|"
                     r"can|could|would|please|so|and)\b", re.I)


def question_clauses(query: str) -> list[str]:
    """The short questions and requests of a query: the whole query when it is that short ("my
    employer"), else its sentences of at most ``QUESTION_WORDS`` words that end with a question
    mark or start by asking ("remind me where I live", "could you tell me where I work")."""
    if len(query.split()) <= QUESTION_WORDS:
        return [query.strip()] if query.strip() else []
    out = []
    for part in re.split(r"(?<=[.!?])\s+|\n+", query.strip()):
        part = part.strip(" \t*_>-\"'“”")
        if part and len(part.split()) <= QUESTION_WORDS and (part.endswith("?") or _ASKING.match(part)):
            out.append(part)
    return out


def asked_attribute(query: str) -> tuple[str, bool]:
    """The attribute of the asker a question asks about, and whether it asks about the past
    ("Where did I live before?", "When did I move?"); ("", False) for any other question, and
    for a long message that only names an attribute's word in passing (``question_clauses``)."""
    for clause in question_clauses(query):
        asked = _asked_in(clause)
        if asked[0]:
            return asked
    return "", False


def _asked_in(query: str) -> tuple[str, bool]:
    """``asked_attribute`` for one short question."""
    if not re.search(r"\b(?:i|i'm|my|me|am i|do i|did i)\b", query, re.I):
        return "", False
    q = query.lower()
    fav = re.search(rf"{FAVOURITE_WORD}\s+(\w+)", q)
    best, where = "", (10_000, 0)
    if fav and fav.group(1) in FAVOURITE_KINDS:
        best = FAVOURITE_KINDS[fav.group(1)]
    else:
        for attr in ATTRIBUTES.values():
            pattern = attr.cues + (f"|{attr.asks}" if attr.asks else "")
            m = re.search(rf"\b(?:{pattern})(?:s|es)?\b", q)  # "what cars do I have?"
            # the first cue wins, the longer of two at one place ("work out" over "work")
            if m and (m.start(), -len(m.group())) < where and not (
                    attr.key == "home_city" and "where" == m.group() and
                    re.search(r"\b(?:work|study|gym|work out|school)\b", q)):
                best, where = attr.key, (m.start(), -len(m.group()))
    return best, bool(best and _HISTORY.search(q))
