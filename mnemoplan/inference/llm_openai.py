"""OpenAI-compatible chat completions behind the ``openai`` SDK: the one module that imports it.

One API, many servers: OpenAI itself, Ollama (``http://localhost:11434/v1``), vLLM, llama.cpp's
``llama-server``, LM Studio and gateways. Structured output is ``response_format``: a JSON
schema (not strict: strict mode rejects open maps, and local servers read it as a grammar
either way), else JSON mode; a server that rejects one is asked without it (the client
remembers which it rejected). A server may also ignore it: the reply is checked either way.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from mnemoplan.inference.llm_wire import OutputMode, ProviderError, WireReply, non_negative_int, retry_after_s, short

# A local server needs no key, but the SDK refuses to start without one.
NO_KEY = "not-needed"


class OpenAITransport:
    """Chat-completions requests; the SDK's own retries are off (the client decides them).

    Args:
        api_key: The API key; None for a local server that takes none.
        base_url: API root, e.g. ``http://localhost:11434/v1``; OpenAI's (or ``OPENAI_BASE_URL``) when None.
        timeout_s: Default per-request timeout.
    """

    provider = "openai"

    def __init__(self, *, api_key: str | None, base_url: str | None, timeout_s: float) -> None:
        # max_retries=0: one retry policy for every provider, the client's (llm.py says why).
        self._sdk = openai.OpenAI(api_key=api_key or NO_KEY, base_url=base_url, timeout=timeout_s, max_retries=0)

    def modes(self, schema: dict[str, Any] | None) -> list[OutputMode]:
        """``json_schema`` for a schema, then JSON mode."""
        return ["json_schema", "json_object"] if schema is not None else ["json_object"]

    def send(
        self, *, model: str, system: str, messages: list[dict[str, str]], max_tokens: int, timeout: float,
        mode: OutputMode, schema: dict[str, Any] | None, schema_name: str,
    ) -> WireReply:  # fmt: skip
        """One chat-completions request.

        Raises:
            ProviderError: On a timeout, a connection failure, an HTTP error, or an answer that is
                not a chat completion.
        """
        extra: dict[str, Any] = {}
        if mode == "json_schema" and schema is not None:
            extra["response_format"] = {"type": "json_schema",
                                        "json_schema": {"name": schema_name, "schema": schema, "strict": False}}
        elif mode == "json_object":
            extra["response_format"] = {"type": "json_object"}
        chat = [{"role": "system", "content": system}, *messages]
        try:
            completion = self._sdk.chat.completions.create(model=model, messages=chat,  # type: ignore[arg-type]
                                                           max_tokens=max_tokens, timeout=timeout, **extra)
        except openai.APITimeoutError:  # a subclass of APIConnectionError: first
            raise ProviderError("timeout") from None
        except openai.APIStatusError as err:
            raise ProviderError("status", status=err.status_code, retry_after=retry_after_s(err.response.headers),
                                detail=_detail(err)) from None  # fmt: skip
        except openai.APIConnectionError:
            raise ProviderError("connection") from None
        except openai.OpenAIError as err:
            raise ProviderError("client", detail=type(err).__name__) from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ProviderError("not_api", detail="the answer's body is not JSON") from None
        return _reply(completion)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._sdk.close()


def _detail(err: openai.APIStatusError) -> str:
    """The server's own words: OpenAI, Ollama and llama.cpp nest them under ``error``, vLLM not."""
    body = err.body
    message = body.get("message") if isinstance(body, dict) else body
    kind = body.get("type") if isinstance(body, dict) else None
    return ": ".join(short(x) for x in (kind, message) if x)


def _reply(completion: object) -> WireReply:
    """The parts of a chat completion. The SDK builds its models without validating them, so a
    JSON body of another shape arrives with fields missing, or of other types.

    Raises:
        ProviderError: ``not_api`` when it is no chat completion.
    """
    choices = getattr(completion, "choices", None)
    if not isinstance(completion, openai.types.chat.ChatCompletion) or not isinstance(choices, list) or not choices:
        raise ProviderError("not_api", detail="the answer is not a chat completion")
    message = getattr(choices[0], "message", None)
    text = getattr(message, "content", None)
    refusal = getattr(message, "refusal", None)
    if text is not None and not isinstance(text, str):
        raise ProviderError("not_api", detail="the answer is not a chat completion")
    counts = getattr(completion, "usage", None)
    return WireReply(
        text=text or "",
        truncated=getattr(choices[0], "finish_reason", None) == "length",
        refusal=short(refusal) if isinstance(refusal, str) and refusal.strip() else "",
        input_tokens=non_negative_int(getattr(counts, "prompt_tokens", 0)),
        output_tokens=non_negative_int(getattr(counts, "completion_tokens", 0)),
    )
