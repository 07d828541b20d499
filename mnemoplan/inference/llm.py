"""The one module that talks to the LLM: JSON-returning Messages API calls with cost accounting.

Callers (planners, rerankers, evaluators) get parsed JSON in an ``LLMReply`` or an ``LLMError``,
never the SDK or its exceptions: an endpoint that answers 200 with something that is not a
Messages API reply (a proxy's HTML page, a truncated body) is an ``LLMError`` too. Retries are
tenacity's, not the SDK's, because they differ on purpose: an HTTP 429/5xx or a connection
failure is retried with exponential backoff (honouring retry-after), a timeout never is (the
caller has a latency budget), and a malformed reply gets one repair. A caller with a deadline
passes it, and no request, retry or repair outlasts it: each request's timeout is what is left of
it, and a retry whose backoff would end past it is not made.
No ``temperature``: ``anthropic`` 2.x has no such argument and sends ``anthropic-version:
2026-10-21``, which rejects every sampling parameter with a 400 (even the default value).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from mnemoplan.errors import LLMError
from mnemoplan.inference.llm_json import extract_json

if TYPE_CHECKING:
    import anthropic

logger = logging.getLogger(__name__)

# USD per million tokens (input, output), matched by the longest model-name prefix.
PRICES_PER_MTOK: tuple[tuple[str, tuple[float, float]], ...] = (
    ("claude-haiku-4", (1.0, 5.0)),
    ("claude-sonnet-4", (3.0, 15.0)),
    ("claude-opus-4", (15.0, 75.0)),
    ("claude-3-5-haiku", (0.8, 4.0)),
)
DEFAULT_PRICE_PER_MTOK = (3.0, 15.0)

# Status codes worth a second try: rate limiting and server-side failures.
_RETRYABLE_STATUS = frozenset({429}) | frozenset(range(500, 600))
# Backoff before a transport retry; a retry-after header is honoured up to the cap.
_BACKOFF_S = 0.25
_MAX_BACKOFF_S = 2.0

_REQUEST_KEYS = frozenset({"system", "prompt", "max_tokens", "purpose", "deadline"})

# What the caller (an agent, in the end) can do about each kind of failure.
_HINTS = {
    "timeout": "The LLM did not answer within the time budget; retry later or raise the LLM timeout.",
    "connection": "The LLM endpoint could not be reached; check the network and the base URL.",
    "malformed": "The model did not return JSON; raise max_tokens if it was cut off, or simplify the prompt.",
    "not_messages": "The endpoint did not answer as the Messages API does; check that the base URL points at "
    "the API itself (not a proxy's or a gateway's page).",
    "deadline": "The caller's time budget ran out before the LLM answered; raise it, or the LLM is too slow.",
    "auth": "The API key was refused; check ANTHROPIC_API_KEY.",
    "transient": "The LLM API is rate limiting or failing on its side; retry later.",
    "rejected": "The request was rejected; check the model name and the LLM settings.",
}

_REPAIR_INSTRUCTION = (
    "Your previous reply could not be parsed as JSON ({error}). Reply again with only the corrected "
    "JSON value: no prose, no code fences, nothing before or after it."
)


@dataclass
class LLMUsage:
    """Token and cost counters, for one call or summed over many.

    A plain value: not synchronised itself. ``LLMClient`` keeps its running total behind a
    lock and hands out copies, so a caller's snapshot never changes under it.

    Attributes:
        calls: ``complete_json`` calls made (each may send several requests).
        failures: Calls that ended in ``LLMError``.
        input_tokens: Input tokens billed, over every request that got a reply.
        output_tokens: Output tokens billed, likewise.
        cost_usd: Estimated cost of those tokens.
    """

    calls: int = 0
    failures: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, other: LLMUsage) -> LLMUsage:
        """Add ``other``'s counters to this one, in place.

        Returns:
            This object, for chaining.
        """
        self.calls += other.calls
        self.failures += other.failures
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost_usd += other.cost_usd
        return self


@dataclass
class LLMReply:
    """A successful ``complete_json`` call.

    Attributes:
        data: The parsed JSON value (an object or an array).
        text: The raw text of the reply that parsed.
        usage: Tokens and cost of this call, including any repair request.
        attempts: HTTP requests sent, counting retries and the repair request.
    """

    data: dict[str, Any] | list[Any]
    text: str
    usage: LLMUsage = field(default_factory=LLMUsage)
    attempts: int = 1


def price_for(model: str, fallback: tuple[float, float] | None = None) -> tuple[float, float]:
    """USD per million (input, output) tokens for a model name.

    Args:
        model: Model name, e.g. ``claude-haiku-4-5``.
        fallback: Price for a model the table does not know; the Sonnet price if None.

    Returns:
        The (input, output) price pair.
    """
    matches = [(len(prefix), price) for prefix, price in PRICES_PER_MTOK if model.startswith(prefix)]
    if matches:
        return max(matches)[1]
    return fallback if fallback is not None else DEFAULT_PRICE_PER_MTOK


class _CallFailed(Exception):
    """Internal: why a call failed, and how many requests the failing step sent."""

    def __init__(self, cause: str, attempts: int, kind: str) -> None:
        super().__init__(cause)
        self.cause = cause
        self.attempts = attempts
        self.hint = _HINTS[kind]


class LLMClient:
    """Sends JSON-returning prompts to the Messages API; safe to share between threads.

    Constructing it makes no network call; the SDK client is built on first use.
    """

    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        base_url: str | None = None,
        timeout_s: float = 20.0,
        max_retries: int = 1,
        price_per_mtok: tuple[float, float] | None = None,
    ) -> None:
        """Configure the client.

        Args:
            api_key: Anthropic API key; never logged nor put in an error.
            model: Model name sent with every request.
            base_url: API root; the SDK's default (or ``ANTHROPIC_BASE_URL``) when None.
            timeout_s: Per-request timeout; a timed-out request is not retried.
            max_retries: Extra tries after an HTTP 429/5xx or a connection error.
            price_per_mtok: (input, output) USD per million tokens for a model the
                built-in table does not know.

        Raises:
            ValueError: If the API key is empty, or a number is out of range.
        """
        if not api_key or timeout_s <= 0 or max_retries < 0:
            raise ValueError("need a non-empty api_key, timeout_s > 0 and max_retries >= 0")
        self._api_key = api_key
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._price = price_for(model, price_per_mtok)
        self._lock = threading.Lock()
        self._usage = LLMUsage()
        self._sdk: anthropic.Anthropic | None = None
        # The SDK is imported when a client is made (a key is configured), so that the first
        # call's deadline is not spent importing it; a server without a key never imports it.
        import anthropic  # noqa: F401

    def __repr__(self) -> str:
        # Spelled out so that the API key can never reach a log through repr().
        return f"LLMClient(model={self.model!r}, base_url={self.base_url!r}, timeout_s={self.timeout_s})"

    @property
    def usage(self) -> LLMUsage:
        """A snapshot of the running totals over every call made with this client."""
        with self._lock:
            return replace(self._usage)

    def close(self) -> None:
        """Close the HTTP connection pool; the client reopens one if used again."""
        with self._lock:
            sdk, self._sdk = self._sdk, None
        if sdk is not None:
            sdk.close()

    def complete_json(
        self, *, system: str, prompt: str, max_tokens: int = 1024, purpose: str = "",
        deadline: float | None = None,
    ) -> LLMReply:  # fmt: skip
        """Send one prompt and parse the reply as JSON, repairing it once if needed.

        Args:
            system: System prompt.
            prompt: The user message.
            max_tokens: Cap on the reply's length.
            purpose: Short label for logs and errors, e.g. ``rerank``; never the prompt.
            deadline: A ``time.monotonic()`` instant no request, retry or repair may outlast
                (each request waits at most what is left of it, and at most ``timeout_s``).

        Returns:
            The parsed reply, with this call's usage and number of requests.

        Raises:
            LLMError: On a timeout or the deadline, an HTTP error that persisted through the
                retries, a connection failure, an answer that is not a Messages API reply, or a
                reply that was still not JSON after the repair.
        """
        usage = LLMUsage(calls=1)
        attempts = 0
        messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
        try:
            for _ in range(2):  # the reply, then one repair round-trip
                text, stop_reason, sent = self._send(system, messages, max_tokens, usage, deadline)
                attempts += sent
                try:
                    return LLMReply(data=extract_json(text), text=text, usage=usage, attempts=attempts)
                except ValueError as err:
                    error = _json_error(text, err, stop_reason)
                # Show the model its own reply and ask for JSON only.
                messages = [
                    *messages,
                    {"role": "assistant", "content": text.strip() or "(empty reply)"},
                    {"role": "user", "content": _REPAIR_INSTRUCTION.format(error=error)},
                ]
            raise _CallFailed(f"malformed JSON in the reply, even after a repair ({error})", 0, "malformed")
        except _CallFailed as failed:
            usage.failures = 1
            logger.warning(
                "LLM call%s failed after %d request(s): %s",
                f" ({purpose})" if purpose else "", attempts + failed.attempts, self._redact(failed.cause),
            )  # fmt: skip
            label = f" for {purpose}" if purpose else ""
            raise LLMError(
                self._redact(f"LLM call{label} to {self.model} failed: {failed.cause}"),
                hint=failed.hint,
            ) from None
        finally:
            with self._lock:
                self._usage.add(usage)

    def complete_json_many(
        self, requests: list[dict[str, Any]], *, max_in_flight: int = 6
    ) -> list[LLMReply | LLMError]:
        """Run several ``complete_json`` calls concurrently; never raises an ``LLMError``.

        Args:
            requests: Keyword arguments of ``complete_json``, one dict per call.
            max_in_flight: Most requests sent at the same time.

        Returns:
            For each request, in order, its ``LLMReply`` or the ``LLMError`` it ended in.

        Raises:
            TypeError: If a request has keys ``complete_json`` does not take, or lacks
                ``system`` or ``prompt`` (checked before anything is sent).
            ValueError: If ``max_in_flight`` is below 1.
        """
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        for i, request in enumerate(requests):
            if not {"system", "prompt"} <= set(request) <= _REQUEST_KEYS:
                raise TypeError(f"request {i} has keys {sorted(request)}; expected {sorted(_REQUEST_KEYS)}")
        if not requests:
            return []

        def run(request: dict[str, Any]) -> LLMReply | LLMError:
            try:
                return self.complete_json(**request)
            except LLMError as err:
                return err

        with ThreadPoolExecutor(max_workers=min(max_in_flight, len(requests)),
                                thread_name_prefix="llm") as pool:  # fmt: skip
            return list(pool.map(run, requests))

    def _client(self) -> anthropic.Anthropic:
        import anthropic  # here, not at import: it takes seconds, and most servers have no API key
        with self._lock:
            if self._sdk is None:
                # max_retries=0: retries are decided in _send (tenacity), where timeouts are excluded.
                self._sdk = anthropic.Anthropic(
                    api_key=self._api_key, base_url=self.base_url, timeout=self.timeout_s, max_retries=0
                )
            return self._sdk

    def _send(
        self, system: str, messages: list[dict[str, str]], max_tokens: int, usage: LLMUsage,
        deadline: float | None = None,
    ) -> tuple[str, str | None, int]:  # fmt: skip
        """One request with transport retries; adds the reply's tokens to ``usage``.

        Returns the reply's text, its stop reason and the number of requests sent; raises
        ``_CallFailed`` when no reply could be had.
        """
        import anthropic  # here, not at import: it takes seconds, and most servers have no API key
        sdk = self._client()
        sent = 0
        timeout = self.timeout_s

        def request() -> object:
            nonlocal sent, timeout
            timeout = self._timeout(deadline, sent)
            sent += 1
            return sdk.messages.create(
                model=self.model, system=system, messages=messages, max_tokens=max_tokens, timeout=timeout
            )

        retrying = Retrying(
            retry=retry_if_exception(_retryable),
            wait=_backoff,
            stop=stop_after_attempt(self.max_retries + 1) | _before_deadline(deadline),
            reraise=True,  # the last failure itself, to be told apart below
        )
        try:
            message = retrying(request)
        except anthropic.APITimeoutError:
            # Subclass of APIConnectionError, so it must be caught first: never retried.
            cut = " (the caller's deadline)" if timeout < self.timeout_s else ""
            raise _CallFailed(f"timeout after {timeout:.3g} s{cut}", sent, "timeout") from None
        except anthropic.APIStatusError as err:
            # The API's own words help most (a bad model name, a rejected parameter); kept short.
            detail = ": ".join(str(x)[:200] for x in (err.type, err.api_message) if x)
            cause = f"HTTP {err.status_code}" + (f" ({detail})" if detail else "")
            kind = "auth" if err.status_code in (401, 403) else "rejected"
            kind = "transient" if err.status_code in _RETRYABLE_STATUS else kind
            raise _CallFailed(f"{cause} after {sent} request(s)", sent, kind) from None
        except anthropic.APIConnectionError:
            raise _CallFailed(f"connection error after {sent} request(s)", sent, "connection") from None
        except anthropic.AnthropicError as err:
            raise _CallFailed(f"client error {type(err).__name__}", sent, "transient") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            # The SDK decodes a body declared as JSON itself and lets its decoding error through.
            raise _CallFailed("the answer's body is not JSON", sent, "not_messages") from None
        text, stop_reason, in_tok, out_tok = _message_parts(message)
        if text is None:  # e.g. a body that is not JSON at all, which the SDK hands back as a string
            raise _CallFailed("the answer is not a Messages API reply", sent, "not_messages")
        usage.input_tokens += in_tok
        usage.output_tokens += out_tok
        usage.cost_usd += (in_tok * self._price[0] + out_tok * self._price[1]) / 1_000_000
        return text, stop_reason, sent

    def _timeout(self, deadline: float | None, sent: int) -> float:
        """The next request's timeout: ``timeout_s``, or what is left before the deadline."""
        if deadline is None:
            return self.timeout_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise _CallFailed("no time left before the caller's deadline", sent, "deadline")
        return min(self.timeout_s, left)

    def _redact(self, text: str) -> str:
        # Defence in depth: a proxy may echo request headers into an error body.
        return text.replace(self._api_key, "[redacted]")


