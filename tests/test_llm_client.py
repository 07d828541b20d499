"""LLMClient against a loopback Messages API: parsing, repair, retries, timeouts, cost, threads."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mnemoplan.errors import LLMError
from mnemoplan.inference.llm import LLMClient, LLMReply, LLMUsage, extract_json
from tests.llm_server import LoopbackMessagesServer as Server
from tests.llm_server import Reply, llm_server  # noqa: F401

API_KEY = "sk-ant-test-SECRET-0123456789"
HAIKU = "claude-haiku-4-5"


MakeClient = Callable[..., LLMClient]


@pytest.fixture
def make_client(llm_server: Server) -> Iterator[MakeClient]:
    """Clients pointed at the loopback server, closed after the test (no stray sockets)."""
    made: list[LLMClient] = []

    def make(**overrides: Any) -> LLMClient:
        options: dict[str, Any] = {"api_key": API_KEY, "model": HAIKU, "base_url": llm_server.url}
        options.update({"timeout_s": 5.0, **overrides})
        made.append(LLMClient(**options))
        return made[-1]

    yield make
    for client in made:
        client.close()


def request_timeout(headers: dict[str, str]) -> float:
    """The timeout the SDK gave a request (it sends it along, in seconds)."""
    return float({k.lower(): v for k, v in headers.items()}["x-stainless-read-timeout"])


def ask(client: LLMClient, prompt: str = "Give me JSON.", **kwargs: Any) -> LLMReply:
    return client.complete_json(system="Answer with JSON only.", prompt=prompt, **kwargs)


# --- extract_json -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("  [1, 2, 3]\n", [1, 2, 3]),
        ('```json\n{"a": [1, {"b": "}"}]}\n```', {"a": [1, {"b": "}"}]}),
        ('Sure! Here it is:\n```\n{"ok": true}\n```\nAnything else?', {"ok": True}),
        ('The plan is {"steps": ["bm25"]} as requested.', {"steps": ["bm25"]}),
        ('[see below] {"x": null}', {"x": None}),
    ],
)
def test_extract_json_finds_the_value(text: str, expected: Any) -> None:
    assert extract_json(text) == expected


@pytest.mark.parametrize("text", ["", "no json here", "{not: json}", "42", '"just a string"', "```json\n```"])
def test_extract_json_raises_when_there_is_none(text: str) -> None:
    with pytest.raises(ValueError):
        extract_json(text)


# --- single calls -----------------------------------------------------------------------------


def test_success_parses_json_and_prices_reported_usage(llm_server: Server, make_client: MakeClient) -> None:
    llm_server.script(Reply(text='{"answer": "Paris", "score": 0.9}', input_tokens=1000, output_tokens=200))
    client = make_client()
    reply = ask(client, max_tokens=300, purpose="test")

    assert reply.data == {"answer": "Paris", "score": 0.9}
    assert reply.attempts == 1
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (1000, 200)
    # claude-haiku-4*: $1 / $5 per million tokens.
    assert reply.usage.cost_usd == pytest.approx(1000 * 1.0 / 1e6 + 200 * 5.0 / 1e6)
    (body,) = llm_server.requests
    assert body["model"] == HAIKU
    assert body["system"] == "Answer with JSON only."
    assert body["messages"] == [{"role": "user", "content": "Give me JSON."}]
    assert body["max_tokens"] == 300
    # The 2026-10-21 API version rejects sampling parameters outright.
    assert "temperature" not in body


@pytest.mark.parametrize(
    ("model", "price", "expected"),
    [
        ("claude-sonnet-4-6", None, 3.0 + 15.0),
        ("claude-opus-4-1", None, 15.0 + 75.0),
        ("claude-3-5-haiku-latest", None, 0.8 + 4.0),
        ("someone-elses-model", (0.5, 1.5), 0.5 + 1.5),
        ("someone-elses-model", None, 3.0 + 15.0),
    ],
)
def test_cost_follows_the_price_table(
    llm_server: Server,
    make_client: MakeClient,
    model: str,
    price: tuple[float, float] | None,
    expected: float,
) -> None:
    llm_server.script(Reply(text="[]", input_tokens=1_000_000, output_tokens=1_000_000))
    reply = ask(make_client(model=model, price_per_mtok=price))
    assert reply.usage.cost_usd == pytest.approx(expected)


def test_fenced_reply_with_prose_is_parsed(llm_server: Server, make_client: MakeClient) -> None:
    text = 'Here is the ranking you asked for:\n```json\n[{"id": "m1", "score": 2}]\n```\nHope it helps!'
    llm_server.script(Reply(text=text))
    reply = ask(make_client())
    assert reply.data == [{"id": "m1", "score": 2}]
    assert reply.text == text
    assert len(llm_server.requests) == 1


def test_malformed_reply_is_repaired_once(llm_server: Server, make_client: MakeClient) -> None:
    bad = '{"answer": "Paris", "score": }'
    llm_server.script(
        Reply(text=bad, input_tokens=100, output_tokens=10),
        Reply(text='{"answer": "Paris", "score": 1}', input_tokens=150, output_tokens=12),
    )
    reply = ask(make_client())

    assert reply.data == {"answer": "Paris", "score": 1}
    assert reply.attempts == 2
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (250, 22)
    first, second = llm_server.requests
    assert second["system"] == first["system"]
    assert second["messages"][0] == first["messages"][0]
    assert second["messages"][1] == {"role": "assistant", "content": bad}
    assert second["messages"][-1]["role"] == "user"
    assert "JSON" in second["messages"][-1]["content"]


def test_malformed_twice_is_an_llm_error(llm_server: Server, make_client: MakeClient) -> None:
    llm_server.script(Reply(text="I cannot do that."), Reply(text="Still no JSON, sorry."))
    client = make_client()
    with pytest.raises(LLMError) as info:
        ask(client, purpose="rerank")
    assert "malformed" in info.value.message
    assert "rerank" in info.value.message
    assert info.value.hint
    assert len(llm_server.requests) == 2
    assert client.usage.failures == 1


def test_truncated_reply_is_named_as_such(llm_server: Server, make_client: MakeClient) -> None:
    cut = Reply(text='{"items": [1, 2,', stop_reason="max_tokens")
    llm_server.script(cut, cut)
    with pytest.raises(LLMError, match="max_tokens"):
        ask(make_client(), max_tokens=8)


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        (Reply(body=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
         "not a Messages"),
        (Reply(body=b'{"type": "message", "content": [{"type": "te'), "not JSON"),
        (Reply(body=b'{"status": "ok"}'), "not a Messages"),
        (Reply(body=b'{"type": "message", "content": "hi", "usage": {}}'), "not a Messages"),
    ],
    ids=["html page", "cut json", "other json", "content not a list"],
)
def test_an_answer_that_is_not_a_messages_reply_is_an_llm_error(
    llm_server: Server, make_client: MakeClient, answer: Reply, cause: str
) -> None:
    """A proxy or gateway in front of the API may answer 200 with anything: the caller gets the
    LLMError it falls back on, never the SDK's parsing failure (which crashed deep search)."""
    llm_server.script(answer)
    client = make_client()
    with pytest.raises(LLMError) as info:
        ask(client, purpose="plan")
    assert cause in info.value.message and "plan" in info.value.message
    assert "base URL" in info.value.hint
    assert len(llm_server.requests) == 1 and client.usage.failures == 1


