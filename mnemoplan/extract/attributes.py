"""Attributes of a person, by rule: which attribute a statement is about, and its value.

"my first week at Siemens Healthineers went really well" says where the speaker works;
"I'm not vegan anymore" ends the speaker's diet; "KPMG, not Deloitte" corrects a value just
given. A statement becomes (attribute, value), or an ending of an attribute, or a correction
of a known value; ``ingest`` then lets a newer value of the same attribute of the same person
replace the older one (``derive.attribute_decision``).

The method is general, not a list of phrasings: a small lexicon maps head nouns and verbs
(cues: "work", "job", "manager at", "live", "moved", "gym", "dentist", "girlfriend", ...) to
attribute keys; a value is the name (a capitalised span), the closed-class word (a diet, a
hair colour, a way to commute) or the phrase a cue's frame points at ("my favourite X is Y",
"Y is my X", "my new X, Y", "I'm a Y at Z"). Clauses about someone else ("my brother moved to
Galway"), hedged ("we might move"), about a visit ("home from Kraków") or questions state
nothing. Only the speaker's own attributes are read: precision matters more than recall.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mnemoplan.extract.attribute_kinds import (
    ATTRIBUTES,
    FAVOURITE_KINDS,
    FAVOURITE_OF_SOME_KIND,
    FAVOURITE_WORD,
    Attribute,
    asked_attribute,
    mentions,
    value_terms,
)
from mnemoplan.extract.attribute_patterns import (
    COMPANION,
    APPOSED,
    ADD,
    ASKS,
    AT_FRAME,
    COPULA,
    CHANGE,
    COPULA_NOUNS,
    CORRECTION,
    DENIED,
    ENDED_NAME,
    ENDING,
    FIRST_PERSON,
    FROM_TO,
    FUTURE,
    GAP,
    GONE,
    HEDGE,
    IMPLIED_I,
    INSTEAD,
    IN_FRAME,
    MOVED_ON,
    NAMED_BEFORE,
    NOT_X,
    NO_VALUE,
    OTHER_FAVOURITE,
    OTHER_SUBJECT,
    OWNED,
    OWNER,
    PAST,
    PLACES,
    PLACE_BEFORE,
    QUESTION_WORD,
    QUOTED,
    RELATION_CUE,
    SAYING,
    SENTENCE,
    SPEAKER_HAS,
    SUBJECT_I,
    TAKE_TO_WORK,
    UNNAMED,
    UNREALISED,
    UNSURE,
    VISIT,
    doctor_named,
    unquoted,
)
from mnemoplan.extract.brands import brand_attribute
from mnemoplan.extract.attribute_words import (
    EMAIL_RE,
    PHONE_RE,
    is_phone_number,
    NAMEISH,
    NOT_VALUES,
    by_value,
    clean_value,
    names_in,
    phrase_after,
)

__all__ = ["ATTRIBUTES", "FAVOURITE_OF_SOME_KIND", "AttributeStatement", "Attribute", "asked_attribute",
           "attribute_statements", "mentions", "value_terms"]



@dataclass(frozen=True)
class AttributeStatement:
    """What one clause says of the speaker: an attribute's value, its end, or a correction."""

    attribute: str
    value: str  # "" for an ending
    ending: bool = False
    adds: bool = False  # a value beside the others ("I also speak Spanish")
    replaces: str = ""  # the old value the clause names as no longer true ("not Deloitte", "from X to")
    closes: str = ""  # an old value a change names, held or not ("cancelled McFit and joined X", "X instead of Y")
    loose: bool = False  # a name near a cue, or its kind alone, in no frame of the speaker's: changes nothing
    mention: bool = False  # "my iPhone 14 screen cracked": the speaker's, not said to be a change (``ingest``)


def _cue_positions(sentence: str) -> list[tuple[int, int, str]]:
    """(start, end, attribute) of each cue in the sentence, in order."""
    found = []
    for attr in ATTRIBUTES.values():
        for m in re.finditer(rf"\b(?:{attr.cues})\b", sentence, re.I):
            found.append((m.start(), m.end(), attr.key))
    return sorted(found)


def _closed_values(sentence: str) -> list[tuple[int, str, str]]:
    out = []
    for attr in ATTRIBUTES.values():
        if attr.closed:
            for m in re.finditer(rf"\b(?P<v>{attr.closed})(?:e?s)?\b", sentence, re.I):  # "no more trains"
                out.append((m.start(), attr.key, m.group("v").lower()))
    return out