def _retryable(exc: BaseException) -> bool:
    """Worth another request: rate limiting, a failure on the API's side, or a connection that
    failed (a timeout is not: the caller's time budget is spent)."""
    import anthropic  # here, not at import: it takes seconds, and most servers have no API key
    if isinstance(exc, anthropic.APIStatusError):
        return exc.status_code in _RETRYABLE_STATUS
    return isinstance(exc, anthropic.APIConnectionError) and not isinstance(exc, anthropic.APITimeoutError)


_exponential = wait_exponential(multiplier=_BACKOFF_S, max=_MAX_BACKOFF_S)


def _backoff(state: RetryCallState) -> float:
    """Seconds before the next request: the API's retry-after (up to the cap), else exponential."""
    import anthropic  # here, not at import: it takes seconds, and most servers have no API key
    failure = state.outcome.exception() if state.outcome is not None else None
    if isinstance(failure, anthropic.APIStatusError):
        retry_after = failure.response.headers.get("retry-after")
        if retry_after is not None:
            try:
                return min(max(float(retry_after), 0.0), _MAX_BACKOFF_S)
            except ValueError:
                pass  # an HTTP-date retry-after: keep our own backoff
    return _exponential(state)


def _before_deadline(deadline: float | None) -> Callable[[RetryCallState], bool]:
    """A tenacity stop: no retry whose backoff would end past the caller's deadline."""

    def passed(state: RetryCallState) -> bool:
        return deadline is not None and time.monotonic() + state.upcoming_sleep >= deadline

    return passed