def test_no_request_outlives_the_callers_deadline(llm_server: Server, make_client: MakeClient) -> None:
    """Each request waits at most what is left of the caller's deadline (the SDK sends its timeout
    along), and a call whose deadline has passed sends nothing."""
    llm_server.script(Reply(text="no JSON"), Reply(text='{"ok": true}'))
    client = make_client(timeout_s=30.0)
    assert ask(client, deadline=time.monotonic() + 20.0).data == {"ok": True}  # the repair's budget too
    timeouts = [request_timeout(h) for h in llm_server.request_headers]
    assert len(timeouts) == 2 and all(t <= 20.0 for t in timeouts)
    with pytest.raises(LLMError, match="deadline") as info:
        ask(client, deadline=time.monotonic() - 1.0)
    assert info.value.hint and len(llm_server.requests) == 2


def test_http_500_then_success_is_retried(llm_server: Server, make_client: MakeClient) -> None:
    llm_server.script(Reply(status=500), Reply(text='{"ok": true}'))
    reply = ask(make_client(max_retries=1))
    assert reply.data == {"ok": True}
    assert reply.attempts == 2
    assert len(llm_server.requests) == 2


def test_http_500_twice_is_an_llm_error_naming_the_status(
    llm_server: Server, make_client: MakeClient
) -> None:
    llm_server.script(Reply(status=500), Reply(status=500))
    with pytest.raises(LLMError) as info:
        ask(make_client(max_retries=1))
    assert "500" in info.value.message
    assert info.value.retryable
    assert len(llm_server.requests) == 2