def _frames(sentence: str) -> list[AttributeStatement]:
    """Values that a frame points at, whatever their case: favourites, "my X is Y", roles."""
    out: list[AttributeStatement] = []
    s = sentence
    # "my favourite band is X", "new favourite book: X", "my favourite is now X" (kind from the clause)
    for m in re.finditer(rf"{FAVOURITE_WORD}\s*(?P<kind>{'|'.join(FAVOURITE_KINDS)})?\b\s*(?:is|are|:|=|alert:|"
                         rf"has (?:officially )?changed,? it's|"
                         rf"is now|now is|now:)?\s*(?:now\s+)?(?:is\s+)?(?::\s*)?", s, re.I):
        kind = FAVOURITE_KINDS.get((m.group("kind") or "").lower())
        if kind is None:
            kind = next((v for k, v in FAVOURITE_KINDS.items() if re.search(rf"\b{k}\b", s, re.I)), None)
        if kind is None and not OTHER_FAVOURITE.match(s, m.start()):
            kind = FAVOURITE_OF_SOME_KIND  # "my favourite is now X"; not "my favourite character"
        value = ""
        if m.group("kind") and m.group("kind").lower() not in FAVOURITE_KINDS:
            value = phrase_after(s, m.start("kind"))
        elif m.end() < len(s) and re.match(r"\s*(?:is|are|:|=|alert)", s[m.start("kind") if m.group("kind") else
                                                                               m.end():] + " ", re.I) is None:
            value = phrase_after(s, m.end())
        before = re.search(r"(?P<v>[^,.!?;:]+?)(?:\s+(?:is|are|has been|have been|has become|became|is now|are now)|"
                           r"['’]s(?: been| now)?)(?:\s+(?:actually|really|honestly|officially|definitely|still))?\s+(?:my|our)\s+"
                           r"(?:[\w-]+\s+)?(?:[\w-]+\s+)?" + FAVOURITE_WORD, s, re.I)
        if before:
            value = clean_value(re.sub(r"^.*\b(?:and|but|so|ok|now|honestly|since|,)\s+", "", before.group("v"), flags=re.I))
            if value.lower() in ("it", "that", "this", "they", "it's", "that's") or not value:
                earlier = names_in(s[: before.end("v")])  # "just finished Piranesi and it's my new favourite"
                value = earlier[-1][1] if earlier else ""
            value = re.sub(r"^(?:i think|i guess|for the past \w+ or so|ok|okay)\s+", "", value, flags=re.I)
        if kind and value and value.lower() not in NOT_VALUES and not NO_VALUE.match(value):
            out.append(AttributeStatement(kind, value, adds=bool(re.search(r"\btwo|both|favourites\b", s, re.I))))
    # "I'm a X (at|in|on) ...", "as a X", "bumped up to X", "now I'm X of"
    for m in re.finditer(r"\b(?:i'm|i am|im|i work as|working as|as|promoted to|bumped up to|first (?:\w+ )?as|"
                         r"now i'm|i'm now|still)\s+(?:an?\s+|the\s+)?(?:(?:\w+\s+)?(?:only|new|lifelong|proud)\s+)?",
                         s, re.I):
        phrase = phrase_after(s, m.end(), 4)
        if not re.search(r"\b(?:not|no|never)\b", phrase, re.I) and re.search(r"\b(?:engineer|designer|developer|dev|manager|nurse|teacher|analyst|accountant|auditor|"
                     r"barista|supervisor|lead|principal|doctor|lawyer|consultant|scientist|photographer|writer|"
                     r"editor|chef|cook|driver|officer|assistant|director|architect|researcher|student|intern|"
                     r"founder|owner|illustrator|programmer|administrator|technician|clerk|pharmacist|therapist|"
                     r"coordinator|specialist|librarian|electrician|plumber|mechanic|paramedic|pilot|"
                     r"freelancer|freelance \w+|tutor|coach|translator|journalist|cashier|waiter|waitress|"
                     r"receptionist|programme manager)s?$", phrase, re.I):
            out.append(AttributeStatement("job_title", phrase.lower()))
            rest = s[m.end():]
            at = re.match(rf"\s*{re.escape(phrase)}\s+(?:\w+\s+){{0,4}}?(?:at|for|with)\s+(?:the\s+)?(?={NAMEISH})", rest, re.I)
            employer = names_in(rest[at.end():]) if at else []
            if employer and employer[0][0] == 0 and not by_value(employer[0][1]):
                out.append(AttributeStatement("employer", employer[0][1]))
        elif re.match(r"\w+ fan\b", phrase + " ", re.I) or re.search(r"\bfan\b", s[m.end():m.end() + 40], re.I):
            team = names_in(s[m.end():])
            if team:
                out.append(AttributeStatement("favourite_team", team[0][1]))
    # "my usual is an oat flat white", "my hobby is rock climbing", "boxing is my hobby": a phrase
    # named by a noun of a lower-case attribute
    for m in COPULA.finditer(s):
        noun = (m.group("noun") or m.group("noun2")).lower()
        value = phrase_after(s, m.start("v")) if m.group("v") else clean_value(m.group("v2") or "")
        kind = COPULA_NOUNS.get(noun.split()[-1])
        if kind == "coffee_order" and not re.search(rf"\b(?:{ATTRIBUTES['coffee_order'].cues}|tea|chai|mocha)\b", value, re.I):
            kind = None  # "my usual is the 7:40 train"
        if kind and value and value.lower() not in NOT_VALUES and len(value.split()) <= 4:
            out.append(AttributeStatement(kind, value))
    # "I take the Overground to work", "we ride the ferry into the office"
    for m in TAKE_TO_WORK.finditer(s):
        if clean_value(m.group("v")).lower() not in NOT_VALUES:
            out.append(AttributeStatement("commute", clean_value(m.group("v"))))
    # "I'm 34", "I turned 40", "34 years old"
    for m in re.finditer(r"(?<!like )\b(?:i'm|i am|im|i turned|turned|turning|i just turned)\s+(?:(?:\w+ly|now|just)\s+)?(?P<v>\d{1,3})\b(?!\s*(?:%|km|kg|min|"
                         r"minutes|hours|€|\$|euros))|\b(?P<w>\d{1,3}) (?:years old|yo)\b|"
                         r"^at (?P<at>\d{2,3}),? (?:i|i'm|i've)\b", s, re.I):
        out.append(AttributeStatement("age", m.group("v") or m.group("w") or m.group("at")))
    for m in EMAIL_RE.finditer(s):
        out.append(AttributeStatement("email", m.group()))
    if re.search(rf"\b(?:{ATTRIBUTES['phone_number'].cues})\b", s, re.I):  # not an order or a flight number
        out.extend(AttributeStatement("phone_number", m.group().strip()) for m in PHONE_RE.finditer(s)
                   if is_phone_number(m.group().strip()))
    return out