def _message_parts(message: object) -> tuple[str | None, str | None, int, int]:
    """(text, stop reason, input tokens, output tokens) of a reply; text None when it is not a
    Messages API reply. The SDK builds its models without validating them, so a JSON body of
    another shape arrives as a ``Message`` with fields missing, or of other types."""
    import anthropic  # here, not at import: it takes seconds, and most servers have no API key
    content = getattr(message, "content", None)
    if not isinstance(message, anthropic.types.Message) or not isinstance(content, list):
        return None, None, 0, 0
    texts = [getattr(block, "text", None) for block in content if getattr(block, "type", None) == "text"]
    if not all(isinstance(t, str) for t in texts):
        return None, None, 0, 0
    stop_reason = getattr(message, "stop_reason", None)
    counts = getattr(message, "usage", None)
    tokens = []
    for name in ("input_tokens", "output_tokens"):
        value = getattr(counts, name, 0)
        tokens.append(value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0)
    return "".join(texts), stop_reason if isinstance(stop_reason, str) else None, tokens[0], tokens[1]


def _json_error(text: str, err: ValueError, stop_reason: str | None) -> str:
    if stop_reason == "max_tokens":
        return "the reply was cut off at max_tokens"
    if not text.strip():
        return "the reply was empty"
    return str(err)

