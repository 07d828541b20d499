"""What each LLM request cost, and the caps on how many may be sent.

Every HTTP request the client sends (a retry, a repair, a format fallback each count) becomes
one ``CallRecord``: provider, model, purpose, the tool it served, tokens in and out, latency
and outcome; a request a cap stopped is recorded unsent. A ``CallRecorder`` keeps them
(``service.llm_log`` writes them to the data directory, for ``mnemoplan stats``).

Caps count requests too, reserved before sending, so they hold exactly under concurrency:
``DailyCap`` for the process, and an ``LLMScope`` per tool call (a remember's extraction, a
deep search, a recall's rerank). A scope is set with ``llm_scope`` around the work and read by
the client through a context variable, so the roles in between (planner, evaluator, expander,
reranker) need no extra argument; worker threads that send on a caller's behalf run in a copy
of the caller's context (``contextvars.copy_context``), which shares the scope object.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class CallRecord:
    """One request to an LLM (or one a cap stopped).

    Attributes:
        ts: When it was sent, ISO 8601 UTC.
        provider: ``anthropic`` or ``openai``.
        model: The model asked.
        purpose: The role: ``extract``, ``plan``, ``replan``, ``evaluate``, ``expand``, ``rerank``.
        tool: The tool it served: ``remember``, ``deep_memory_search``, ``recall`` ("" outside one).
        outcome: ``ok``, a bad reply (``not_json``, ``schema``, ``truncated``, ``empty``,
            ``refusal``), a failure (``http_<status>``, ``timeout``, ``connection``, ``not_api``,
            ``client``, ``format_rejected``), or ``capped`` (not sent).
        input_tokens: Input tokens billed.
        output_tokens: Output tokens billed.
        latency_ms: Time from sending to the answer or failure.
        cost_usd: Estimated cost of the tokens, at the client's price for the model.
        sent: False for a request a cap stopped.
    """

    ts: str
    provider: str
    model: str
    purpose: str
    tool: str
    outcome: str
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: float = 0.0
    cost_usd: float = 0.0
    sent: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The record as JSON-ready values."""
        return asdict(self)


class CallRecorder(Protocol):
    """Keeps call records."""

    def record(self, call: CallRecord) -> None:
        """Keep one record; must not raise."""
        ...


@dataclass
class MemoryRecorder:
    """Call records in a list (tests, and a data directory that cannot be written)."""

    calls: list[CallRecord] = field(default_factory=list)

    def record(self, call: CallRecord) -> None:
        """Keep one record."""
        self.calls.append(call)


def today() -> str:
    """The UTC day, as the call records and the daily cap count it."""
    return datetime.now(UTC).date().isoformat()


class DailyCap:
    """At most ``limit`` requests per UTC day (0: no cap), for every client that shares it.

    Args:
        limit: Requests a day; 0 for none.
        sent_today: Requests already sent today (read from the call log at start).
    """

    def __init__(self, limit: int, sent_today: int = 0) -> None:
        self.limit = limit
        self._day = today()
        self._sent = sent_today
        self._lock = threading.Lock()

    def reserve(self) -> bool:
        """Count one request; False (and nothing counted) once the day's cap is reached."""
        with self._lock:
            if self._day != today():
                self._day, self._sent = today(), 0
            if self.limit and self._sent >= self.limit:
                return False
            self._sent += 1
            return True

    def release(self) -> None:
        """Give back a reservation that was not sent."""
        with self._lock:
            self._sent = max(0, self._sent - 1)


class LLMScope:
    """The LLM requests one tool call may send.

    Args:
        tool: The tool, for the call records.
        max_calls: Requests it may send; 0 for no cap.
        setting: The environment variable that sets ``max_calls``, for the warning.
    """

    def __init__(self, tool: str, max_calls: int = 0, setting: str = "") -> None:
        self.tool = tool
        self.max_calls = max_calls
        self.setting = setting
        self.sent = 0
        self.capped = 0
        self._lock = threading.Lock()

    def reserve(self) -> bool:
        """Count one request; False (and one more capped) once the cap is reached."""
        with self._lock:
            if self.max_calls and self.sent >= self.max_calls:
                self.capped += 1
                return False
            self.sent += 1
            return True

    def release(self) -> None:
        """Give back a reservation that was not sent."""
        with self._lock:
            self.sent = max(0, self.sent - 1)


_SCOPE: contextvars.ContextVar[LLMScope | None] = contextvars.ContextVar("mnemoplan_llm_scope", default=None)


def current_scope() -> LLMScope | None:
    """The scope requests sent now belong to, if any."""
    return _SCOPE.get()


@contextmanager
def llm_scope(tool: str, max_calls: int = 0, setting: str = "") -> Iterator[LLMScope]:
    """Requests sent inside belong to a new scope of ``tool`` (see the module's doc)."""
    scope = LLMScope(tool, max_calls, setting)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)