def attribute_statements(text: str) -> list[AttributeStatement]:
    """What a message says of its speaker's attributes, in order (the speaker speaks in the first person)."""
    out: list[AttributeStatement] = []
    previous = ""
    for sentence in SENTENCE.split(unquoted(text[:4000])):
        sentence = sentence.strip()
        if sentence.rstrip(" )\"'").endswith("?") and not re.search(r"[.!]", sentence):
            # a question states nothing, but a clause before it may: "my Skoda needs new tyres, what size?"
            asks = ASKS.search(sentence)
            sentence = sentence[: asks.start()] if asks else ""
            if QUESTION_WORD.match(sentence):
                continue
        if not sentence:
            continue
        out.extend(_read_sentence(sentence, previous))
        previous = sentence
    seen: set[tuple[str, str, bool]] = set()
    unique = []
    for st in out:
        key = (st.attribute, st.value.lower(), st.ending)
        if key not in seen:
            seen.add(key)
            unique.append(st)
    return unique


def _other_subject(sentence: str, at: int) -> bool:
    """Whether the words before ``at`` make the clause someone else's ("my brother just moved to")."""
    head = sentence[:at]
    other = list(OTHER_SUBJECT.finditer(head))
    if not other:
        return False
    mine = [m for m in SUBJECT_I.finditer(head) if m.start() > other[-1].end()]
    return not mine




def _corrected(sentence: str, m: re.Match[str], previous: str) -> str:
    """The value a correction puts in place of the one after "not": said just before ("KPMG, not
    Deloitte", "a Shiba Inu not a corgi"), just after ("not Gothenburg, Malmö"), or in the sentence
    before ("Atlético! not Real Madrid")."""
    before = re.split(r"[,;:!—–(]|\s-\s", sentence[: m.start()])
    chunk = SAYING.sub("", before[-1].strip() if before else "").strip()
    if not chunk and len(before) > 1:
        chunk = SAYING.sub("", before[-2].strip()).strip()
    if not chunk:
        after = sentence[m.end():].lstrip(" ,—–-")
        chunk = SAYING.sub("", phrase_after(after, 0, 5))
    if not chunk and previous:
        names = names_in(previous)
        chunk = names[-1][1] if names else ""
    chunk = clean_value(chunk)
    if not chunk or chunk.lower() in NOT_VALUES or len(chunk.split()) > 5:
        return ""
    return chunk


