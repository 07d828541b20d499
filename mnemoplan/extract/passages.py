"""Passages of a long message: the stretches a search can match and show on their own.

An assistant's reply of a few thousand characters covers several things; matched as one
document, a paragraph about the thing asked is diluted by the rest (its vector is the mean
of every sentence; BM25 normalises by the whole length). Split at paragraph breaks, and
within an over-long paragraph at sentence ends, into passages of about ``target`` characters.
"""

from __future__ import annotations

import re

from mnemoplan.extract.sentences import split_sentences

PASSAGE_MIN_CHARS = 1_500  # shorter messages are searched whole
PASSAGE_TARGET_CHARS = 600

_BREAK_RE = re.compile(r"\n\s*\n|\n(?=\s*(?:[-*•]|\d+[.)]|#{1,6})\s)")  # blank line, or a list item or heading


def split_passages(text: str, target: int = PASSAGE_TARGET_CHARS, min_chars: int = PASSAGE_MIN_CHARS) -> list[str]:
    """The passages of a message of at least ``min_chars`` characters (none for a shorter one).

    Paragraphs are kept together and joined while the passage stays under ``target``; a
    paragraph longer than twice ``target`` is cut at sentence ends. Every passage is text of
    the message, in order; together they hold all of its words.
    """
    if len(text) < min_chars:
        return []
    pieces: list[str] = []
    for para in (p.strip() for p in _BREAK_RE.split(text)):
        if not para:
            continue
        if len(para) <= 2 * target:
            pieces.append(para)
            continue
        sentences = split_sentences(para, min_words=1) or [para]
        pieces.extend(sentences)
    out: list[str] = []
    current = ""
    for piece in pieces:
        if current and len(current) + len(piece) + 1 > target:
            out.append(current)
            current = piece
        else:
            current = f"{current}\n{piece}" if current else piece
    if current:
        if out and len(current) < target // 4:  # a short tail joins the passage before it
            out[-1] = f"{out[-1]}\n{current}"
        else:
            out.append(current)
    return out if len(out) > 1 else []
