"""What the LLM client and its provider transports say to each other, with no SDK in sight.

A transport (``llm_anthropic``, ``llm_openai``) owns one SDK: it turns a request into that
API's call and its answer, or its failure, into the plain values below. Everything else
(retries, deadlines, repair, validation, caps, the call record) is the client's, the same for
every provider (``llm.LLMClient``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

# How a reply is asked to be JSON: the server's JSON-schema mode, its JSON mode, or only the
# schema in the prompt (always there too: a server may ignore the first two).
OutputMode = Literal["json_schema", "json_object", "prompt"]

# Why no reply came: the request timed out, could not connect, got an HTTP error status, got
# an answer that is not this API's (a proxy's page, a cut body), or the SDK failed otherwise.
FailureKind = Literal["timeout", "connection", "status", "not_api", "client"]


@dataclass(frozen=True)
class WireReply:
    """One answer of the API, reduced to what the client uses.

    Attributes:
        text: The reply's text ("" for none).
        truncated: The model stopped at ``max_tokens``.
        refusal: The model's refusal, where the API reports one apart from the text.
        input_tokens: Input tokens the API billed.
        output_tokens: Output tokens the API billed.
    """

    text: str
    truncated: bool = False
    refusal: str = ""
    input_tokens: int = 0
    output_tokens: int = 0


class ProviderError(Exception):
    """A request that got no reply, in provider-neutral terms.

    Attributes:
        kind: What failed (see ``FailureKind``).
        status: The HTTP status, for ``status``.
        retry_after: Seconds the server asked to wait (``Retry-After``), when it said.
        detail: The API's own words (error type and message), short; never a header or key.
    """

    def __init__(self, kind: FailureKind, *, status: int | None = None, retry_after: float | None = None,
                 detail: str = "") -> None:  # fmt: skip
        super().__init__(f"{kind} {status or ''} {detail}".strip())
        self.kind = kind
        self.status = status
        self.retry_after = retry_after
        self.detail = detail


class Transport(Protocol):
    """One provider's API behind one SDK client."""

    provider: str

    def modes(self, schema: dict[str, Any] | None) -> list[OutputMode]:
        """The structured-output modes this API offers for a schema (or for none), best first."""
        ...

    def send(
        self, *, model: str, system: str, messages: list[dict[str, str]], max_tokens: int, timeout: float,
        mode: OutputMode, schema: dict[str, Any] | None, schema_name: str,
    ) -> WireReply:  # fmt: skip
        """Send one request; no retry of its own.

        Raises:
            ProviderError: When no reply came.
        """
        ...

    def close(self) -> None:
        """Release the connection pool."""
        ...


def non_negative_int(value: object) -> int:
    """A token count as reported, or 0 when the API sent none or nonsense."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def retry_after_s(headers: Any) -> float | None:
    """Seconds of a ``retry-after-ms`` or ``retry-after`` header (an HTTP date is not read)."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            return max(float(raw) / divisor, 0.0)
        except (TypeError, ValueError):
            continue
    return None


def short(text: object, limit: int = 200) -> str:
    """An API's message cut to a log line."""
    return " ".join(str(text).split())[:limit]