def _said_for_sure(sentence: str, st: AttributeStatement, doubt_at: int, hedge_at: int) -> bool:
    """A value said after a hedge or a visit ("we might move to X", "home from Kraków") is not
    the speaker's; an ending after a hedge neither. What comes before them stands ("my girlfriend
    Sofie and I want to ...")."""
    if not st.value:
        return hedge_at == len(sentence)
    at = sentence.lower().find(st.value.lower())
    if at > 0 and DENIED.search(sentence[max(0, at - 30):at]):
        return False  # "I don't live in Paris"
    if at > 0 and QUOTED.search(sentence[:at]):
        return False  # "I always say cappuccino by accident": a word said, not a value held
    # a doubt in an earlier clause ("since the trip to Peru, ceviche has become my favourite") stays there
    return at < 0 or at < doubt_at or bool(re.search(r"[,;]", sentence[doubt_at:at]))


def _ended_object(sentence: str, st: AttributeStatement) -> bool:
    """Whether a value is what an ending acts on ("sold the Civic", "left Utrecht", "no more
    trains", "gave up climbing"): the old value, which the ending closes, not a new one."""
    if not st.value or st.replaces:
        return False
    at = sentence.lower().find(st.value.lower())
    if at <= 0:
        return False
    return bool(re.search(rf"(?:{ENDING.pattern}|\binstead of)\s+(?:(?:the|my|our|a|an|his|her|with|from|of|on|to|up|oat)\s+){{0,2}}$",
                          sentence[max(0, at - 60):at], re.I))



def _kind(value: str) -> str:
    """The attribute a name's own words give away: "Mazda CX-5" a car, "Spanish" a language."""
    return by_value(value) or next((attr for _, attr, v in _closed_values(value) if v == value.lower()), "")


def _loose(sentence: str, cues: list[tuple[int, int, str]], names: list[tuple[int, str]], said: set[str],
           taken: set[str]) -> list[AttributeStatement]:
    """A name set beside a cue of an attribute the sentence states nothing else of: "the vet said
    Frida, our new kitten, is healthy" (apposition, in no frame the rules read); the speaker's,
    no place and not of another attribute's kind. Read loosely, it may only change a value
    already held (``decide``). A name merely near a cue is none: "my dog chewed my Nike shoes"."""
    out: list[AttributeStatement] = []
    if PAST.search(sentence):
        return out  # "Deloitte was my summer internship": what held, not what holds
    for c_start, c_end, attr in cues:
        if attr in said or attr in UNNAMED or attr in PLACES or ATTRIBUTES[attr].multi:
            continue  # places are named in passing too often (trips, news) to be read loosely
        beside = [value for pos, value in names
                  if APPOSED.fullmatch(sentence[pos + len(value):c_start]) and value.lower() not in taken
                  and value.lower() not in NOT_VALUES and _kind(value) in ("", attr) and not _other_subject(sentence, pos)
                  and not re.fullmatch(ATTRIBUTES[attr].cues, value, re.I)  # "my GP"
                  and not PLACE_BEFORE.search(sentence[max(0, pos - 12):pos])]
        if beside:
            said.add(attr)
            taken.add(beside[-1].lower())
            # "Frida, our new kitten": the speaker's, said to be new, but not that it replaces one held
            # (a mention: it stands beside the held value, ``ingest.attributes``); else loose, changing nothing
            ours = re.search(r"\b(?:my|our)\s+(?:\w+\s+)?new\b", sentence[max(0, c_start - 20):c_start], re.I)
            out.append(AttributeStatement(attr, beside[-1], loose=not ours, mention=bool(ours)))
    return out


