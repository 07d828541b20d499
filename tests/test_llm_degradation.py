"""An LLM never at a write's expense: the bad-reply corpus and every provider error, through a
service talking to each API (Anthropic Messages, OpenAI chat completions) on a loopback server.

For each case: remember stores every word, unaltered, and answers without waiting for the LLM;
the rules' reading stays; the user's next remember names what went wrong with the extraction,
once; deep search answers from the rules and names each LLM step that fell back; nothing is an
internal error. With no LLM configured, no socket is opened at all.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mnemoplan.model import MessageIn
from mnemoplan.service.service import MemoryService
from tests.conftest import make_service
from tests.llm_corpus import ERRORS, FACT, UNUSABLE, USABLE
from tests.llm_server import LoopbackLLMServer, Reply

SAID = ["Rehearsal went long tonight", "The quartet needs me on cello again"]
HANG = Reply(text="{}", delay_s=600)  # answered only when the server stops


def llm_settings(server: LoopbackLLMServer) -> dict[str, Any]:
    """A service's settings for the server: Anthropic named the old way (its key alone), OpenAI
    the new way (provider, base URL, model, no key)."""
    common = {"llm_timeout_s": 2.0, "deep_deadline_s": 4.0, "llm_extraction_every": 2,
              "remember_in_background": True}  # fmt: skip
    if server.api == "anthropic":
        return {"ANTHROPIC_API_KEY": "sk-test", "ANTHROPIC_BASE_URL": server.base_url, **common}
    return {"llm_provider": "openai", "llm_base_url": server.base_url, "llm_model": "llama3.2:3b", **common}


class Cases:
    """The server's responder: every request of the case under way gets its reply."""

    def __init__(self) -> None:
        self.reply: Reply = Reply(text="{}")

    def __call__(self, request: dict[str, Any]) -> Reply:
        return self.reply


@pytest.fixture(params=["anthropic", "openai"], scope="module")
def llm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[LoopbackLLMServer, Cases, MemoryService]]:  # fmt: skip
    cases = Cases()
    with LoopbackLLMServer(responder=cases, api=request.param) as server:
        service = make_service(tmp_path_factory.mktemp(request.param) / "data", **llm_settings(server))
        try:
            yield server, cases, service
        finally:
            service.close()


def messages_of(service: MemoryService, user: str) -> list[str]:
    return sorted(r["text"] for r in service.store.log.select(f"user_id = '{user}' AND kind = 'message'", ["text"]))


def remember_through(service: MemoryService, user: str) -> list[str]:
    """Remember SAID (extraction due at once), wait for the extraction; the next remember's warnings."""
    first = service.remember(messages=[MessageIn(content=t, speaker="Ivo") for t in SAID], user_id=user,
                             session_id="s", flush=True)  # fmt: skip
    assert first.stored == 2 and not first.warnings
    service.extraction.drain()
    assert messages_of(service, user) == sorted(SAID)  # every word, unaltered
    return service.remember(content="Anything on for the weekend?", speaker="Ivo", user_id=user,
                            session_id="s2").warnings  # fmt: skip


DEGRADED = {**{f"reply:{k}": (v, "malformed reply") for k, v in UNUSABLE.items()},
            **{f"error:{k}": v for k, v in ERRORS.items()}, "error:hanging": (HANG, "timeout")}


def test_bad_replies_and_provider_errors_cost_no_write_and_are_named(
    llm: tuple[LoopbackLLMServer, Cases, MemoryService],
) -> None:
    server, cases, service = llm
    for name, (reply, named) in DEGRADED.items():
        cases.reply = reply
        user = f"u-{name.replace(':', '-')}"
        warnings = remember_through(service, user)
        told = [w for w in warnings if w.startswith("LLM extraction of 2 message(s) did not run")]
        assert len(told) == 1 and named in told[0] and "rules' reading" in told[0], (name, warnings)
        facts = service.store.log.select(f"user_id = '{user}' AND kind = 'fact'", ["metadata"])
        assert all(json.loads(f["metadata"]).get("extractor") != "llm" for f in facts), name
        if name.startswith("reply:") and name not in ("reply:truncated", "reply:empty"):
            continue  # every other bad reply takes deep search down the same path as these two
        result = service.deep_search("cello quartet rehearsal", user_id=user)
        assert SAID[1] in [i.text for i in result.items], name  # the rules' answer
        steps = [w for w in result.warnings if "fell back" in w or "skipped" in w or "rerank batch" in w]
        assert steps, (name, result.warnings)
        if name != "error:hanging":  # a hang is named as timed out, or as the deadline it ran into
            assert any(named in w for w in steps), (name, result.warnings)
        assert service.recall("cello", user_id=user).items


