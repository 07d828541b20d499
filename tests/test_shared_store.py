"""One store, every host: two stdio servers and the CLI on one data directory at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from mnemoplan.errors import HolderGone
from mnemoplan.service.share import RemoteService, socket_path
from tests.conftest import make_service, server_env

DEADLINE_S = 180.0  # generous: the machine is shared and slow; only a bound, never a timing


async def ok(client: Any, tool: str, **args: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content


def texts(found: dict[str, Any]) -> list[str]:
    return [item["text"] for item in found["items"]]


def cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mnemoplan", *args], env=server_env(data),
                          capture_output=True, text=True, timeout=DEADLINE_S)  # fmt: skip


def holder_pid(data: Path) -> int:
    remote = RemoteService.connect(socket_path(data), "default")
    assert remote is not None, "nobody holds the data directory"
    return remote._request({"method": "ping"})


async def wait_for(check: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await anyio.sleep(0.2)


def test_two_stdio_servers_and_the_cli_share_one_store_and_survive_a_kill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    params = StdioServerParameters(command=sys.executable, args=["-m", "mnemoplan", "serve"], env=server_env(data))
    acknowledged: list[str] = []

    async def main() -> None:
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(Client(params, mode="legacy"))
            await ok(first, "remember", content="Ingrid lives in Trondheim", user_id="alice", session_id="a")
            acknowledged.append("Ingrid lives in Trondheim")
            await wait_for(lambda: holder_pid_or_none(data) is not None, "the first server to serve the others")
            pid_first = holder_pid(data)

            second = await stack.enter_async_context(Client(params, mode="legacy"))
            await ok(second, "remember", content="Olav keeps bees in Bergen", user_id="alice", session_id="b")
            acknowledged.append("Olav keeps bees in Bergen")
            assert holder_pid(data) == pid_first  # the second relays; it does not hold the directory

            # Each one's writes, recalled through the other, and through the CLI.
            assert "Olav keeps bees in Bergen" in texts(await ok(first, "recall", query="Who keeps bees?",
                                                                 user_id="alice"))  # fmt: skip
            assert "Ingrid lives in Trondheim" in texts(await ok(second, "recall", query="Where does Ingrid live?",
                                                                  user_id="alice"))  # fmt: skip
            found = cli(data, "search", "Who keeps bees?", "--user", "alice", "--json")
            assert found.returncode == 0, found.stderr
            assert "Olav keeps bees in Bergen" in texts(json.loads(found.stdout))
            users = cli(data, "users", "--json")
            assert users.returncode == 0, users.stderr
            assert [u["user_id"] for u in json.loads(users.stdout)] == ["alice"]

            # The second writes on, through the first; the first is killed mid-write.
            eight = anyio.Event()

            async def write_on() -> None:
                for i in range(40):
                    text = f"Note number {i} about the garden"
                    await ok(second, "remember", content=text, user_id="alice", session_id="b")
                    acknowledged.append(text)
                    if len(acknowledged) == 8:
                        eight.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(write_on)
                with anyio.fail_after(DEADLINE_S):
                    await eight.wait()
                os.kill(pid_first, signal.SIGKILL)

            # The second's next call finds the holder gone and takes the directory over (the 40
            # writes may all have ended before the kill: then this call is the one that notices);
            # the CLI now relays to it.
            await ok(second, "remember", content="Written after the takeover", user_id="alice", session_id="b")
            acknowledged.append("Written after the takeover")
            await wait_for(lambda: holder_pid_or_none(data) not in (None, pid_first), "a new holder")
            survivors = cli(data, "search", "Who keeps bees?", "--user", "alice", "--json")
            assert survivors.returncode == 0, survivors.stderr
            assert "Olav keeps bees in Bergen" in texts(json.loads(survivors.stdout))
            stack.pop_all()  # the first one's client: its server is gone
            await second.__aexit__(None, None, None)

    anyio.run(main)

    service = make_service(data)
    try:
        stored = [r.text for r in service.store.user_records("alice")]
        for text in acknowledged:
            assert stored.count(text) == 1, f"{text!r} stored {stored.count(text)} times"
        found = service.recall("Note number 3 about the garden", user_id="alice")
        assert "Note number 3 about the garden" in texts(found.model_dump())
    finally:
        service.close()


def holder_pid_or_none(data: Path) -> int | None:
    """The pid of the process serving the data directory, or None while nobody does."""
    try:
        remote = RemoteService.connect(socket_path(data), "default")
        return remote._request({"method": "ping"}) if remote is not None else None
    except HolderGone:
        return None


def test_an_http_server_relays_to_a_stdio_holder_with_its_tokens_in_force(tmp_path: Path) -> None:
    from mnemoplan.storage.tokens import TokenStore
    from tests.test_http_auth import run as http_run
    from tests.test_http_auth import start_http, stop

    data = tmp_path / "data"
    alice, _ = TokenStore(data).create(user_id="alice")
    params = StdioServerParameters(command=sys.executable, args=["-m", "mnemoplan", "serve"], env=server_env(data))

    async def holder_and_http() -> None:
        async with Client(params, mode="legacy") as local:
            await ok(local, "remember", content="Bob's bees swarmed", user_id="bob")
            await wait_for(lambda: holder_pid_or_none(data) is not None, "the stdio server to serve the others")
            proc, base = await anyio.to_thread.run_sync(start_http, data)
            try:

                async def as_alice(client: Any) -> None:
                    await ok(client, "remember", content="Alice tunes her cello")
                    denied = await client.call_tool("recall", {"query": "bees", "user_id": "bob"})
                    assert denied.is_error and "[forbidden]" in denied.content[0].text

                await anyio.to_thread.run_sync(http_run, f"{base}/mcp", alice, as_alice)
            finally:
                await anyio.to_thread.run_sync(stop, proc)
            found = await ok(local, "recall", query="What does Alice tune?", user_id="alice")
            assert "Alice tunes her cello" in texts(found)

    anyio.run(holder_and_http)