def _read_sentence(sentence: str, previous: str = "") -> list[AttributeStatement]:
    hedge_at = min((m.start() for m in HEDGE.finditer(sentence)), default=len(sentence))
    visit_at = min((m.start() for m in VISIT.finditer(sentence)), default=len(sentence))
    hedged = hedge_at == 0 or bool(UNSURE.search(sentence)) or bool(UNREALISED.search(sentence))
    # "back from Naples, I drank espresso every day": a sentence that opens on a visit tells of the
    # visit, unless it says something changed ("since the trip to Peru, ceviche has become ...")
    hedged = hedged or (visit_at <= 3 and not re.search(r"\b(?:become|became|now|switched|ever since)\b", sentence, re.I))
    visit = False
    adds = bool(ADD.search(sentence))
    first = bool(FIRST_PERSON.search(sentence))
    corrections = [clean_value(m.group("old")) for m in NOT_X.finditer(sentence)]
    out: list[AttributeStatement] = []
    if hedged:
        return out
    for st in _frames(sentence):
        if not _other_subject(sentence, sentence.lower().find(st.value.lower()) if st.value else len(sentence)):
            out.append(AttributeStatement(st.attribute, st.value, adds=st.adds or adds))
    cues = _cue_positions(sentence)
    names = names_in(sentence)
    closed = _closed_values(sentence)
    taken = {st.value.lower() for st in out}
    first = first or bool(re.search(r"\b(?:the|a) new\b", sentence, re.I)) or bool(IMPLIED_I.match(sentence))
    if first and not visit:
        for c_start, c_end, attr in cues:
            if attr in UNNAMED:
                continue  # their values are no names
            pick = next(((pos, v) for pos, v in names if pos >= c_end and not any(v.lower() in t for t in taken)
                         and GAP.fullmatch(sentence[c_end:pos])), None)
            if pick is None and attr in NAMED_BEFORE:  # "our Rogers internet", "we have Orange fibre"
                pick = next(((pos, v) for pos, v in names if pos + len(v) <= c_start and not sentence[pos + len(v):
                             c_start].strip() and not any(v.lower() in t for t in taken)), None)  # fmt: skip
            if pick is None:
                continue
            pos, value = pick
            if attr not in PLACES and re.search(r"\bin\b", sentence[c_end:pos], re.I):
                continue  # "I work in San Francisco", "my GP here in Sevilla": a place, not the value
            if RELATION_CUE.fullmatch(sentence[c_start:c_end]):
                # "my girlfriend Ingrid", "our cat Pixel": the speaker's, unless another's ("her boyfriend Joris")
                owner = sentence[max(0, c_start - 30):c_start]
                if (not OWNER.search(owner)
                        or re.search(r"\b(?:her|his|their|your|\w+'s)\s+(?:\w+\s+)?$", owner, re.I)
                        or _other_subject(sentence, c_start)):
                    continue
            elif _other_subject(sentence, c_start):
                continue
            taken.add(value.lower())
            # "Dr. Seuss was my favourite": a title alone says no doctor of the speaker's
            titled = attr == "doctor" and re.fullmatch(r"dr\.?", sentence[c_start:c_end], re.I) is not None
            attr = by_value(value) or attr
            out.append(AttributeStatement(attr, value, adds=adds, loose=titled and not doctor_named(sentence, cues)))
        for pos, value in names:
            owned = OWNED.search(sentence[max(0, pos - 30):pos])
            if value.lower() in taken or (_other_subject(sentence, pos) and not owned):
                continue
            attr = by_value(value)
            lead = sentence[max(0, pos - 40):pos]
            # a name its kind gives away is the speaker's when the words say so ("my Kia", "bought a
            # Mazda", "I bank with Monzo"); else it is named in passing ("the BMW next door keeps
            # parking across my driveway"): a loose reading, which changes nothing (``ingest.attributes``)
            # a name that says its own kind ("Universidade de São Paulo", "John Reed Fitness") is no
            # brand named in passing: the speaker's in a sentence of theirs
            loose = not (owned or SPEAKER_HAS.search(lead) or AT_FRAME.search(lead) or IN_FRAME.search(lead)
                         or (attr and not brand_attribute(value)))
            if not attr and re.search(r"\bDr\.?\s*$", lead, re.I):
                attr = "doctor"  # "Dr. Moreau did my cleaning"; "Dr. Seuss was my favourite" is no doctor
                loose = loose and not doctor_named(sentence, cues)
            if not attr and IN_FRAME.search(lead):
                attr, loose = "home_city", False
            if not attr and AT_FRAME.search(lead):
                attr, loose = "?", False  # "now I'm at Mercari": the attribute of the value it follows (``ingest.attributes``)
            if attr:
                taken.add(value.lower())
                mention = bool(owned) and not loose and not CHANGE.search(sentence)
                if loose and MOVED_ON.search(sentence):
                    # "the advisor at Nordea, the bank I moved everything to": the speaker's, by a change
                    # the sentence tells of; beside the held value, which may have changed
                    loose, mention = False, True
                out.append(AttributeStatement(attr, value, adds=adds, loose=loose, mention=mention))
        if not FUTURE.search(sentence):
            out.extend(_loose(sentence, cues, names, {st.attribute for st in out} | {"?"}, taken))
    if first or corrections:
        for pos, attr, value in closed:
            if value in taken or visit or _other_subject(sentence, pos):
                continue
            if not any(c[2] == attr for c in cues) and attr != "diet":
                continue
            if value in (c.lower() for c in corrections):
                continue
            taken.add(value)
            out.append(AttributeStatement(attr, value, adds=adds))
    fix = CORRECTION.match(sentence)
    if fix and not NOT_X.search(sentence) and not out:  # "sorry no, macchiato!", "actually no, dark brown."
        value = clean_value(fix.group("v"))
        typed = next((attr for pos, attr, v in closed if v == value.lower()), "") or by_value(value)
        # only a value whose own words say its attribute: "No, Paris!" could correct anything
        if value and value.lower() not in NOT_VALUES and typed:
            out.append(AttributeStatement(typed, value))
    if GONE.search(sentence):  # "French is on hold", "Hiroshi is ancient history": what it names ends
        out.append(AttributeStatement("", "", ending=True))
    # "no more dye, no more hair lol": an ending said first speaks of the speaker
    ended = bool(ENDING.search(sentence)) and (first or bool(ENDING.match(sentence)))
    if ended and not _other_subject(sentence, ENDING.search(sentence).start()):
        end = ENDING.search(sentence)
        # the attribute the ending is about: a cue near it ("sold the car", "phone got stolen")
        about = {c[2] for c in cues if -40 < c[0] - end.start() < 30}
        after = re.match(r"\s+(?:(?:the|my|our|a|an|any)\s+)?", sentence[end.end():])
        at = end.end() + (after.end() if after else 0)
        what = [attr for pos, attr, _ in closed if pos == at]  # "no more trains": the commute's value ends
        # the head of the phrase it ends: "no commute at all", "don't have a work address anymore"
        phrase = re.match(r"[\w' -]*?(?=[,.;!?]|\s(?:and|but|so|now|anymore|any more)\b|$)", sentence[at:])
        stop = at + (phrase.end() if phrase else 0)
        what = what or [attr for pos, _, attr in cues if end.start() < pos < end.end() or at <= pos < min(stop, at + 25)][-1:]
        if what:
            about = set(what[:1])
        for attr in about or {""}:
            out.append(AttributeStatement(attr, "", ending=True))
    out = [st for st in out if _said_for_sure(sentence, st, min(hedge_at, visit_at), hedge_at)
           and not _ended_object(sentence, st)]
    for m in NOT_X.finditer(sentence):
        old = clean_value(m.group("old"))
        new = _corrected(sentence, m, previous)
        if old and new and old.lower() not in NOT_VALUES and len(old.split()) <= 6:
            out = [st for st in out if st.value.lower() not in (old.lower(), new.lower())]
            out.append(AttributeStatement(by_value(new), new, replaces=old))
    for m in INSTEAD.finditer(sentence):  # "Arabic classes instead of Spanish": a change, the old one named
        new = next((st for st in out if st.value and sentence.lower().find(st.value.lower()) < m.start()), None)
        old = phrase_after(sentence, m.end(), 4)
        if new is not None and old and old.lower() not in NOT_VALUES:
            out = [st for st in out if st is new or st.value.lower() != old.lower()]
            out[out.index(new)] = AttributeStatement(new.attribute, new.value, adds=new.adds, closes=old)
    gone = [name for pos, name in names if ENDED_NAME.search(sentence[max(0, pos - 40):pos])]
    if gone:
        out = [st for st in out if st.value not in gone or st.replaces]  # "replaced the ThinkPad with ..."  # "I cancelled McFit and joined John Reed Fitness": McFit closes, known as a value or not
        out = [AttributeStatement(st.attribute, st.value, adds=st.adds, replaces=st.replaces, closes=gone[0])
               if st.value and not st.ending and not st.replaces and not st.closes and st.value not in gone else st
               for st in out]
        if any(st.closes for st in out):  # the ending was about the named value, not a cue near it
            out = [st for st in out if not (st.ending and not st.value)]
    for m in FROM_TO.finditer(sentence):
        old, new = clean_value(m.group("old")), phrase_after(sentence, m.start("new"), 5)
        if old and new and old.lower() not in NOT_VALUES:
            out = [st for st in out if st.value.lower() not in (old.lower(), new.lower())]
            out.append(AttributeStatement(by_value(new), new, replaces=old))
    return out
