"""`mnemoplan serve` over stdio, spoken to line by line (every request gets an answer) or from a terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.conftest import make_service, run_with_client, server_env
from tests.test_mcp_stdio import texts

ANSWER_TIMEOUT_S = 600.0  # only reached when an answer never comes (the first call loads the model)


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
    proc = subprocess.Popen([sys.executable, "-m", "mnemoplan", "serve"], stdin=subprocess.PIPE,
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


class Terminal:
    """`mnemoplan serve` in a pseudo-terminal of its own, as a person starts it from a shell."""

    def __init__(self, data_dir: Path, sigint: Any = signal.SIG_DFL) -> None:
        """``sigint``: how the server's parent left SIGINT (a shell's background job ignores it)."""

        def in_child() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)  # the terminal's keys signal it
            signal.signal(signal.SIGINT, sigint)

        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mnemoplan", "serve"], stdin=slave, stdout=slave, stderr=slave,
            env=server_env(data_dir), start_new_session=True, preexec_fn=in_child,
        )  # fmt: skip
        os.close(slave)
        self.output = b""

    def read_until(self, done: Callable[[], bool]) -> bool:
        """Read what the terminal shows until ``done()``, the terminal closes, or the time is up;
        whether it closed (every process, the server's children too, has let go of it)."""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not done() and time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            try:
                chunk = os.read(self.master, 65536) if ready else b""
            except OSError:  # EIO: the terminal is closed
                return True
            if not chunk and ready:
                return True
            self.output += chunk
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


@pytest.mark.parametrize("serving", [False, True], ids=["at-once", "serving"])
@pytest.mark.parametrize(("key", "exit_code"), [(b"\x03", 130), (b"\x04", 0)], ids=["ctrl-c", "ctrl-d"])
def test_serve_in_a_terminal_says_it_waits_for_a_client_and_stops_on_ctrl_c_or_ctrl_d(
    tmp_path: Path, key: bytes, exit_code: int, serving: bool
) -> None:
    terminal = Terminal(tmp_path / "data")
    try:
        terminal.read_until(lambda: b"waiting for an MCP client" in terminal.output)
        assert b"waiting for an MCP client" in terminal.output, terminal.output
        assert b"Ctrl-C" in terminal.output and b"Ctrl-D" in terminal.output
        if serving:  # a client, typed in: the server answers, then waits on stdin again
            client = {"name": "tty", "version": "0"}
            hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
            remember = {"name": "remember", "arguments": {"content": "typed in a terminal", "user_id": "tty"}}
            for message in ({"id": 1, "method": "initialize", "params": hello},
                            {"method": "notifications/initialized"},
                            {"id": 2, "method": "tools/call", "params": remember}):  # fmt: skip
                os.write(terminal.master, json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
            terminal.read_until(lambda: b'"stored":1' in terminal.output.replace(b" ", b""))
            assert b'"stored":1' in terminal.output.replace(b" ", b""), terminal.output
        os.write(terminal.master, key)
        closed = terminal.read_until(lambda: False)
        shown = terminal.output.decode(errors="replace")
        assert closed, f"a process still holds the terminal: {shown}"  # the graph's child process, say
        assert terminal.proc.wait(timeout=ANSWER_TIMEOUT_S) == exit_code, shown
        assert "Traceback" not in shown, shown
    finally:
        terminal.close()
    if serving:  # stopped cleanly: the service closed (its socket gone), the stores open again with what was stored
        assert not (tmp_path / "data" / "serve.sock").exists()
        service = make_service(tmp_path / "data")
        try:
            assert [i.text for i in service.recall("typed", user_id="tty").items] == ["typed in a terminal"]
        finally:
            service.close()


@pytest.mark.parametrize("how", ["ctrl-c-with-sigint-inherited-ignored", "sigterm"])
def test_serve_stops_cleanly_on_ctrl_c_even_when_started_ignoring_it_and_on_sigterm(
    tmp_path: Path, how: str
) -> None:
    """A shell starts a background job with SIGINT ignored, and Python then leaves it ignored:
    Ctrl-C did nothing. SIGTERM, how hosts stop a server, killed it without closing its stores."""
    terminal = Terminal(tmp_path / "data", sigint=signal.SIG_IGN if how.startswith("ctrl-c") else signal.SIG_DFL)
    try:
        terminal.read_until(lambda: b"waiting for an MCP client" in terminal.output)
        assert b"waiting for an MCP client" in terminal.output, terminal.output
        if how == "sigterm":
            terminal.proc.send_signal(signal.SIGTERM)
        else:
            os.write(terminal.master, b"\x03")
        closed = terminal.read_until(lambda: False)
        shown = terminal.output.decode(errors="replace")
        assert closed, f"a process still holds the terminal: {shown}"
        assert terminal.proc.wait(timeout=ANSWER_TIMEOUT_S) == (143 if how == "sigterm" else 130), shown
        assert "Traceback" not in shown and "mnemoplan: stopped" in shown, shown
    finally:
        terminal.close()