def test_rate_limit_honours_retry_after(llm_server: Server, make_client: MakeClient) -> None:
    llm_server.script(
        Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "0"}), Reply(text="[1]")
    )
    assert ask(make_client(max_retries=1)).data == [1]


def test_client_errors_are_not_retried(llm_server: Server, make_client: MakeClient) -> None:
    llm_server.script(Reply(status=400, error_type="invalid_request_error", message="model: not found"))
    with pytest.raises(LLMError) as info:
        ask(make_client(max_retries=3))
    assert "400" in info.value.message
    assert "model: not found" in info.value.message
    assert len(llm_server.requests) == 1


def test_timeout_is_not_retried(llm_server: Server, make_client: MakeClient) -> None:
    llm_server.script(Reply(delay_s=600, text='{"late": true}'), Reply(text='{"never": "sent"}'))
    client = make_client(timeout_s=0.5, max_retries=3)
    with pytest.raises(LLMError) as info:
        ask(client)
    assert "timeout" in info.value.message
    assert len(llm_server.requests) == 1  # one timeout, no retry


def test_connection_error_is_retried_then_reported() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = LLMClient(api_key=API_KEY, model=HAIKU, base_url=f"http://127.0.0.1:{port}", max_retries=1)
    with pytest.raises(LLMError, match="connection error after 2 request"):
        ask(client)
    client.close()


def test_api_key_never_appears_in_errors_or_logs(
    llm_server: Server, caplog: pytest.LogCaptureFixture, make_client: MakeClient
) -> None:
    # A misbehaving proxy that echoes the Authorization header into its error body.
    echo = Reply(status=401, error_type="authentication_error", message=f"bad key Bearer {API_KEY}")
    # The last never answers (until the server stops); the others must not time out on a busy machine.
    llm_server.script(echo, Reply(text="nope"), Reply(text="nope"), Reply(status=503), Reply(delay_s=600))
    client = make_client(max_retries=0, timeout_s=2.0)
    errors = []
    with caplog.at_level(logging.DEBUG, logger="mnemoplan"):
        for _ in range(4):
            with pytest.raises(LLMError) as info:
                ask(client)
            errors.append(info.value)
    causes = [e.message.split("failed: ")[1] for e in errors]
    assert [c[:7] for c in causes] == ["HTTP 40", "malform", "HTTP 50", "timeout"]
    for err in errors:
        for text in (str(err), err.message, err.hint, err.to_text(), repr(err)):
            assert API_KEY not in text
    assert "[redacted]" in errors[0].message
    assert API_KEY not in caplog.text
    assert API_KEY not in repr(client)
    # The header the SDK sends is Authorization: Bearer, not x-api-key.
    assert llm_server.request_headers[0]["Authorization"] == f"Bearer {API_KEY}"


