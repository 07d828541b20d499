"""LLMClient through both APIs (Anthropic Messages, OpenAI chat completions), on loopback servers,
with the real client libraries: the bad-reply corpus, every provider error, structured output
and its fallbacks, the call record against what the server saw, and the caps."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from mnemoplan.errors import LLMError
from mnemoplan.inference.llm import LLMClient, LLMReply
from mnemoplan.inference.llm_calls import DailyCap, MemoryRecorder, llm_scope
from mnemoplan.ingest.llm_extractor import _Reply as FactsReply
from tests.llm_corpus import ERRORS, FACT, GOOD, UNUSABLE, USABLE
from tests.llm_server import LoopbackLLMServer, Reply

APIS = ["anthropic", "openai"]
MODEL = {"anthropic": "claude-haiku-4-5", "openai": "llama3.2:3b"}

MakeClient = Callable[..., LLMClient]


@pytest.fixture(params=APIS)
def server(request: pytest.FixtureRequest) -> Iterator[LoopbackLLMServer]:
    with LoopbackLLMServer(api=request.param) as running:
        yield running


@pytest.fixture
def recorder() -> MemoryRecorder:
    return MemoryRecorder()


@pytest.fixture
def make_client(server: LoopbackLLMServer, recorder: MemoryRecorder) -> Iterator[MakeClient]:
    made: list[LLMClient] = []

    def make(**overrides: Any) -> LLMClient:
        key = "sk-test-0123456789" if server.api == "anthropic" else None  # a local server takes none
        options: dict[str, Any] = {"provider": server.api, "api_key": key, "model": MODEL[server.api],
                                   "base_url": server.base_url, "timeout_s": 5.0, "recorder": recorder}  # fmt: skip
        options.update(overrides)
        made.append(LLMClient(**options))
        return made[-1]

    yield make
    for client in made:
        client.close()


def extract(client: LLMClient, **kwargs: Any) -> LLMReply:
    return client.complete_json(system="Extract facts as JSON.", prompt="1. Ivo: cello again tonight",
                                purpose="extract", schema=FactsReply, **kwargs)  # fmt: skip


def sums(recorder: MemoryRecorder) -> tuple[int, int, int]:
    sent = [c for c in recorder.calls if c.sent]
    return len(sent), sum(c.input_tokens for c in sent), sum(c.output_tokens for c in sent)


def assert_record_matches_server(recorder: MemoryRecorder, server: LoopbackLLMServer) -> None:
    assert sums(recorder) == (len(server.requests), *server.tokens_served)


# --- the corpus -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(USABLE))
def test_messy_but_usable_replies_are_read_without_a_repair(
    name: str, server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    server.script(Reply(text=USABLE[name], input_tokens=120, output_tokens=40))
    reply = extract(make_client())
    assert reply.value.facts[0].content == FACT["content"] and reply.attempts == 1
    assert [c.outcome for c in recorder.calls] == ["ok"]
    assert_record_matches_server(recorder, server)


@pytest.mark.parametrize("name", sorted(UNUSABLE))
def test_an_unusable_reply_is_repaired_once(
    name: str, server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    server.script(UNUSABLE[name], Reply(text=GOOD))
    reply = extract(make_client())
    assert reply.value.facts[0].content == FACT["content"] and reply.attempts == 2
    repair = server.requests[1]["messages"]
    assert repair[-2]["role"] == "assistant" and repair[-1]["role"] == "user"
    assert "JSON" in repair[-1]["content"]
    assert [c.outcome for c in recorder.calls][1] == "ok" and recorder.calls[0].outcome != "ok"
    assert_record_matches_server(recorder, server)


@pytest.mark.parametrize("name", sorted(UNUSABLE))
def test_unusable_twice_is_an_llm_error_naming_why(
    name: str, server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    server.script(UNUSABLE[name], UNUSABLE[name])
    with pytest.raises(LLMError) as info:
        extract(make_client())
    assert "malformed reply, even after a repair" in info.value.message and info.value.hint
    assert len(server.requests) == 2
    assert_record_matches_server(recorder, server)


def test_a_cut_off_reply_is_repaired_with_room_to_finish(server: LoopbackLLMServer, make_client: MakeClient) -> None:
    server.script(UNUSABLE["truncated"], Reply(text=GOOD))
    extract(make_client(), max_tokens=300)
    limits = [r.get("max_tokens") for r in server.requests]
    assert limits == [300, 600]


def test_a_refusal_the_api_reports_apart_is_named(
    server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    refusal = (Reply(refusal="I can't assist with that.") if server.api == "openai"
               else Reply(text="", stop_reason="refusal"))  # fmt: skip
    server.script(refusal, refusal)
    with pytest.raises(LLMError, match="refused"):
        extract(make_client())
    assert [c.outcome for c in recorder.calls] == ["refusal", "refusal"]


# --- provider errors --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_every_provider_error_is_an_llm_error_with_a_hint(
    name: str, server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    failure, named = ERRORS[name]
    server.responder = lambda _: failure
    with pytest.raises(LLMError) as info:
        extract(make_client(max_retries=2))
    assert named in info.value.message and info.value.hint
    retried = failure.status in (429, 500, 502, 529)
    assert len(server.requests) == (3 if retried else 1)
    assert all(c.outcome != "ok" for c in recorder.calls)
    assert_record_matches_server(recorder, server)


def test_a_rate_limit_is_retried_after_what_the_server_asks(
    server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    server.script(Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "0.2"}), Reply(text=GOOD))
    reply = extract(make_client(max_retries=1))
    assert reply.attempts == 2 and [c.outcome for c in recorder.calls] == ["http_429", "ok"]


def test_a_long_retry_after_is_not_waited_for_within_the_call(
    server: LoopbackLLMServer, make_client: MakeClient
) -> None:
    server.script(Reply(status=429, error_type="rate_limit_error", headers={"retry-after": "120"}))
    with pytest.raises(LLMError, match="retry after 120 s"):
        extract(make_client(max_retries=3))
    assert len(server.requests) == 1


def test_an_unknown_model_says_which_setting_to_check(server: LoopbackLLMServer, make_client: MakeClient) -> None:
    server.responder = lambda body: (Reply(text=GOOD) if body["model"] == MODEL[server.api] else
                                     Reply(status=404, error_type="not_found_error", message="model not found"))
    with pytest.raises(LLMError) as info:
        extract(make_client(model="llama9:70b"))
    assert "404" in info.value.message and "MNEMOPLAN_LLM_MODEL" in info.value.hint
    assert extract(make_client()).value.facts


def test_a_hanging_server_is_a_timeout_not_retried(
    server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    server.script(Reply(text=GOOD, delay_s=600))  # answered only when the server stops
    with pytest.raises(LLMError, match="timeout"):
        extract(make_client(timeout_s=0.5, max_retries=3))
    assert len(server.requests) == 1 and [c.outcome for c in recorder.calls] == ["timeout"]


@pytest.mark.parametrize("api", APIS)
def test_a_refused_connection_is_retried_then_reported(api: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    recorder = MemoryRecorder()
    url = f"http://127.0.0.1:{port}" + ("/v1" if api == "openai" else "")
    client = LLMClient(provider=api, api_key="k", model="m", base_url=url,  # type: ignore[arg-type]
                       max_retries=1, recorder=recorder)  # fmt: skip
    with pytest.raises(LLMError, match="connection error after 2 request") as info:
        extract(client)
    assert "MNEMOPLAN_LLM_BASE_URL" in info.value.hint
    assert [c.outcome for c in recorder.calls] == ["connection", "connection"]
    client.close()


# --- structured output ------------------------------------------------------------------------


class _Open(BaseModel):
    scores: dict[str, float]


def test_structured_output_goes_by_each_servers_own_means(server: LoopbackLLMServer, make_client: MakeClient) -> None:
    server.script(Reply(text=GOOD), Reply(text='{"scores": {"a": 1}}'), Reply(text='{"any": 1}'))
    client = make_client()
    extract(client)
    client.complete_json(system="s", prompt="p", schema=_Open)
    client.complete_json(system="s", prompt="p")
    facts, scores, free = server.requests
    if server.api == "openai":
        sent = facts["response_format"]
        assert sent["type"] == "json_schema" and sent["json_schema"]["schema"]["required"] == ["facts"]
        assert scores["response_format"]["type"] == "json_schema"  # an open map is fine here
        assert free["response_format"] == {"type": "json_object"}
        assert facts["messages"][0] == {"role": "system", "content": "Extract facts as JSON."}
    else:
        schema = facts["output_config"]["format"]["schema"]
        assert schema["additionalProperties"] is False
        assert schema["properties"]["facts"]["items"]["additionalProperties"] is False
        assert "output_config" not in scores and "output_config" not in free  # an open map; no schema


def test_a_server_rejecting_a_format_is_asked_without_it_from_then_on(
    server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    """LM Studio refuses JSON mode, older servers refuse JSON schema: each refusal costs one
    request, once; the schema stays in the prompt either way."""
    key = "response_format" if server.api == "openai" else "output_config"

    def picky(body: dict[str, Any]) -> Reply:
        if key in body:
            return Reply(status=400, error_type="invalid_request_error", message=f"{key}: not supported here")
        return Reply(text=GOOD)

    server.responder = picky
    client = make_client()
    assert extract(client).value.facts and extract(client).value.facts
    sent = [key in r for r in server.requests]
    expected = [True, True, False, False] if server.api == "openai" else [True, False, False]
    assert sent == expected  # json_schema, then json_object, then neither; the next call asks plainly
    assert [c.outcome for c in recorder.calls].count("format_rejected") == expected.count(True)
    assert_record_matches_server(recorder, server)


def test_structured_output_can_be_turned_off(server: LoopbackLLMServer, make_client: MakeClient) -> None:
    server.script(Reply(text=GOOD))
    extract(make_client(structured="prompt"))
    assert not {"response_format", "output_config"} & set(server.requests[0])


def test_a_local_server_needs_no_key(server: LoopbackLLMServer, make_client: MakeClient) -> None:
    if server.api == "anthropic":
        pytest.skip("the Anthropic API always takes a key")
    server.script(Reply(text=GOOD))
    assert extract(make_client(api_key=None)).value.facts
    assert {k.lower(): v for k, v in server.request_headers[0].items()}["authorization"] == "Bearer not-needed"


# --- the call record and the caps -------------------------------------------------------------


def test_the_call_record_adds_up_to_what_the_server_saw(
    server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    def respond(body: dict[str, Any]) -> Reply:
        prompt = server.user_prompt(body)
        n = int(prompt.split()[-1])
        if n % 5 == 0:
            return Reply(status=503, error_type="overloaded_error", headers={"retry-after": "0"})
        if n % 3 == 0 and len(body["messages"]) <= 2:
            return Reply(text="no JSON here", input_tokens=7 * n, output_tokens=n)
        return Reply(text=GOOD, input_tokens=11 * n, output_tokens=3 * n)

    server.responder = respond
    client = make_client(max_retries=1)
    with llm_scope("deep_memory_search"):
        results = client.complete_json_many(
            [{"system": "s", "prompt": f"item {n}", "schema": FactsReply, "purpose": "rerank"} for n in range(1, 31)],
            max_in_flight=6)  # fmt: skip
    assert sum(isinstance(r, LLMError) for r in results) == 6  # 5, 10, ... 30: 503 twice each
    assert_record_matches_server(recorder, server)
    assert {c.tool for c in recorder.calls} == {"deep_memory_search"}  # worker threads kept the scope
    assert {c.provider for c in recorder.calls} == {server.api} and all(c.latency_ms >= 0 for c in recorder.calls)
    assert sum(c.cost_usd for c in recorder.calls) == pytest.approx(client.usage.cost_usd)


@pytest.mark.parametrize("cap", [1, 3, 7])
def test_a_scope_cap_holds_exactly_under_concurrency(
    cap: int, server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    release = threading.Event()
    server.responder = lambda _: (release.wait(30), Reply(text=GOOD))[1]
    client = make_client()
    with llm_scope("deep_memory_search", cap, "MNEMOPLAN_LLM_MAX_CALLS_PER_SEARCH") as scope:
        threading.Timer(0.2, release.set).start()
        results = client.complete_json_many([{"system": "s", "prompt": f"p{i}", "schema": FactsReply}
                                             for i in range(10)], max_in_flight=10)  # fmt: skip
    assert len(server.requests) == cap and scope.sent == cap and scope.capped == 10 - cap
    capped = [r for r in results if isinstance(r, LLMError)]
    assert len(capped) == 10 - cap and all(r.code == "llm_capped" for r in capped)
    assert all("MNEMOPLAN_LLM_MAX_CALLS_PER_SEARCH" in r.message for r in capped)
    assert sum(1 for c in recorder.calls if not c.sent) == 10 - cap
    assert_record_matches_server(recorder, server)


def test_the_daily_cap_is_shared_and_exact(
    server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    server.responder = lambda _: Reply(text="not JSON")  # every call makes two requests
    daily = DailyCap(5, sent_today=2)  # two sent earlier today (before a restart)
    first, second = make_client(daily_cap=daily), make_client(daily_cap=daily, model="other")
    errors = [pytest.raises(LLMError, extract, c) for c in (first, second, first)]
    assert len(server.requests) == 3  # 2 + 3 = the cap of 5
    assert "MNEMOPLAN_LLM_MAX_CALLS_PER_DAY" in errors[1].value.message and errors[2].value.code == "llm_capped"


def test_the_extraction_model_shares_the_record_and_the_cap(
    server: LoopbackLLMServer, make_client: MakeClient, recorder: MemoryRecorder
) -> None:
    server.responder = lambda _: Reply(text=GOOD)
    main = make_client(daily_cap=DailyCap(2))
    small = main.with_model("qwen2.5:0.5b")
    extract(main), extract(small)
    with pytest.raises(LLMError, match="a day"):
        extract(small)
    assert [r["model"] for r in server.requests] == [MODEL[server.api], "qwen2.5:0.5b"]
    assert [c.model for c in recorder.calls if c.sent] == [MODEL[server.api], "qwen2.5:0.5b"]


def test_the_api_key_never_reaches_an_error_or_a_record(server: LoopbackLLMServer, make_client: MakeClient,
                                                         recorder: MemoryRecorder) -> None:  # fmt: skip
    secret = "sk-SECRET-abcdef0123456789"
    server.script(Reply(status=401, error_type="authentication_error", message=f"bad key Bearer {secret}"))
    with pytest.raises(LLMError) as info:
        extract(make_client(api_key=secret))
    assert secret not in info.value.message and "[redacted]" in info.value.message
    assert secret not in json.dumps([c.as_dict() for c in recorder.calls])
