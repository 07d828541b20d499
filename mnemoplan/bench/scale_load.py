"""``bench-scale``'s mixed load: many clients at once over authenticated HTTP, each its own user and
token, through the MCP SDK's own streamable-HTTP client against ``mnemoplan serve --http``.

Open loop: calls arrive at a fixed total rate (exponential gaps per client), whether or not earlier
ones have returned, 80 % recall, 15 % remember, 5 % forget (of a memory the client remembered in
this run). Every call's latency and outcome is kept; so are the ids each remember acknowledged and
each forget removed, and every recall is checked for a memory forgotten before it was sent.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIX = (("recall", 0.80), ("remember", 0.15), ("forget", 0.05))
NOTE = "Load note"  # what every remembered note starts with, followed by its client's user id
NOTES_QUERY = "what is the meeting room code in the load note"


@dataclass
class ClientLog:
    """What one client did and saw."""

    user_id: str
    token: str
    queries: list[str]
    calls: list[tuple[str, float, bool]] = field(default_factory=list)  # (tool, ms, ok)
    remembered: list[str] = field(default_factory=list)  # acknowledged ids, in order
    forgotten: dict[str, float] = field(default_factory=dict)  # id -> when its forget returned
    forgetting: set[str] = field(default_factory=set)  # ids whose forget was sent and has not returned
    resurfaced: list[str] = field(default_factory=list)  # forgotten ids a later recall returned
    foreign: list[str] = field(default_factory=list)  # another client's notes a recall returned
    errors: list[str] = field(default_factory=list)


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(data_dir: Path, log_path: Path, env: dict[str, str], timeout_s: float = 600.0
                 ) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
    """``mnemoplan serve --http`` on a free loopback port, once it says it listens.

    Raises:
        RuntimeError: it exited or did not listen within ``timeout_s``.
    """
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mnemoplan", "serve", "--http", "--port", str(port)],
        env={**os.environ, **env, "MNEMOPLAN_DATA_DIR": str(data_dir)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    listening = threading.Event()

    def copy() -> None:  # a pipe nobody reads fills and blocks the server
        with log_path.open("wb") as log:
            for line in proc.stderr or []:
                log.write(line)
                log.flush()
                if b"Uvicorn running on" in line:
                    listening.set()
        listening.set()

    threading.Thread(target=copy, daemon=True).start()
    if not listening.wait(timeout_s) or proc.poll() is not None:
        proc.kill()
        raise RuntimeError(f"the HTTP server did not start (see {log_path})")
    return proc, f"http://127.0.0.1:{port}/mcp"


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server as a host would (SIGTERM: it closes its stores), killing it if it hangs."""
    proc.terminate()
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _client(url: str, log: ClientLog, rate: float, seconds: float, seed: int, line: StartLine) -> None:
    import anyio
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    rng = random.Random(seed)
    tools, weights = zip(*MIX, strict=True)

    async def call(client: Any, tool: str) -> None:
        args: dict[str, Any]
        forgotten_before = set(log.forgotten)
        if tool == "forget":
            # Not one whose forget is still under way: a client forgets a memory once (the
            # second forget would be told, rightly, that the memory is gone).
            live = [i for i in log.remembered if i not in log.forgotten and i not in log.forgetting]
            if not live:
                tool = "recall"
            else:
                args = {"ids": [rng.choice(live)]}
                log.forgetting.update(args["ids"])
        if tool == "recall":  # one in four asks for the notes every client writes: only its own may come back
            query = NOTES_QUERY if rng.random() < 0.25 else rng.choice(log.queries)
            args = {"query": query, "limit": 10}
        elif tool == "remember":
            args = {"content": f"{NOTE} {log.user_id} {uuid.uuid4().hex[:12]}: the meeting room code is "
                               f"{rng.randint(1000, 9999)}"}  # fmt: skip
        started = time.perf_counter()
        try:
            result = await client.call_tool(tool, args)
            ok = not result.is_error
            if not ok:
                log.errors.append(f"{tool}: {' '.join(getattr(c, 'text', '') for c in result.content)[:200]}")
        except Exception as exc:  # a transport failure counts as an error, not a crash of the run
            ok, result = False, None
            log.errors.append(f"{tool}: {type(exc).__name__}: {exc}"[:200])
        ms = (time.perf_counter() - started) * 1000
        log.calls.append((tool, ms, ok))
        if tool == "forget":
            log.forgetting.difference_update(args["ids"])
        if not ok or result is None:
            return
        data = result.structured_content or {}
        if tool == "remember":
            log.remembered.extend(data.get("ids", []))
        elif tool == "forget":
            for rid in args["ids"]:
                log.forgotten[rid] = time.monotonic()
        else:
            items = data.get("items", [])
            log.resurfaced += [i["id"] for i in items if i["id"] in forgotten_before]
            mine = f"{NOTE} {log.user_id} "
            log.foreign += [i["id"] for i in items if NOTE in i.get("text", "") and mine not in i.get("text", "")]

    headers = {"Authorization": f"Bearer {log.token}"}
    started = False
    try:
        async with create_mcp_http_client(headers=headers) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
                await client.call_tool("recall", {"query": log.queries[0], "limit": 10})  # untimed: the user's first
                started = True
                await line.wait()
                async with anyio.create_task_group() as tasks:
                    end = time.monotonic() + seconds
                    while True:
                        await anyio.sleep(rng.expovariate(rate))
                        if time.monotonic() >= end:
                            break
                        tasks.start_soon(call, client, rng.choices(tools, weights)[0])
    except Exception as exc:  # the client's transport gave up (e.g. its connection pool timed out on a slow server)
        log.errors.append(f"client transport: {type(exc).__name__}: {exc}"[:200])  # an error of the run, not its end
        if not started:
            line.leave()


