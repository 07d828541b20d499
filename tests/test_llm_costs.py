"""Cost you can see and cap: every LLM request a service sends is in its call log, which
``mnemoplan stats`` sums per day and per tool to what the server saw; the caps per remember,
per deep search and per day hold exactly, and what they stop takes the offline path with a
warning."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mnemoplan.cli.main import main
from mnemoplan.inference.llm_calls import today
from mnemoplan.model import MessageIn
from mnemoplan.service.service import MemoryService
from tests.conftest import make_service
from tests.llm_corpus import GOOD
from tests.llm_server import LoopbackLLMServer, Reply

SAID = ["I started pottery classes at the Riverside studio", "The glaze came out a deep blue",
        "My teacher Ana fires the kiln on Fridays", "I want to make a teapot next",
        "We moved the wheel to the garage", "Ana says my centering improved"]  # fmt: skip


def role(server: LoopbackLLMServer, request: dict[str, Any]) -> str:
    system = server.system_prompt(request)
    for word, name in (("You extract", "extract"), ("You judge", "evaluate"), ("You revise", "replan"),
                       ("You plan", "plan"), ("You help search", "expand")):  # fmt: skip
        if system.startswith(word):
            return name
    return "rerank"


def answer(server: LoopbackLLMServer, request: dict[str, Any]) -> Reply:
    """A well-behaved model: each role's reply, with token counts that differ by role."""
    name = role(server, request)
    if name == "extract":
        return Reply(GOOD, input_tokens=300, output_tokens=60)
    if name == "evaluate":
        return Reply(json.dumps({"sufficient": True, "confidence": 0.8, "diagnosis": "ok"}), 200, 30)
    if name == "expand":
        return Reply(json.dumps({"rewrite": "pottery studio", "hypothetical": "I take pottery classes"}), 90, 20)
    if name == "rerank":
        ids = re.findall(r"\[([0-9a-f]{8,})\]", server.user_prompt(request))
        return Reply(json.dumps({"scores": {i: 5 for i in ids}}), 400, 50)
    return Reply("I would search everything.", 500, 10)  # plans: no JSON, the rules plan


@pytest.fixture(params=["anthropic", "openai"])
def server(request: pytest.FixtureRequest) -> Iterator[LoopbackLLMServer]:
    with LoopbackLLMServer(api=request.param) as running:
        running.responder = lambda body: answer(running, body)
        yield running


def service_for(tmp_path: Path, server: LoopbackLLMServer, **extra: Any) -> MemoryService:
    key = {"llm_api_key": "sk-test"} if server.api == "anthropic" else {}
    settings = {"llm_extraction_every": 2, **key, **extra}
    return make_service(tmp_path / "data", llm_provider=server.api, llm_base_url=server.base_url,
                        llm_model="some-model", **settings)  # fmt: skip


def store(service: MemoryService, user: str = "u", flush: bool = True) -> list[str]:
    """Remember SAID in one call, extraction due at once; the warnings of the user's next remember."""
    service.remember(messages=[MessageIn(content=t, speaker="Mo") for t in SAID], user_id=user, session_id="s",
                     flush=flush)  # fmt: skip
    service.extraction.drain()
    return service.remember(content="Off to the studio", user_id=user, session_id="s2").warnings


