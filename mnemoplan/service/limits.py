"""The input limits the service enforces, and how the size of JSON input is counted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


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