class StartLine:
    """Where clients wait before their timed calls until every client has made its untimed first
    one; ``on_start`` is called then, once."""

    def __init__(self, clients: int, on_start: Callable[[], None] | None = None) -> None:
        import anyio

        self._left = clients
        self._go = anyio.Event()
        self._on_start = on_start

    def _open(self) -> None:
        if self._left <= 0 and not self._go.is_set():
            if self._on_start is not None:
                self._on_start()
            self._go.set()

    def leave(self) -> None:
        """A client that will never arrive (its first call failed): the others do not wait for it."""
        self._left -= 1
        self._open()

    async def wait(self) -> None:
        self._left -= 1
        self._open()
        await self._go.wait()


def process_tree_cpu_s(pid: int) -> float | None:
    """CPU seconds (user and system) spent so far by a process and its descendants (the server
    and its graph process), read from ``/proc``; None where there is none (not Linux). A child
    that ended counts through its parent, once reaped (``cutime``, ``cstime``)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parent: dict[int, int] = {}
    spent: dict[int, float] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:  # ended meanwhile
            continue
        parent[int(entry)] = int(fields[1])
        spent[int(entry)] = sum(int(v) for v in fields[11:15]) / tick  # utime stime cutime cstime
    if pid not in spent:
        return None
    tree, frontier = {pid}, {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in tree}
        tree |= frontier
    return sum(spent[p] for p in tree)


def run_load(url: str, clients: list[ClientLog], rate: float, seconds: float,
             on_start: Callable[[], None] | None = None) -> None:  # fmt: skip
    """Every client at once, ``rate`` calls a second in all, for ``seconds`` (once each has connected
    and touched its user, untimed: then ``on_start`` is called); their logs fill in."""
    import anyio

    async def main() -> None:
        line = StartLine(len(clients), on_start)
        async with anyio.create_task_group() as tasks:
            for n, log in enumerate(clients):
                tasks.start_soon(_client, url, log, rate / len(clients), seconds, n, line)

    anyio.run(main)