def test_stats_sums_the_calls_per_day_and_tool_to_what_the_server_saw(
    tmp_path: Path, server: LoopbackLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    service = service_for(tmp_path, server, llm_max_calls_per_remember=0)
    try:
        assert store(service) == []
        result = service.deep_search("pottery teacher", user_id="u")
        service.recall("pottery", user_id="u")  # no LLM in recall by default
    finally:
        service.close()
    seen = [role(server, r) for r in server.requests]
    assert seen.count("extract") == 3 and "rerank" in seen  # six messages read two at a time
    assert main(["stats", "--data-dir", str(tmp_path / "data"), "--json"]) == 0
    day = json.loads(capsys.readouterr().out)["llm_calls"][today()]
    assert set(day) == {"remember", "deep_memory_search"}
    assert day["remember"]["calls"] == 3 and day["remember"]["input_tokens"] == 900
    assert day["deep_memory_search"]["calls"] == len(seen) - 3 == result.stats.llm_calls + 1  # + the plan's repair
    assert sum(d["calls"] for d in day.values()) == len(server.requests)
    assert [sum(d[k] for d in day.values()) for k in ("input_tokens", "output_tokens")] == server.tokens_served
    assert day["deep_memory_search"]["outcomes"]["not_json"] == 2  # the plan and its repair
    assert main(["stats", "--data-dir", str(tmp_path / "data")]) == 0
    assert f"{today()} remember: 3 calls (3 ok)" in capsys.readouterr().out


def test_the_cap_per_remember_holds_and_the_rest_waits(tmp_path: Path, server: LoopbackLLMServer) -> None:
    service = service_for(tmp_path, server, llm_max_calls_per_remember=2)
    try:
        warnings = store(service)
        assert [role(server, r) for r in server.requests] == ["extract", "extract"]
        assert len(warnings) == 1 and "MNEMOPLAN_LLM_MAX_CALLS_PER_REMEMBER" in warnings[0]
        assert "did not run" in warnings[0] and "next messages" in warnings[0]
        assert len([i for ids in service.extraction.pending.values() for i in ids]) == 3  # 2 of SAID, 1 new
        service.remember(content="The kiln is hot", user_id="u", session_id="s", flush=True)
        service.extraction.drain()  # the session's next remember reads what waited, under its own cap
        assert [role(server, r) for r in server.requests] == ["extract"] * 4
    finally:
        service.close()


def test_the_cap_per_deep_search_holds_exactly(tmp_path: Path, server: LoopbackLLMServer) -> None:
    service = service_for(tmp_path, server, llm_max_calls_per_search=3, llm_extraction_every=100)
    try:
        store(service, flush=False)  # no extraction: only the search's requests are counted
        assert server.requests == []
        result = service.deep_search("pottery teacher", user_id="u")
        assert len(server.requests) == 3
        capped = [w for w in result.warnings if "MNEMOPLAN_LLM_MAX_CALLS_PER_SEARCH" in w]
        assert capped and result.items  # the rules answered
        service.deep_search("glaze colour", user_id="u")  # a new search, a new allowance
        assert len(server.requests) == 6
    finally:
        service.close()


def test_the_daily_cap_counts_what_was_sent_before_a_restart(tmp_path: Path, server: LoopbackLLMServer) -> None:
    service = service_for(tmp_path, server, llm_max_calls_per_day=4)
    try:
        store(service)  # three extraction requests
    finally:
        service.close()
    service = service_for(tmp_path, server, llm_max_calls_per_day=4)
    try:
        result = service.deep_search("pottery teacher", user_id="u")
        assert len(server.requests) == 4
        assert any("MNEMOPLAN_LLM_MAX_CALLS_PER_DAY" in w for w in result.warnings)
    finally:
        service.close()


def test_bench_llm_runs_offline_and_with_the_llm_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_bench import write_dataset

    messages, questions = write_dataset(tmp_path)
    with LoopbackLLMServer(api="openai") as server:
        server.responder = lambda body: answer(server, body)
        for name, value in {"MNEMOPLAN_LLM_PROVIDER": "openai", "MNEMOPLAN_LLM_BASE_URL": server.base_url,
                            "MNEMOPLAN_LLM_MODEL": "fake"}.items():  # fmt: skip
            monkeypatch.setenv(name, value)
        out = tmp_path / "out"
        assert main(["bench", "--llm", "--messages", str(messages), "--questions", str(questions), "--mode", "deep",
                     "--limit-conversations", "2", "--out", str(out), "--embedding-model", "hash"]) == 0  # fmt: skip
    report = json.loads((out / "llm.json").read_text())
    assert report["llm"]["provider"] == "openai" and set(report["benches"]) == {"updates", "dataset"}
    for runs in report["benches"].values():
        assert runs["offline"]["totals"] == {}  # no request without the LLM
    sent = sum(t["calls"] for runs in report["benches"].values() for t in runs["llm"]["totals"].values())
    assert sent == len(server.requests) > 0
    assert report["benches"]["dataset"]["llm"]["totals"]["deep_memory_search"]["calls"] > 0
    assert report["benches"]["updates"]["llm"]["totals"]["remember"]["calls"] > 0
    text = (out / "llm.md").read_text()
    assert "| figure | offline | with the LLM |" in text and "per message" in text