def test_a_failure_is_told_once_not_at_every_retry(llm: tuple[LoopbackLLMServer, Cases, MemoryService]) -> None:
    server, cases, service = llm
    cases.reply = ERRORS["server_error"][0]
    user = "u-told-once"
    assert len(remember_through(service, user)) == 1
    service.extraction.retry_now(user)
    service.extraction.drain()  # failed again, the same way
    assert service.remember(content="and again", user_id=user, session_id="s3").warnings == []


def test_messy_but_usable_replies_are_read(llm: tuple[LoopbackLLMServer, Cases, MemoryService]) -> None:
    server, cases, service = llm
    for name, text in USABLE.items():
        cases.reply = Reply(text=text)
        user = f"u-usable-{name}"
        assert remember_through(service, user) == [], name
        facts = service.store.log.select(f"user_id = '{user}' AND kind = 'fact'", ["text", "metadata"])
        assert [f["text"] for f in facts if json.loads(f["metadata"]).get("extractor") == "llm"] == \
            [FACT["content"]], name  # fmt: skip


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_an_llm_server_that_is_down_costs_nothing_either(tmp_path: Path, api: str) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}" + ("/v1" if api == "openai" else "")
    settings = {"llm_provider": api, "llm_base_url": url, "llm_model": "m", "llm_api_key": "k",
                "llm_extraction_every": 2, "remember_in_background": True}  # fmt: skip
    service = make_service(tmp_path / "data", **settings)
    try:
        warnings = remember_through(service, "u")
        assert any("connection error" in w for w in warnings), warnings
        result = service.deep_search("cello quartet", user_id="u")
        assert SAID[1] in [i.text for i in result.items]
        assert any("connection error" in w for w in result.warnings)
    finally:
        service.close()


def test_without_an_llm_no_socket_is_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither to a provider nor anywhere else: every path of the service, with no LLM configured
    (and the environment's LLM variables cleared)."""
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "MNEMOPLAN_LLM_PROVIDER", "MNEMOPLAN_LLM_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    opened: list[tuple[str, Any]] = []
    watching = [True]

    def audit(event: str, args: Any) -> None:
        if watching[0] and event in ("socket.__new__", "socket.connect", "socket.getaddrinfo"):
            opened.append((event, args))

    sys.addaudithook(audit)  # a hook cannot be removed: it stops watching when the test ends
    try:
        service = make_service(tmp_path / "data", remember_in_background=True)
        try:
            assert service.extraction is None
            stored = service.remember(messages=[MessageIn(content=t, speaker="Ivo") for t in SAID], user_id="u",
                                      session_id="s", flush=True)  # fmt: skip
            assert service.recall("cello", user_id="u").items
            assert service.deep_search("cello quartet", user_id="u").items
            service.explain_plan("cello", user_id="u")
            service.forget(ids=stored.ids[:1], user_id="u")
        finally:
            service.close()
    finally:
        watching[0] = False
    assert opened == []


def test_an_llm_that_is_down_is_not_asked_at_every_remember(tmp_path: Path) -> None:
    """A failed batch waits out its backoff: messages that join it meanwhile add no request."""
    with LoopbackLLMServer(api="openai", responder=lambda _: ERRORS["server_error"][0]) as server:
        service = make_service(tmp_path / "data", llm_provider="openai", llm_base_url=server.base_url,
                               llm_model="m", llm_extraction_every=1)  # fmt: skip
        try:
            for i in range(5):
                service.remember(content=f"message {i}", speaker="Ivo", user_id="u", session_id="s")
                service.extraction.drain()
            assert len(server.requests) == 2  # the first message's run: one request and its retry
            assert messages_of(service, "u") == [f"message {i}" for i in range(5)]
        finally:
            service.close()
