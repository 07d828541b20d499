"""JSON out of a model's replies, and schema failures put back into words for it.

Shared by every LLM caller: the write path's extractor and the planner's roles alike.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError

JSON_ONLY = "Reply with one JSON object only: no prose, no code fences."

_FENCE = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def extract_json(text: str) -> dict[str, Any] | list[Any]:
    """Find and parse the first JSON object or array in a model's reply.

    Tolerates code fences (```json ... ```) and prose before or after the value, since
    models add both despite instructions.

    Args:
        text: The reply text.

    Returns:
        The parsed object or array.

    Raises:
        ValueError: If the text holds no parseable JSON object or array.
    """
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        stripped = candidate.strip()
        try:
            value = json.loads(stripped)
        except ValueError:
            pass
        else:
            if isinstance(value, dict | list):
                return value
        # Prose around the value: try each opening bracket until one decodes.
        for match in re.finditer(r"[{\[]", stripped):
            try:
                value, _ = decoder.raw_decode(stripped, match.start())
            except ValueError:
                continue
            if isinstance(value, dict | list):
                return value
    raise ValueError("no JSON object or array found in the reply")


def describe(err: ValidationError) -> str:
    """A validation error in a few words: the first four problems, each ``field.path: message``.

    Args:
        err: What pydantic said of a reply.

    Returns:
        One line, short enough for a log, a warning or a repair prompt.
    """
    problems = [f"{'.'.join(str(p) for p in e['loc']) or 'reply'}: {e['msg']}" for e in err.errors()[:4]]
    more = err.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")