def test_usage_accumulates_across_calls(llm_server: Server, make_client: MakeClient) -> None:
    llm_server.script(
        Reply(text='{"n": 1}', input_tokens=100, output_tokens=10),
        Reply(text="oops", input_tokens=200, output_tokens=20),
        Reply(text='{"n": 2}', input_tokens=300, output_tokens=30),
        Reply(status=500),
    )
    client = make_client(max_retries=0)
    ask(client)
    ask(client)  # repaired: two requests, both billed
    with pytest.raises(LLMError):
        ask(client)
    total = client.usage
    assert (total.calls, total.failures) == (3, 1)
    assert (total.input_tokens, total.output_tokens) == (600, 60)
    assert total.cost_usd == pytest.approx(600 * 1.0 / 1e6 + 60 * 5.0 / 1e6)
    # A snapshot: later calls do not change it.
    llm_server.script(Reply(text="[]"))
    ask(client)
    assert total.calls == 3
    assert client.usage.calls == 4


def test_llm_usage_add() -> None:
    total = LLMUsage(calls=1, input_tokens=5, cost_usd=0.5)
    assert total.add(LLMUsage(calls=2, failures=1, output_tokens=7, cost_usd=0.25)) is total
    assert total == LLMUsage(calls=3, failures=1, input_tokens=5, output_tokens=7, cost_usd=0.75)


# --- many calls -------------------------------------------------------------------------------


def _by_prompt(request: dict[str, Any]) -> Reply:
    """Answers that depend on the prompt, since concurrent requests arrive in any order."""
    prompt = request["messages"][0]["content"]
    if prompt.startswith("fail"):
        return Reply(status=500)
    if prompt.startswith("garble") and len(request["messages"]) == 1:
        return Reply(text="not json")
    if prompt.startswith("slow"):
        return Reply(delay_s=0.05, text=f'{{"echo": "{prompt}"}}', input_tokens=1, output_tokens=1)
    return Reply(text=f'{{"echo": "{prompt}"}}', input_tokens=1, output_tokens=1)


def test_complete_json_many_keeps_order_with_mixed_outcomes(
    llm_server: Server, make_client: MakeClient
) -> None:
    llm_server.responder = _by_prompt
    client = make_client(max_retries=0)
    prompts = ["slow-0", "fail-1", "ok-2", "garble-3", "slow-4", "fail-5", "ok-6", "ok-7"]
    requests = [{"system": "JSON only.", "prompt": p, "purpose": f"item {i}"} for i, p in enumerate(prompts)]

    results = client.complete_json_many(requests, max_in_flight=3)

    assert len(results) == len(prompts)
    for prompt, result in zip(prompts, results, strict=True):
        if prompt.startswith("fail"):
            assert isinstance(result, LLMError) and "500" in result.message
        else:
            assert isinstance(result, LLMReply), result
            assert result.data == {"echo": prompt}
    assert isinstance(results[3], LLMReply) and results[3].attempts == 2
    total = client.usage
    assert (total.calls, total.failures) == (8, 2)
    assert len(llm_server.requests) == 9  # eight prompts plus one repair


def test_complete_json_many_counts_exactly_under_concurrency(
    llm_server: Server, make_client: MakeClient
) -> None:
    llm_server.responder = _by_prompt
    client = make_client()
    results = client.complete_json_many(
        [{"system": "s", "prompt": f"ok-{i}"} for i in range(40)], max_in_flight=8
    )
    assert [r.data for r in results] == [{"echo": f"ok-{i}"} for i in range(40)]  # type: ignore[union-attr]
    assert (client.usage.calls, client.usage.input_tokens, client.usage.output_tokens) == (40, 40, 40)


def test_complete_json_many_rejects_bad_requests_before_sending(
    llm_server: Server, make_client: MakeClient
) -> None:
    client = make_client()
    assert client.complete_json_many([]) == []
    with pytest.raises(TypeError):
        client.complete_json_many([{"system": "s", "prompt": "p"}, {"prompt": "p", "temperature": 0}])
    assert llm_server.requests == []


def test_construction_sends_nothing_and_checks_arguments(llm_server: Server, make_client: MakeClient) -> None:
    make_client()
    assert llm_server.requests == []
    with pytest.raises(ValueError):
        LLMClient(api_key="", model=HAIKU)
    with pytest.raises(ValueError):
        LLMClient(api_key=API_KEY, model=HAIKU, timeout_s=0)
