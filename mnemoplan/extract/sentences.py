"""Sentence splitting for embeddings: a message's vector is the mean of its sentences' vectors.

On LoCoMo that vector finds the right turn far more often than an embedding of the whole
turn, at the same cost: the model runs over the same tokens (bench/README.md, "Figures
behind the code's comments").
"""

from __future__ import annotations

import re

# A sentence ends at . ! ? (or …) followed by space and a capital, a quote or a bracket;
# an attached image caption is its own sentence; " | " separates the points of a summary.
_BOUNDARY = re.compile(r"(?<=[.!?…])\s+(?=[A-Z0-9\"'“‘(\[])|\s+(?=\[image:)|\s+\|\s+")
_MAX_SENTENCES = 64


def split_sentences(text: str, *, min_words: int = 1) -> list[str]:
    """The sentences of a text, stripped, never empty (a text without punctuation is one sentence).

    A sentence shorter than ``min_words`` words joins the next one ("Hey Mel! Good to see
    you!" is one unit): fewer, fuller units embed faster and retrieve as well (measured on
    LoCoMo: bench/README.md). Very long texts keep their first
    sentences separate and fold the rest into the last one, so one record never costs more
    than ``_MAX_SENTENCES`` embeddings.
    """
    parts = [p.strip() for p in _BOUNDARY.split(text) if p and p.strip()]
    if not parts:
        return [text.strip() or text]
    if min_words > 1:
        merged: list[str] = []
        pending = ""
        for part in parts:
            pending = f"{pending} {part}" if pending else part
            if len(pending.split()) >= min_words:
                merged.append(pending)
                pending = ""
        if pending:
            if merged:
                merged[-1] = f"{merged[-1]} {pending}"
            else:
                merged.append(pending)
        parts = merged
    if len(parts) > _MAX_SENTENCES:
        parts = parts[: _MAX_SENTENCES - 1] + [" ".join(parts[_MAX_SENTENCES - 1 :])]
    return parts
