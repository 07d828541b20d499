"""The LLM client every role shares: JSON replies checked against a model, for any provider.

Callers (the extractor, planners, evaluator, expander, reranker) get a checked reply in an
``LLMReply`` or an ``LLMError``, never an SDK or its exceptions. Each provider's SDK lives in
its own transport (``llm_anthropic``: the Messages API; ``llm_openai``: OpenAI-compatible chat
completions: OpenAI, Ollama, vLLM, llama.cpp's server, LM Studio, gateways).

One retry policy for every provider, tenacity's, with both SDKs' own retries off: an HTTP
429/5xx or a connection failure is retried with exponential backoff, honouring the server's
``Retry-After`` when it fits; a timeout never is (the caller's budget is spent), nor is any
other 4xx (a wrong key or model stays wrong). The SDKs' retries could not serve: they sleep
as long as a ``Retry-After`` says (anthropic: no cap; openai: up to two minutes) whatever the
caller's deadline (openai's retry timeouts too), and send requests this client never sees,
so the call record would not add up to what the server saw. A caller with a deadline passes
it, and no request, retry or repair outlasts it.

A reply is asked for through the server's own structured output where it has one (a JSON
schema, else JSON mode), with the schema in the prompt as well, since a server may ignore
it. A server that rejects a mode is asked without it, and not asked with it again. Each reply
must parse and validate against the caller's model; one that does not gets one repair
request that shows the model its reply and the problem; after that the call is an
``LLMError`` and the caller takes its offline path. Every request is recorded
(``llm_calls.CallRecord``) and counted against the caps before it is sent.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import BaseModel
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from mnemoplan.errors import LLMError
from mnemoplan.inference.llm_calls import CallRecord, CallRecorder, DailyCap, current_scope
from mnemoplan.inference.llm_json import extract_json, response_schema
from mnemoplan.inference.llm_policy import (
    API_NAMES,
    HINTS,
    CallFailed,
    backoff,
    before_deadline,
    failure,
    outcome,
    read_reply,
    rejects_format,
    retryable,
)
from mnemoplan.inference.llm_wire import OutputMode, ProviderError, Transport, WireReply

logger = logging.getLogger(__name__)

Provider = Literal["anthropic", "openai"]
Structured = Literal["auto", "json_object", "prompt"]

# USD per million tokens (input, output), matched by the longest model-name prefix.
PRICES_PER_MTOK: tuple[tuple[str, tuple[float, float]], ...] = (
    ("claude-haiku-4", (1.0, 5.0)),
    ("claude-sonnet-4", (3.0, 15.0)),
    ("claude-opus-4", (15.0, 75.0)),
    ("claude-3-5-haiku", (0.8, 4.0)),
    ("gpt-4o-mini", (0.15, 0.60)),
    ("gpt-4o", (2.5, 10.0)),
    ("gpt-4.1-mini", (0.40, 1.60)),
    ("gpt-4.1-nano", (0.10, 0.40)),
)
DEFAULT_PRICE_PER_MTOK = (3.0, 15.0)

_MAX_REPAIR_TOKENS = 4096
_REQUEST_KEYS = frozenset({"system", "prompt", "max_tokens", "purpose", "deadline", "schema"})
_REPAIR_INSTRUCTION = (
    "Your previous reply could not be used ({error}). Reply again with only the corrected JSON value, "
    "as the schema says: no prose, no code fences, nothing before or after it."
)


@dataclass
class LLMUsage:
    """Token and cost counters, for one call or summed over many (a plain value, not synchronised).

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
        """Add ``other``'s counters to this one, in place; returns this object."""
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
        value: The reply validated against the caller's model, when it gave one.
    """

    data: dict[str, Any] | list[Any]
    text: str
    usage: LLMUsage = field(default_factory=LLMUsage)
    attempts: int = 1
    value: Any = None


def price_for(model: str, fallback: tuple[float, float] | None = None) -> tuple[float, float]:
    """USD per million (input, output) tokens for a model name; ``fallback`` (else Sonnet's) if unknown."""
    matches = [(len(prefix), price) for prefix, price in PRICES_PER_MTOK if model.startswith(prefix)]
    if matches:
        return max(matches)[1]
    return fallback if fallback is not None else DEFAULT_PRICE_PER_MTOK


class LLMClient:
    """Sends JSON-returning prompts to one provider's API; safe to share between threads.

    Constructing it makes no network call; the SDK's client is built on first use.
    """

    def __init__(
        self,
        *,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = 20.0,
        max_retries: int = 1,
        price_per_mtok: tuple[float, float] | None = None,
        provider: Provider = "anthropic",
        structured: Structured = "auto",
        recorder: CallRecorder | None = None,
        daily_cap: DailyCap | None = None,
    ) -> None:
        """Configure the client.

        Args:
            model: Model name sent with every request.
            api_key: The API key (required for Anthropic; optional for a local OpenAI-compatible
                server); never logged nor put in an error.
            base_url: API root; the SDK's default when None.
            timeout_s: Per-request timeout; a timed-out request is not retried.
            max_retries: Extra tries after an HTTP 429/5xx or a connection error.
            price_per_mtok: (input, output) USD per million tokens for a model the built-in table
                does not know (default: Sonnet's for Anthropic, nothing for other servers).
            provider: ``anthropic`` or ``openai`` (any OpenAI-compatible server).
            structured: ``auto`` (the server's JSON schema or JSON mode, falling back), ``json_object``
                (JSON mode only) or ``prompt`` (the schema in the prompt only).
            recorder: Keeps a record of every request.
            daily_cap: Requests a day, shared by every client of the process.

        Raises:
            ValueError: If the provider is unknown, Anthropic has no key, or a number is out of range.
        """
        if provider not in ("anthropic", "openai") or timeout_s <= 0 or max_retries < 0:
            raise ValueError("need provider anthropic or openai, timeout_s > 0 and max_retries >= 0")
        if provider == "anthropic" and not api_key:
            raise ValueError("the Anthropic API needs a non-empty api_key")
        self._api_key = api_key or ""
        self.provider: Provider = provider
        self.model = model
        self.base_url = base_url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.structured = structured
        self._price = price_for(model, price_per_mtok if price_per_mtok or provider == "anthropic" else (0.0, 0.0))
        self._recorder = recorder
        self._daily = daily_cap
        self._lock = threading.Lock()
        self._usage = LLMUsage()
        self._sdk: Transport | None = None
        self._unsupported: set[OutputMode] = set()  # modes the server rejected
        # The SDK is imported when a client is made (an LLM is configured), so that the first
        # call's deadline is not spent importing it; a server without an LLM never imports it.
        self._make = _transport_factory(provider)

    def __repr__(self) -> str:
        # Spelled out so that the API key can never reach a log through repr().
        return (f"LLMClient(provider={self.provider!r}, model={self.model!r}, base_url={self.base_url!r}, "
                f"timeout_s={self.timeout_s})")  # fmt: skip

    @property
    def usage(self) -> LLMUsage:
        """A snapshot of the running totals over every call made with this client."""
        with self._lock:
            return replace(self._usage)

    def with_model(self, model: str) -> LLMClient:
        """A client like this one for another model (the extraction model), sharing its recorder
        and daily cap."""
        return LLMClient(model=model, api_key=self._api_key or None, base_url=self.base_url, timeout_s=self.timeout_s,
                         max_retries=self.max_retries, provider=self.provider, structured=self.structured,
                         recorder=self._recorder, daily_cap=self._daily)  # fmt: skip

    def close(self) -> None:
        """Close the HTTP connection pool; the client reopens one if used again."""
        with self._lock:
            sdk, self._sdk = self._sdk, None
        if sdk is not None:
            sdk.close()

    def complete_json(
        self, *, system: str, prompt: str, max_tokens: int = 1024, purpose: str = "",
        deadline: float | None = None, schema: type[BaseModel] | None = None,
    ) -> LLMReply:  # fmt: skip
        """Send one prompt; parse the reply as JSON and validate it, repairing it once if needed.

        Args:
            system: System prompt (it should carry the schema in words: a server may ignore
                the structured-output parameter).
            prompt: The user message.
            max_tokens: Cap on the reply's length (doubled for a repair of a cut-off reply).
            purpose: Short label for logs, errors and the call record, e.g. ``rerank``.
            deadline: A ``time.monotonic()`` instant no request, retry or repair may outlast.
            schema: The model the reply must validate against (``LLMReply.value``).

        Returns:
            The parsed reply, with this call's usage and number of requests.

        Raises:
            LLMError: On a timeout or the deadline, an HTTP error that persisted through the
                retries, a connection failure, an answer that is not the API's, a cap reached,
                or a reply still unusable after the repair.
        """
        usage = LLMUsage(calls=1)
        attempts = 0
        wire_schema = response_schema(schema) if schema is not None else None
        name = schema.__name__.strip("_") if schema is not None else "reply"
        messages: list[dict[str, str]] = [{"role": "user", "content": prompt}]
        try:
            for _ in range(2):  # the reply, then one repair round-trip
                reply, sent, latency = self._send(system, messages, max_tokens, deadline, wire_schema, name, purpose)
                attempts += sent
                usage.input_tokens += reply.input_tokens
                usage.output_tokens += reply.output_tokens
                usage.cost_usd += (reply.input_tokens * self._price[0] + reply.output_tokens * self._price[1]) / 1e6
                result_of, result = read_reply(reply, schema)
                self._record(purpose, result_of, reply.input_tokens, reply.output_tokens, latency)
                if result_of == "ok":
                    data, value = result
                    return LLMReply(data=data, text=reply.text, usage=usage, attempts=attempts, value=value)
                error = result
                if result_of == "truncated":
                    max_tokens = min(max_tokens * 2, max(_MAX_REPAIR_TOKENS, max_tokens))
                messages = [
                    *messages,
                    {"role": "assistant", "content": reply.text.strip() or "(empty reply)"},
                    {"role": "user", "content": _REPAIR_INSTRUCTION.format(error=error)},
                ]
            raise CallFailed(f"malformed reply, even after a repair ({error})", 0, "malformed")
        except CallFailed as failed:
            usage.failures = 1
            logger.warning("LLM call%s failed after %d request(s): %s", f" ({purpose})" if purpose else "",
                           attempts + failed.attempts, self._redact(failed.cause))  # fmt: skip
            label = f" for {purpose}" if purpose else ""
            hint = HINTS[failed.kind].format(api=API_NAMES[self.provider])
            code = "llm_capped" if failed.kind == "capped" else None
            raise LLMError(self._redact(f"LLM call{label} to {self.model} failed: {failed.cause}"), hint=hint,
                           code=code) from None
        finally:
            with self._lock:
                self._usage.add(usage)

    def complete_json_many(
        self, requests: list[dict[str, Any]], *, max_in_flight: int = 6
    ) -> list[LLMReply | LLMError]:
        """Run several ``complete_json`` calls concurrently; never raises an ``LLMError``.

        Each runs in a copy of the caller's context, so its requests count against the caller's
        ``llm_scope``.

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

        contexts = [contextvars.copy_context() for _ in requests]  # one each: a context runs in one thread
        with ThreadPoolExecutor(max_workers=min(max_in_flight, len(requests)),
                                thread_name_prefix="llm") as pool:  # fmt: skip
            return list(pool.map(lambda pair: pair[0].run(run, pair[1]), zip(contexts, requests, strict=True)))

    # -- one request, with retries -----------------------------------------------------------

    def _transport(self) -> Transport:
        with self._lock:
            if self._sdk is None:
                self._sdk = self._make(api_key=self._api_key or None, base_url=self.base_url,
                                       timeout_s=self.timeout_s)  # fmt: skip
            return self._sdk

    def _send(
        self, system: str, messages: list[dict[str, str]], max_tokens: int, deadline: float | None,
        schema: dict[str, Any] | None, name: str, purpose: str,
    ) -> tuple[WireReply, int, float]:  # fmt: skip
        """One reply, with transport retries: (the reply, requests sent, its latency in ms).

        Raises:
            CallFailed: When no reply could be had.
        """
        transport = self._transport()
        sent = 0
        timeout = self.timeout_s
        latency = 0.0

        def request() -> WireReply:
            nonlocal sent, timeout, latency
            while True:  # once more without a structured-output mode the server rejected
                timeout = self._timeout(deadline, sent)
                mode = self._mode(transport, schema)
                self._reserve(purpose, sent)
                sent += 1
                started = time.perf_counter()
                try:
                    return transport.send(model=self.model, system=system, messages=messages, max_tokens=max_tokens,
                                          timeout=timeout, mode=mode, schema=schema, schema_name=name)  # fmt: skip
                except ProviderError as err:
                    if not rejects_format(err, mode):
                        self._record(purpose, outcome(err), 0, 0, _ms(started))
                        raise
                    self._record(purpose, "format_rejected", 0, 0, _ms(started))
                    logger.info("the LLM server rejected structured output %s (%s); asking without it", mode,
                                err.detail)  # fmt: skip
                    with self._lock:
                        self._unsupported.add(mode)
                except Exception as err:  # noqa: BLE001 - whatever an SDK raises is no internal error here
                    logger.warning("the %s client raised %s", self.provider, type(err).__name__, exc_info=True)
                    self._record(purpose, "client", 0, 0, _ms(started))
                    raise ProviderError("client", detail=type(err).__name__) from None
                finally:
                    latency = _ms(started)

        retrying = Retrying(
            retry=retry_if_exception(retryable),
            wait=backoff,
            stop=stop_after_attempt(self.max_retries + 1) | before_deadline(deadline),
            reraise=True,  # the last failure itself, to be told apart below
        )
        try:
            return retrying(request), sent, latency
        except ProviderError as err:
            raise failure(err, sent, timeout, self.timeout_s) from None

    def _mode(self, transport: Transport, schema: dict[str, Any] | None) -> OutputMode:
        if self.structured == "prompt":
            return "prompt"
        with self._lock:
            offered = [m for m in transport.modes(schema) if m not in self._unsupported]
        if self.structured == "json_object":
            offered = [m for m in offered if m == "json_object"]
        return offered[0] if offered else "prompt"

    def _reserve(self, purpose: str, sent: int) -> None:
        """Count the next request against the caps, or fail the call (recorded, not sent)."""
        scope = current_scope()
        if scope is not None and not scope.reserve():
            self._record(purpose, "capped", 0, 0, 0.0, sent=False)
            raise CallFailed(f"over the cap of {scope.max_calls} LLM request(s) per {scope.tool} call"
                              f"{f' ({scope.setting})' if scope.setting else ''}", sent, "capped")  # fmt: skip
        if self._daily is not None and not self._daily.reserve():
            if scope is not None:
                scope.release()
            self._record(purpose, "capped", 0, 0, 0.0, sent=False)
            raise CallFailed(f"over the cap of {self._daily.limit} LLM requests a day "
                              "(MNEMOPLAN_LLM_MAX_CALLS_PER_DAY)", sent, "capped")  # fmt: skip

    def _record(self, purpose: str, outcome: str, tokens_in: int, tokens_out: int, latency_ms: float, *,
                sent: bool = True) -> None:  # fmt: skip
        if self._recorder is None:
            return
        scope = current_scope()
        call = CallRecord(ts=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), provider=self.provider,
                          model=self.model, purpose=purpose, tool=scope.tool if scope else "", outcome=outcome,
                          input_tokens=tokens_in, output_tokens=tokens_out, latency_ms=round(latency_ms, 2),
                          cost_usd=round((tokens_in * self._price[0] + tokens_out * self._price[1]) / 1e6, 8),
                          sent=sent)  # fmt: skip
        try:
            self._recorder.record(call)
        except Exception:  # noqa: BLE001 - a record lost is no reason to fail the call
            logger.warning("an LLM call record was lost", exc_info=True)

    def _timeout(self, deadline: float | None, sent: int) -> float:
        """The next request's timeout: ``timeout_s``, or what is left before the deadline."""
        if deadline is None:
            return self.timeout_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise CallFailed("no time left before the caller's deadline", sent, "deadline")
        return min(self.timeout_s, left)

    def _redact(self, text: str) -> str:
        # Defence in depth: a proxy may echo request headers into an error body.
        return text.replace(self._api_key, "[redacted]") if self._api_key else text


def _transport_factory(provider: Provider) -> Callable[..., Transport]:
    if provider == "openai":
        from mnemoplan.inference.llm_openai import OpenAITransport

        return OpenAITransport
    from mnemoplan.inference.llm_anthropic import AnthropicTransport

    return AnthropicTransport


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


__all__ = ["LLMClient", "LLMReply", "LLMUsage", "extract_json", "price_for"]
