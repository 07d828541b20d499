"""The Anthropic Messages API behind the ``anthropic`` SDK: the one module that imports it.

Structured output is the API's ``output_config.format`` (a JSON schema), offered only for a
schema it can take: every object closed (``additionalProperties: false``), no open map (the
reranker's scores by id, a plan's free params). Anything else carries its schema in the prompt.
No ``temperature``: ``anthropic`` 2.x sends ``anthropic-version: 2026-10-21``, which rejects
every sampling parameter with a 400 (even the default value).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from mnemoplan.inference.llm_wire import OutputMode, ProviderError, WireReply, non_negative_int, retry_after_s, short


class AnthropicTransport:
    """Messages API requests; the SDK's own retries are off (the client decides them).

    Args:
        api_key: The API key; never logged.
        base_url: API root; the SDK's default (or ``ANTHROPIC_BASE_URL``) when None.
        timeout_s: Default per-request timeout.
    """

    provider = "anthropic"

    def __init__(self, *, api_key: str, base_url: str | None, timeout_s: float) -> None:
        # max_retries=0: one retry policy for every provider, the client's (llm.py says why).
        self._sdk = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=0)

    def modes(self, schema: dict[str, Any] | None) -> list[OutputMode]:
        """``json_schema`` for a closed schema; the API has no schema-less JSON mode."""
        return ["json_schema"] if schema is not None and closed(schema) else []

    def send(
        self, *, model: str, system: str, messages: list[dict[str, str]], max_tokens: int, timeout: float,
        mode: OutputMode, schema: dict[str, Any] | None, schema_name: str,
    ) -> WireReply:  # fmt: skip
        """One Messages API request.

        Raises:
            ProviderError: On a timeout, a connection failure, an HTTP error, or an answer that is
                not a Messages API reply.
        """
        extra: dict[str, Any] = {}
        if mode == "json_schema" and schema is not None:
            extra["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
        try:
            message = self._sdk.messages.create(model=model, system=system, messages=messages,  # type: ignore[arg-type]
                                                max_tokens=max_tokens, timeout=timeout, **extra)  # fmt: skip
        except anthropic.APITimeoutError:  # a subclass of APIConnectionError: first
            raise ProviderError("timeout") from None
        except anthropic.APIStatusError as err:
            detail = ": ".join(short(x) for x in (err.type, err.api_message) if x)
            raise ProviderError("status", status=err.status_code, retry_after=retry_after_s(err.response.headers),
                                detail=detail) from None  # fmt: skip
        except anthropic.APIConnectionError:
            raise ProviderError("connection") from None
        except anthropic.AnthropicError as err:
            raise ProviderError("client", detail=type(err).__name__) from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            # The SDK decodes a body declared as JSON itself and lets its decoding error through.
            raise ProviderError("not_api", detail="the answer's body is not JSON") from None
        return _reply(message)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._sdk.close()


def _reply(message: object) -> WireReply:
    """The parts of a Messages API reply. The SDK builds its models without validating them, so a
    JSON body of another shape arrives as a ``Message`` with fields missing, or of other types.

    Raises:
        ProviderError: ``not_api`` when it is no Messages API reply.
    """
    content = getattr(message, "content", None)
    if not isinstance(message, anthropic.types.Message) or not isinstance(content, list):
        raise ProviderError("not_api", detail="the answer is not a Messages API reply")
    texts = [getattr(block, "text", None) for block in content if getattr(block, "type", None) == "text"]
    if not all(isinstance(t, str) for t in texts):
        raise ProviderError("not_api", detail="the answer is not a Messages API reply")
    counts = getattr(message, "usage", None)
    stop = getattr(message, "stop_reason", None)
    return WireReply(
        text="".join(texts),  # type: ignore[arg-type]
        truncated=stop == "max_tokens",
        refusal="the model refused (stop_reason refusal)" if stop == "refusal" else "",
        input_tokens=non_negative_int(getattr(counts, "input_tokens", 0)),
        output_tokens=non_negative_int(getattr(counts, "output_tokens", 0)),
    )


def closed(schema: Any) -> bool:
    """Whether every object of a JSON schema lists its properties and allows no others."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" and (schema.get("additionalProperties") is not False
                                                or "properties" not in schema):  # fmt: skip
            return False
        return all(closed(v) for v in schema.values())
    if isinstance(schema, list):
        return all(closed(v) for v in schema)
    return True
