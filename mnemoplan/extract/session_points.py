"""The key points of a session: which sentences are worth reading, how each scores, which are kept.

Greetings, small talk, questions and very short sentences are left out; the rest are scored by
their words' weights, with bonuses for names and times, and picked greedily with redundancy
control and room for every speaker.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from mnemoplan.extract.session_text import Sentence, is_alias

_QUESTION = re.compile(r"\?\W*$")
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
_FIRST_PERSON = frozenset("i i'm i've i'd i'll my me we we're we've our us".split())
_SECOND_PERSON = frozenset("you your you're you've you'd yours".split())
_MAX_SENTENCE_CHARS = 240
_REDUNDANCY = 0.5


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 1, 0)]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip(" ,;:-") + "…"


def _entry(s: Sentence) -> str:
    text = _INTERJECTION.sub("", s.text).strip() or s.text
    text = _truncate(text[0].upper() + text[1:], _MAX_SENTENCE_CHARS)
    return f"{s.speaker}: {text}" if s.speaker else text


def is_candidate(s: Sentence, strict: bool) -> bool:
    """Whether a sentence may be a key point; ``strict`` also leaves out questions and small talk."""
    if not strict or not s.stems:
        return bool(s.stems)
    if _QUESTION.search(s.text) or _SMALL_TALK.match(_INTERJECTION.sub("", s.text)):
        return False
    # Over 80 words is a paste or a run-on (split_sentences folds a long text's tail into
    # one sentence), not a point worth reading.
    n_words = sum(1 for t in s.tokens if t.stem)
    return 5 <= n_words <= 80 and len(s.stems) >= 3


def score(
    s: Sentence,
    weights: dict[str, float],
    participant_keys: list[str],
    mentioned: tuple[tuple[str, ...], bool],
) -> float:
    """How much ``s`` tells of the session; ``mentioned``: the names in it, and whether it has a time."""
    base = sum(weights[w] for w in s.stems) / math.sqrt(max(len(s.stems), 3))
    words = [t.raw.lower().replace("’", "'") for t in s.tokens if t.stem]
    if len(words) > 40:  # long sentences hold many words but dilute an overview
        base *= 40 / len(words)
    found, has_time = mentioned
    names = [k for k in found if not is_alias(k, participant_keys)]
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


def select(
    candidates: list[Sentence], *, max_sentences: int, per_turn: int, budget: int
) -> list[tuple[Sentence, str]]:
    """The best sentences that fit ``budget`` characters, with their text as shown, in order."""
    ranked = sorted(candidates, key=lambda s: (-s.score, s.turn, s.position))
    chosen: list[tuple[Sentence, str]] = []
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
