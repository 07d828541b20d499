"""`mnemoplan serve` over stdio, spoken to line by line: every request gets an answer."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import run_with_client, server_env
from tests.test_mcp_stdio import texts

ANSWER_TIMEOUT_S = 60.0  # only reached when an answer never comes


class RawClient:
    """A JSON-RPC client writing raw lines to a server's stdin and reading its stdout."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def send(self, line: str | bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write((line.encode() if isinstance(line, str) else line) + b"\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any] | None:
        """The next message from the server, or None if none comes."""
        assert self.proc.stdout
        ready, _, _ = select.select([self.proc.stdout], [], [], ANSWER_TIMEOUT_S)
        return json.loads(self.proc.stdout.readline()) if ready else None

    def call(self, rid: int, tool: str, arguments: str) -> dict[str, Any] | None:
        params = f'{{"name":"{tool}","arguments":{arguments}}}'
        self.send(f'{{"jsonrpc":"2.0","id":{rid},"method":"tools/call","params":{params}}}')
        return self.receive()


@pytest.fixture
def raw(tmp_path: Path) -> Iterator[RawClient]:
    proc = subprocess.Popen([sys.executable, "-m", "mnemoplan.server.cli", "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env(tmp_path / "d"))
    client = RawClient(proc)
    hello = {"name": "raw", "version": "0"}
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": hello}
    client.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}))
    assert client.receive()["id"] == 0
    client.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')
    try:
        yield client
    finally:
        assert proc.stdin
        proc.stdin.close()
        proc.wait(timeout=ANSWER_TIMEOUT_S)


def test_every_request_the_sdk_cannot_read_gets_an_error_with_a_code(raw: RawClient) -> None:
    deep = "[" * 3000 + "]" * 3000
    refused = [
        (1, f'{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"remember","arguments":'
            f'{{"content":"x","metadata":{{"a":{deep}}}}}}}}}', -32600, "nested more deeply"),
        (2, '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":"x"}', -32600, "params"),
        (3, f'{{"jsonrpc":"2.0","params":{{"a":{deep}}},"method":"ping","id":"three"}}', -32600, "nested"),
        (4, '{"jsonrpc":"1.0","id":4,"method":"tools/list"}', -32600, "jsonrpc"),
        (None, "this is not JSON", -32700, "Parse error"),
        (None, '[{"jsonrpc":"2.0","id":6,"method":"tools/list"}]', -32600, "batches"),
    ]
    for rid, line, code, words in refused:
        raw.send(line)
        answer = raw.receive()
        assert answer is not None, f"no answer to {line[:80]}"
        assert answer["id"] == (rid if rid != 3 else "three") and answer["error"]["code"] == code, answer
        assert words in answer["error"]["message"], answer
    # A notification is never answered, even when it cannot be read; the calls after it are.
    raw.send('{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}')
    raw.send('{"jsonrpc":"2.0","id":7,"method":"ping"}')
    assert raw.receive() == {"jsonrpc": "2.0", "id": 7, "result": {}}
    stored = raw.call(8, "remember", '{"content": "the server goes on", "user_id": "raw"}')
    assert stored and stored["id"] == 8 and not stored["result"].get("isError")


def test_metadata_is_kept_shallow_enough_for_its_answers_to_be_read(tmp_path: Path) -> None:
    """Metadata nested near the SDK's parser limit was stored, and every recall that returned it
    was an answer the caller's SDK could not read: the call never ended."""

    def nested(depth: int) -> dict[str, Any]:
        return {"a": json.loads("[" * (depth - 1) + "]" * (depth - 1))}

    async def scenario(client: Any) -> None:
        with anyio.fail_after(ANSWER_TIMEOUT_S):
            result = await client.call_tool("remember", {"content": "a deep note", "user_id": "m",
                                                         "metadata": nested(196)})  # fmt: skip
            assert result.is_error and "nested more than 32 levels deep" in result.content[0].text
            result = await client.call_tool("recall", {"query": "deep note", "user_id": "m"})
            assert texts(result.structured_content) == []
            result = await client.call_tool("remember", {"content": "a deep note", "user_id": "m",
                                                         "metadata": nested(32)})  # fmt: skip
            assert not result.is_error
            result = await client.call_tool("recall", {"query": "deep note", "user_id": "m"})
            assert result.structured_content["items"][0]["metadata"] == nested(32)

    run_with_client(tmp_path / "data", scenario)
