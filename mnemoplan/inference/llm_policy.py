"""The LLM client's rules, apart from its plumbing: which failures are retried and after how
long, what a reply must be to count, and what each failure is called and advised.

``llm.LLMClient`` applies them to every provider alike (its docstring says why there is one
retry policy, tenacity's, and not each SDK's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from tenacity import RetryCallState, wait_exponential

from mnemoplan.inference.llm_json import describe, extract_json
from mnemoplan.inference.llm_wire import OutputMode, ProviderError, WireReply

RETRYABLE_STATUS = frozenset({429}) | frozenset(range(500, 600))
BACKOFF_S = 0.25
MAX_BACKOFF_S = 2.0
MAX_RETRY_AFTER_S = 10.0  # a server that asks for a longer wait is not retried within the call
# Words of a 400/422 that rejects the structured-output parameter rather than the request.
FORMAT_WORDS = ("response_format", "json_schema", "json_object", "output_config", "output_format", "schema",
                "format", "grammar", "guided")  # fmt: skip

HINTS = {
    "timeout": "The LLM did not answer within the time budget; retry later or raise MNEMOPLAN_LLM_TIMEOUT_S.",
    "connection": "The LLM endpoint could not be reached; check that the server runs and MNEMOPLAN_LLM_BASE_URL.",
    "malformed": "The model's replies did not match what was asked; a larger model, or raising max_tokens if it "
    "was cut off, helps.",
    "not_api": "The endpoint did not answer as the {api} does; check that the base URL points at the API itself "
    "(an OpenAI-compatible server's usually ends in /v1), not at a proxy's or a gateway's page.",
    "deadline": "The caller's time budget ran out before the LLM answered; raise it, or the LLM is too slow.",
    "auth": "The API key was refused; check MNEMOPLAN_LLM_API_KEY (or ANTHROPIC_API_KEY).",
    "model": "The server knows no such model or path; check MNEMOPLAN_LLM_MODEL (Ollama: `ollama pull` it "
    "first) and MNEMOPLAN_LLM_BASE_URL.",
    "transient": "The LLM API is rate limiting or failing on its side; retry later.",
    "rejected": "The request was rejected; check the model name and the LLM settings.",
    "capped": "A cap on LLM requests was reached, so the offline path answered; raise the cap for more.",
}
API_NAMES = {"anthropic": "Messages API", "openai": "chat-completions API"}


class CallFailed(Exception):
    """Why a call failed (``kind``: a key of ``HINTS``), and how many requests its last step sent."""

    def __init__(self, cause: str, attempts: int, kind: str) -> None:
        super().__init__(cause)
        self.cause, self.attempts, self.kind = cause, attempts, kind


def failure(err: ProviderError, sent: int, timeout: float, full_timeout: float) -> CallFailed:
    """A request's failure, after the retries, in words (never the API key: the caller redacts)."""
    if err.kind == "timeout":
        cut = " (the caller's deadline)" if timeout < full_timeout else ""
        return CallFailed(f"timeout after {timeout:.3g} s{cut}", sent, "timeout")
    if err.kind == "status":
        cause = f"HTTP {err.status}" + (f" ({err.detail})" if err.detail else "")
        if err.status == 429 and err.retry_after is not None and err.retry_after > MAX_RETRY_AFTER_S:
            cause += f", retry after {err.retry_after:.0f} s"
        kind = {401: "auth", 403: "auth", 404: "model"}.get(err.status or 0, "rejected")
        kind = "transient" if err.status in RETRYABLE_STATUS else kind
        return CallFailed(f"{cause} after {sent} request(s)", sent, kind)
    if err.kind == "connection":
        return CallFailed(f"connection error after {sent} request(s)", sent, "connection")
    if err.kind == "not_api":
        return CallFailed(err.detail or "the answer is not the API's", sent, "not_api")
    return CallFailed(f"client error {err.detail}", sent, "transient")


def read_reply(reply: WireReply, schema: type[BaseModel] | None) -> tuple[str, Any]:
    """("ok", (data, value)) for a usable reply, else (its outcome, the problem in words)."""
    if reply.refusal and not reply.text.strip():
        return "refusal", f"the model refused: {reply.refusal}"
    if reply.truncated:  # what parses of a cut-off object is a fragment of it, not the answer
        return "truncated", "the reply was cut off at max_tokens"
    if not reply.text.strip():
        return "empty", "the reply was empty"
    try:
        data = extract_json(reply.text)
    except ValueError as err:
        return "not_json", str(err)
    if schema is None:
        return "ok", (data, None)
    try:
        return "ok", (data, schema.model_validate(data))
    except ValidationError as err:
        return "schema", f"it does not match the schema: {describe(err)}"


def outcome(err: ProviderError) -> str:
    """A failed request's outcome in the call record: ``http_<status>`` or the failure's kind."""
    return f"http_{err.status}" if err.kind == "status" else err.kind


def rejects_format(err: ProviderError, mode: OutputMode) -> bool:
    """A 400/422 that names the structured-output parameter, while one was sent."""
    detail = err.detail.lower()
    return mode != "prompt" and err.status in (400, 422) and any(word in detail for word in FORMAT_WORDS)


def retryable(exc: BaseException) -> bool:
    """Worth another request: rate limiting (unless asked to wait long), a failure on the API's
    side, or a connection that failed (a timeout is not: the caller's time budget is spent)."""
    if not isinstance(exc, ProviderError):
        return False
    if exc.kind == "status":
        waits_long = exc.retry_after is not None and exc.retry_after > MAX_RETRY_AFTER_S
        return exc.status in RETRYABLE_STATUS and not waits_long
    return exc.kind == "connection"


_exponential = wait_exponential(multiplier=BACKOFF_S, max=MAX_BACKOFF_S)


def backoff(state: RetryCallState) -> float:
    """Seconds before the next request: the server's Retry-After, else exponential."""
    failed = state.outcome.exception() if state.outcome is not None else None
    if isinstance(failed, ProviderError) and failed.retry_after is not None:
        return min(failed.retry_after, MAX_RETRY_AFTER_S)
    return _exponential(state)


def before_deadline(deadline: float | None) -> Callable[[RetryCallState], bool]:
    """A tenacity stop: no retry whose backoff would end past the caller's deadline."""

    def passed(state: RetryCallState) -> bool:
        return deadline is not None and time.monotonic() + state.upcoming_sleep >= deadline

    return passed
