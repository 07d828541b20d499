"""Authenticated HTTP, through the SDK's own streamable-HTTP client against `mnemoplan serve --http`."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from mnemoplan.storage.tokens import TokenStore
from tests.conftest import server_env

START_S = 180.0  # a loaded two-core machine: generous, it is only a deadline


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http(
    data: Path, *args: str, port: int | None = None, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``mnemoplan serve --http`` on ``port`` (default a free loopback one), with ``env`` added to
    its environment, once uvicorn says it listens (a line on its stderr, appended to ``server.log``
    by a thread: a pipe nobody reads fills and blocks it)."""
    port = port or free_port()
    data.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnemoplan", "serve", "--http", "--port", str(port), *args],
        env=server_env(data, **(env or {})), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    listening = threading.Event()

    def copy() -> None:
        with open(data.parent / "server.log", "ab") as log:  # a restarted server's follows the first's
            for line in proc.stderr or []:
                log.write(line)
                log.flush()
                if b"Uvicorn running on" in line:
                    listening.set()
        listening.set()  # the server ended: the assertion below says so

    threading.Thread(target=copy, daemon=True).start()
    assert listening.wait(START_S), "the HTTP server did not start listening"
    assert proc.poll() is None, (data.parent / "server.log").read_text()
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("http") / "data"
    tokens = TokenStore(data)
    alice, alice_info = tokens.create(user_id="alice")
    bob, _ = tokens.create(user_id="bob")
    admin, _ = tokens.create(user_id=None, admin=True)
    reader, _ = tokens.create(user_id="alice", read_only=True)
    proc, base = start_http(data)
    yield {"url": f"{base}/mcp", "base": base, "alice": alice, "alice_id": alice_info.id, "bob": bob,
           "admin": admin, "reader": reader, "tokens": tokens}  # fmt: skip
    stop(proc)


async def _session(url: str, token: str | None, scenario: Any) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
            return await scenario(client)


def run(url: str, token: str | None, scenario: Any) -> Any:
    return anyio.run(_session, url, token, scenario)


