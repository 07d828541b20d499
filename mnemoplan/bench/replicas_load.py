"""``bench-replicas``' HTTP part: recall and remember through nginx in front of three replicas on a
shared log, and against one server on local disk, in the same run, with the MCP SDK's own client.

Every user has one client per target (the stateless 2026-07-28 protocol: no session); the users
call at once, each one call after another (closed loop), in rounds that alternate the two targets so
that both see the same load from the rest of the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mnemoplan.bench.scale_load import free_port, start_server, stop_server

PROTOCOL = "2026-07-28"
NAMES = ("Maya", "Tomas", "Ines", "Kofi", "Lena", "Ravi", "Sofia", "Jonas", "Amara", "Pieter")
PLACES = ("Lisbon", "Oslo", "Nairobi", "Kyoto", "Lima", "Tallinn", "Porto", "Quebec")
TOPICS = ("the budget", "a hiking trip", "the new kitchen", "a guitar lesson", "the garden", "tax forms",
          "a birthday party", "the car repair", "a job offer", "the school play")  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


def message(i: int) -> str:
    """The ``i``-th of a user's messages: varied names, places and topics, one number of its own."""
    a, b = NAMES[i % len(NAMES)], NAMES[(i * 7 + 3) % len(NAMES)]
    return (f"{a} told {b} about {TOPICS[(i // 3) % len(TOPICS)]} in {PLACES[(i // 5) % len(PLACES)]}; "
            f"the reference number was {100_000 + i}.")  # fmt: skip


NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
events {{ worker_connections 512; }}
http {{
{logging}
    client_max_body_size 16m;
    client_body_buffer_size 16m;  # in memory: workers run as "nobody" when nginx starts as root
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream replicas {{
        hash $http_authorization consistent;
{keepalive}{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host:$server_port;
            proxy_buffering off;
            proxy_read_timeout 300s;
            proxy_next_upstream error timeout http_502 http_503;
        }}
    }}
}}
"""


def nginx_conf(tmp: Path, port: int, servers: str, *, logging: str = "    access_log off;",
               keepalive: bool = True) -> str:  # fmt: skip
    """nginx's configuration as the README shows it, its files in ``tmp`` (no root needed): routing by
    token (``hash $http_authorization consistent``) to the ``server`` lines given, on ``port``."""
    return NGINX_CONF.format(tmp=tmp, port=port, servers=servers, logging=logging,
                             keepalive="        keepalive 16;\n" if keepalive else "")  # fmt: skip


def nginx_binary() -> str:
    """Debian's nginx.

    Raises:
        RuntimeError: none is installed.
    """
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if found is None:
        raise RuntimeError("nginx is not installed (Debian: apt-get install nginx-light)")
    return found


@contextmanager
def nginx(tmp: Path, ports: list[int]) -> Iterator[str]:
    """nginx routing by token to the servers on ``ports`` (its files in ``tmp``); its MCP URL."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=1 fail_timeout=5s;" for p in ports)
    conf = tmp / "nginx.conf"
    conf.write_text(nginx_conf(tmp, port, servers), encoding="utf-8")
    proc = subprocess.Popen([nginx_binary(), "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        import httpx2

        ends = time.monotonic() + 120
        while True:
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > ends:
                raise RuntimeError(f"nginx did not start (see {tmp / 'error.log'})")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(60)


def _tokens(data_dir: Path, users: list[str], uri: str | None, options: dict[str, str]) -> dict[str, str]:
    from mnemoplan.storage.tokens import TokenStore

    if uri is None:
        store = TokenStore(data_dir)
    else:
        from mnemoplan.storage.log.tables import LogTables
        from mnemoplan.storage.log.token_table import TokenTable

        store = TokenStore(data_dir, TokenTable(LogTables(uri, storage_options=options)))
    return {u: store.create(user_id=u)[0] for u in users}


async def _user(url: str, token: str, fill: bool, memories: int, rounds: int, gate: Any, timings: dict) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=PROTOCOL) as client:
            for start in range(0, memories if fill else 0, 100):  # untimed: the user's memories
                batch = [{"content": message(i), "speaker": NAMES[i % len(NAMES)]}
                         for i in range(start, min(memories, start + 100))]  # fmt: skip
                result = await client.call_tool("remember", {"messages": batch, "session_id": f"s{start}"})
                assert not result.is_error, result.content
            await client.call_tool("recall", {"query": "warm up"})
            await gate()
            for i in range(rounds):
                for tool, args in (("recall", {"query": f"what did {NAMES[i % len(NAMES)]} say about the garden"}),
                                   ("recall", {"query": f"reference number {100_000 + (i * 37) % memories}"}),
                                   ("remember", {"content": f"Note {uuid.uuid4().hex[:10]}: {message(i)}",
                                                 "session_id": "live"})):  # fmt: skip
                    started = time.perf_counter()
                    result = await client.call_tool(tool, args)
                    ms = (time.perf_counter() - started) * 1000
                    timings.setdefault(tool, []).append(ms)
                    if result.is_error:
                        timings.setdefault("errors", []).append(1.0)


def _run_users(url: str, tokens: dict[str, str], fill: bool, memories: int, rounds: int) -> dict[str, list[float]]:
    import anyio

    timings: dict[str, list[float]] = {}

    async def main() -> None:
        left = len(tokens)
        go = anyio.Event()

        async def gate() -> None:  # every user filled and warm before any timed call
            nonlocal left
            left -= 1
            if left == 0:
                go.set()
            await go.wait()

        async with anyio.create_task_group() as tasks:
            for token in tokens.values():
                tasks.start_soon(_user, url, token, fill, memories, rounds, gate, timings)

    anyio.run(main)
    return timings


def compare(work: Path, uri: str, options: dict[str, str], *, users: int, memories: int, rounds: int) -> dict[str, Any]:
    """Recall and remember p50/p99 through nginx and three replicas, and on one local-disk server.

    Raises:
        RuntimeError: nginx or a server did not start.
    """
    names = [f"user{i}" for i in range(users)]
    env = {"MNEMOPLAN_EMBEDDING_MODEL": "hash", "MNEMOPLAN_LLM_PROVIDER": "none", "ANTHROPIC_API_KEY": "",
           "LANCE_LOG": "error"}  # fmt: skip
    shared_env = {**env, "MNEMOPLAN_STORAGE_URI": uri, "MNEMOPLAN_STORAGE_OPTIONS": json.dumps(options)}
    shared_tokens = _tokens(work / "tokens", names, uri, options)
    local_tokens = _tokens(work / "local", names, None, {})
    procs = []
    try:
        ports = []
        for i in range(3):
            (work / f"replica{i}").mkdir(parents=True, exist_ok=True)
            proc, url = start_server(work / f"replica{i}" / "data", work / f"replica{i}" / "server.log", shared_env)
            procs.append(proc)
            ports.append(int(url.rsplit(":", 1)[1].split("/")[0]))
        proc, local_url = start_server(work / "local", work / "local.log", env)
        procs.append(proc)
        with nginx(work / "nginx", ports) as proxy:
            per_target: dict[str, dict[str, list[float]]] = {"nginx_3_replicas_s3": {}, "local_disk": {}}
            # Alternate: each target's users filled once, then timed rounds one target after the other.
            half = max(1, rounds // 2)
            for part in range(2):
                for name, url, tokens in (("nginx_3_replicas_s3", proxy, shared_tokens),
                                          ("local_disk", local_url, local_tokens)):  # fmt: skip
                    got = _run_users(url, tokens, part == 0, memories, half)
                    for tool, values in got.items():
                        per_target[name].setdefault(tool, []).extend(values)
    finally:
        for proc in procs:
            stop_server(proc)
    return {
        name: {f"{tool}_{q}_ms": percentile(values, p) for tool, values in timings.items() if tool != "errors"
               for q, p in (("p50", 0.5), ("p99", 0.99))} | {"calls": sum(len(v) for k, v in timings.items()
                                                                          if k != "errors"),
                                                             "errors": len(timings.get("errors", []))}
        for name, timings in per_target.items()
    } | {"users": users, "memories_per_user": memories, "rounds": rounds}  # fmt: skip
