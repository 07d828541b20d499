"""What an answer reads in a person's message against a value memory holds (``planner.slots``):
whether the message names another value of the attribute as the person's. A reason to show the
message first and to say the held value may have changed; never to close a stored value.
"""

from __future__ import annotations

import re

from mnemoplan.extract.attribute_kinds import ATTRIBUTES, mentions
from mnemoplan.extract.attribute_patterns import (
    AT_FRAME,
    COMPANION,
    FUTURE,
    HEDGE,
    OTHER_FAVOURITE,
    OWNED,
    QUESTION_WORD,
    SENTENCE,
    SPEAKER_HAS,
    UNNAMED,
    UNREALISED,
    UNSURE,
    VISIT,
    unquoted,
)
from mnemoplan.extract.attribute_words import NOT_VALUES, names_in
from mnemoplan.extract.attributes import _closed_values, _kind, _other_subject

__all__ = ["names_another_value"]


def names_another_value(text: str, attribute: str, held: str) -> bool:
    """Whether a person's message names a value of an attribute other than ``held`` as theirs: in a
    plain sentence of theirs (no question, quotation, hedge, plan, visit, doubt or other person's
    clause, and not naming ``held``), a value whose own words say it is of the attribute (a word
    of its closed class, "platinum blonde"; a name of its kind, "a Kia EV6", "Monzo") and that the
    words give to the speaker ("my Kia", "bought a Mazda", "the new Kia"). Recall uses it for the
    messages an answer returns (``planner.slots``): a reason to show a message first, and to say
    the held value may have changed; never to close a stored value."""
    spec = ATTRIBUTES.get(attribute)
    if spec is None or spec.multi or not held or mentions(text, held):
        return False
    for sentence in SENTENCE.split(unquoted(text[:4000])):
        sentence = sentence.strip()
        if (not sentence or sentence.rstrip(" )\"'").endswith("?") or QUESTION_WORD.match(sentence)
                or any(p.search(sentence) for p in (HEDGE, UNSURE, UNREALISED, FUTURE, VISIT, OTHER_FAVOURITE))):
            continue
        if any(attr == attribute and not _other_subject(sentence, at) for at, attr, _ in _closed_values(sentence)):
            return True
        if attribute in UNNAMED:
            continue
        for pos, value in names_in(sentence):
            # only a name whose own words say it is of the attribute ("a Kia EV6", "Monzo"): any other
            # name near a cue may be company, a place or a thing ("walked the dog with Emma", "my
            # dog chewed my Nike shoes"), and a wrong lead outdates a true value
            lead = sentence[max(0, pos - 40):pos]
            # and the speaker's, as the words say ("my Kia", "bought a Mazda", "the new Kia"): a name
            # of its kind said of something else ("the BMW next door", "HSBC is sponsoring the race")
            # would put a wrong answer first
            theirs = (OWNED.search(lead) or SPEAKER_HAS.search(lead) or AT_FRAME.search(lead)
                      or re.search(r"\bnew\s+$", lead, re.I))
            if (value.lower() not in NOT_VALUES and _kind(value) == attribute and not _other_subject(sentence, pos)
                    and not COMPANION.search(sentence[max(0, pos - 12):pos]) and theirs):
                return True
    return False