async def ok(client: Any, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content


async def refused(client: Any, tool: str, **args: Any) -> str:
    result = await client.call_tool(tool, args)
    assert result.is_error, f"{tool}({args}) should have failed: {result.structured_content}"
    return " ".join(c.text for c in result.content)


def test_no_token_or_an_unknown_one_is_refused_with_401(server: dict[str, Any]) -> None:
    for headers in ({}, {"Authorization": "Bearer junk"}, {"Authorization": "Bearer mnp_" + "x" * 43}):
        reply = httpx2.post(server["url"], json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                            headers={**headers, "Accept": "application/json, text/event-stream"})  # fmt: skip
        assert reply.status_code == 401
        assert "resource_metadata=" in reply.headers["www-authenticate"]
    with pytest.raises(Exception):  # noqa: B017 (the SDK's client: the handshake itself fails)
        run(server["url"], None, lambda client: client.list_tools())


def test_the_web_view_on_a_server_with_tokens_asks_for_one_and_keeps_to_its_user(server: dict[str, Any]) -> None:
    """The view takes the MCP endpoint's tokens: sign in once (a same-site cookie) or send a bearer
    header; a user's token shows that user only, a read-only one never forgets, a revoked one is
    refused at the next page."""
    base, tokens = server["base"], server["tokens"]
    carol, carol_info = tokens.create(user_id="carol", note="web view")
    reader, _ = tokens.create(user_id="carol", read_only=True)
    admin = server["admin"]

    async def as_carol(client: Any) -> str:
        return (await ok(client, "remember", content="Carol sings in a choir"))["ids"][0]

    rid = run(server["url"], carol, as_carol)
    page = httpx2.get(f"{base}/view/sessions?user=carol")
    assert page.status_code == 401 and 'action="/view/sign-in"' in page.text
    own = {"origin": base}
    with httpx2.Client(base_url=base) as browser:
        assert browser.post("/view/sign-in", data={"token": "mnp_" + "x" * 43}, headers=own).status_code == 401
        assert browser.post("/view/sign-in", data={"token": carol}, headers={"origin": "http://evil.example"}
                            ).status_code == 403  # fmt: skip
        signed = browser.post("/view/sign-in", data={"token": carol}, headers=own)
        assert signed.status_code == 303 and "httponly" in signed.headers["set-cookie"].lower()
        assert "samesite=strict" in signed.headers["set-cookie"].lower()
        users = browser.get("/view/")
        assert users.status_code == 200 and "carol" in users.text and "alice" not in users.text
        assert browser.get("/view/session?user=carol&id=default").status_code in (200, 404)
        assert browser.get("/view/sessions?user=bob").status_code == 403
        assert browser.get("/view/graph.json?user=bob").status_code == 403
        assert browser.get("/view/search?user=carol&q=choir").status_code == 200
        assert "Carol sings" in browser.get(f"/view/forget?user=carol&id={rid}").text
        tokens.revoke(carol_info.id)
        assert browser.get("/view/sessions?user=carol").status_code == 401
    reading = {"Authorization": f"Bearer {reader}", **own}
    assert httpx2.get(f"{base}/view/sessions?user=carol", headers=reading).status_code == 200
    assert httpx2.post(f"{base}/view/forget?user=carol", data={"id": rid}, headers=reading).status_code == 403
    as_admin = {"Authorization": f"Bearer {admin}", **own}
    assert httpx2.get(f"{base}/view/sessions?user=bob", headers=as_admin).status_code == 200
    done = httpx2.post(f"{base}/view/forget?user=carol", data={"id": rid}, headers=as_admin)
    assert done.status_code == 200 and "Forgotten" in done.text


def test_protected_resource_metadata_names_the_server(server: dict[str, Any]) -> None:
    meta = httpx2.get(f"{server['base']}/.well-known/oauth-protected-resource/mcp").json()
    assert meta["resource"] == server["url"]
    assert meta["authorization_servers"]


def test_a_user_token_reaches_only_its_user(server: dict[str, Any]) -> None:
    async def as_bob(client: Any) -> None:
        stored = await ok(client, "remember", content="Bob keeps bees in Tromsø")  # user_id from the token
        assert stored["stored"] == 1
        found = await ok(client, "recall", query="What does Bob keep?", user_id="bob")
        assert found["user_id"] == "bob" and found["items"]

    run(server["url"], server["bob"], as_bob)

    async def as_alice(client: Any) -> None:
        await ok(client, "remember", content="Alice plays the cello")
        own = await ok(client, "recall", query="What does Alice play?")
        assert own["user_id"] == "alice" and "Alice plays the cello" in [i["text"] for i in own["items"]]
        for tool, args in (
            ("recall", {"query": "bees", "user_id": "bob"}),
            ("deep_memory_search", {"query": "bees", "user_id": "bob"}),
            ("explain_plan", {"query": "bees", "user_id": "bob"}),
            ("remember", {"content": "planted", "user_id": "bob"}),
            ("forget", {"scope": "user", "user_id": "bob"}),
        ):
            text = await refused(client, tool, **args)
            assert "[forbidden]" in text, text

    run(server["url"], server["alice"], as_alice)

    async def bob_intact(client: Any) -> None:
        found = await ok(client, "recall", query="What does Bob keep?")
        assert "Bob keeps bees in Tromsø" in [i["text"] for i in found["items"]]
        assert all("planted" not in i["text"] for i in found["items"])

    run(server["url"], server["bob"], bob_intact)


def test_an_admin_token_may_name_any_user(server: dict[str, Any]) -> None:
    async def as_admin(client: Any) -> None:
        await ok(client, "remember", content="Carol runs marathons", user_id="carol")
        found = await ok(client, "recall", query="What does Carol run?", user_id="carol")
        assert "Carol runs marathons" in [i["text"] for i in found["items"]]
        other = await ok(client, "recall", query="cello", user_id="alice")
        assert other["user_id"] == "alice"

    run(server["url"], server["admin"], as_admin)


def test_a_read_only_token_cannot_write(server: dict[str, Any]) -> None:
    async def as_reader(client: Any) -> None:
        assert "[forbidden]" in await refused(client, "remember", content="sneaky")
        assert "[forbidden]" in await refused(client, "forget", scope="user")
        await ok(client, "recall", query="cello")

    run(server["url"], server["reader"], as_reader)


def test_a_revoked_token_is_refused_at_once(server: dict[str, Any]) -> None:
    async def revoked_mid_session(client: Any) -> None:
        await ok(client, "recall", query="cello")
        server["tokens"].revoke(server["alice_id"])
        with pytest.raises(Exception):  # noqa: B017 (the next request of the same session: 401)
            await client.call_tool("recall", {"query": "cello"})

    try:
        run(server["url"], server["alice"], revoked_mid_session)
    except Exception as exc:  # closing the refused session may fail too; the check above is what counts
        assert not isinstance(exc, AssertionError), exc
    reply = httpx2.post(server["url"], json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                        headers={"Authorization": f"Bearer {server['alice']}",
                                 "Accept": "application/json, text/event-stream"})  # fmt: skip
    assert reply.status_code == 401


def test_a_public_address_without_tokens_refuses_to_start(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mnemoplan", "serve", "--http", "--host", "0.0.0.0", "--port", str(free_port())],
        env=server_env(tmp_path / "data"), capture_output=True, timeout=START_S,
    )  # fmt: skip
    assert proc.returncode != 0
    assert b"without authentication" in proc.stderr


def test_loopback_without_tokens_serves_with_a_warning(tmp_path: Path) -> None:
    proc, base = start_http(tmp_path / "data")
    try:

        async def open_call(client: Any) -> None:
            await ok(client, "remember", content="Dave likes tea", user_id="dave")

        run(f"{base}/mcp", None, open_call)
    finally:
        stop(proc)
    assert "without authentication" in (tmp_path / "server.log").read_text()


def test_the_sdk_host_and_origin_checks_stay_on(server: dict[str, Any]) -> None:
    """DNS rebinding: a page on another site must not reach the server, even with a valid token."""
    headers = {"Authorization": f"Bearer {server['admin']}", "Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    host = httpx2.post(server["url"], json=body, headers={**headers, "Host": "evil.example"})
    origin = httpx2.post(server["url"], json=body, headers={**headers, "Origin": "http://evil.example"})
    assert host.status_code == 421 and origin.status_code == 403
