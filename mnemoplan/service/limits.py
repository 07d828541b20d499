"""The input limits the service enforces, and how the size of JSON input is counted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mnemoplan.errors import InvalidInput
from mnemoplan.model import check_text


def json_chars(value: Any) -> int:
    """Characters of ``value`` as stored JSON (not counting escapes of non-ASCII text)."""
    return len(json.dumps(value, default=str, ensure_ascii=False))


@dataclass(frozen=True)
class Limits:
    """Input limits the service enforces (from Settings)."""

    max_text_chars: int = 32_000
    max_metadata_chars: int = 16_000  # as JSON
    max_query_chars: int = 4_000
    max_messages_per_call: int = 1_000
    max_forget_ids: int = 10_000
    recall_default_limit: int = 10
    recall_max_limit: int = 50
    deep_max_results: int = 30
    max_history: int = 50  # turns of the conversation a recall may bring

    def check_history(self, history: list[str] | None) -> None:
        """A recall's ``history``: at most ``max_history`` texts, each within ``max_text_chars``.

        Raises:
            InvalidInput: it is not.
        """
        if history and (len(history) > self.max_history or any(not isinstance(h, str) for h in history)):
            raise InvalidInput(f"history takes at most {self.max_history} strings (the last turns of the conversation).")
        for i, turn in enumerate(history or []):
            check_text(turn, what=f"history[{i}]", max_chars=self.max_text_chars,
                       hint="Send the turn shortened, or raise MNEMOPLAN_MAX_TEXT_CHARS.")
