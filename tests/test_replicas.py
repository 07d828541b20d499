"""Three replicas of ``mnemoplan serve --http`` on one log in object storage (moto's S3 on loopback)
behind nginx, which routes each user by their token (``hash $http_authorization consistent``). Clients
remember, recall and forget through nginx with the MCP SDK's own streamable-HTTP client; one replica
is killed with SIGKILL mid-load, and later started again on its old data directory.

Afterwards, through nginx and on every replica directly: each acknowledged write is found, none is
stored twice, no forgotten memory comes back; the users of the killed replica were served by
another, and when they move back it sees what was written elsewhere meanwhile.

Conflicts are arranged so that the result does not rely on moto: its conditional PUT (how Lance
guards a commit, ``If-None-Match``) is not atomic under truly simultaneous requests as S3's is, so
two commits racing for one version could both be taken there. The clients therefore send one write
(remember or forget) at a time across all users, a lock in this test; reads run beside them and
each other, on every replica. What Lance does with real conflicts is S3's part, not tested here.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from mnemoplan.bench.replicas_load import nginx_conf
from mnemoplan.storage.log.tables import LogTables
from mnemoplan.storage.log.token_table import TokenTable
from mnemoplan.storage.tokens import TokenStore
from tests.s3 import Bucket, free_port, moto_server, new_bucket
from tests.test_http_auth import start_http

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx-light)")

PROTOCOL = "2026-07-28"  # the stateless protocol: no session, a call may land on any replica
USERS = ("alice", "bob", "carol", "dave")
SESSION = "s1"
DEADLINE_S = 120.0  # how long a call may keep failing before the test fails: a deadline, not a timing
WRITES_BEFORE = 3  # each user's writes through nginx before the kill...
WRITES_AFTER = 4  # ...and after it


@dataclass
class Replica:
    """One ``serve --http`` process, its data directory and port."""

    data: Path
    port: int
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        self.proc, _ = start_http(self.data, port=self.port, env=self.env)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Memories:
    """What one user was told was stored or forgotten (acknowledged calls only)."""

    token: str
    stored: dict[str, str] = field(default_factory=dict)  # id -> its codeword
    forgotten: dict[str, str] = field(default_factory=dict)

    def live(self) -> dict[str, str]:
        return {rid: word for rid, word in self.stored.items() if rid not in self.forgotten}


ROUTED_LOG = """\
    log_format routed '$http_x_test_user $upstream_addr $status';
    access_log {tmp}/access.log routed;"""  # which replica served whom


def wait_healthy(base: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Poll ``base``/health until it answers 200 (an event; the deadline is generous)."""
    ends = time.monotonic() + DEADLINE_S
    while time.monotonic() < ends:
        assert proc is None or proc.poll() is None, f"{base} ended (exit {proc.returncode if proc else ''})"
        try:
            if httpx2.get(f"{base}/health", timeout=30).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{base}/health never answered")


@contextmanager
def nginx(tmp: Path, replicas: list[Replica]) -> Iterator[str]:
    """nginx in front of the replicas, as the README shows it (its paths in ``tmp``: no root needed);
    its base URL once it answers."""
    assert NGINX is not None
    tmp.mkdir(parents=True)
    port = free_port()
    servers = "\n".join(f"        server 127.0.0.1:{r.port} max_fails=1 fail_timeout=2s;" for r in replicas)
    conf = tmp / "nginx.conf"
    conf.write_text(nginx_conf(tmp, port, servers, logging=ROUTED_LOG.format(tmp=tmp), keepalive=False))
    with open(tmp / "stderr.log", "wb") as err:
        proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(60)


@dataclass
class Cluster:
    """The replicas, nginx in front of them, and what each user was told."""

    replicas: list[Replica]
    proxy: str
    access_log: Path
    users: dict[str, Memories]

    def served_by(self, user: str) -> Replica:
        """The replica that answered the user's last call through nginx (nginx's access log)."""
        lines = [ln.split() for ln in self.access_log.read_text().splitlines()]
        last = [ln for ln in lines if ln[0] == user and ln[-1] == "200"][-1]
        port = int(last[-2].rstrip(",").rsplit(":", 1)[1])  # the last replica nginx tried
        return next(r for r in self.replicas if r.port == port)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with moto_server() as endpoint:
        bucket: Bucket = new_bucket(endpoint)
        tokens = TokenStore(tmp_path / "tokens", TokenTable(LogTables(bucket.uri, storage_options=bucket.options)))
        users = {u: Memories(tokens.create(user_id=u)[0]) for u in USERS}
        replicas = [Replica(tmp_path / f"replica{i}" / "data", free_port(), bucket.env()) for i in range(3)]
        try:
            with ThreadPoolExecutor(len(replicas)) as pool:
                list(pool.map(Replica.start, replicas))
            for r in replicas:
                wait_healthy(f"http://127.0.0.1:{r.port}", r.proc)
            with nginx(tmp_path / "nginx", replicas) as proxy:
                yield Cluster(replicas, f"{proxy}/mcp", tmp_path / "nginx" / "access.log", users)
        finally:
            for r in replicas:
                r.stop()


async def call(url: str, user: str, token: str, tool: str, **args: Any) -> dict[str, Any]:
    """One tool call in a session of its own (stateless HTTP), made again (maybe on another replica)
    while it fails for want of a server or with an error the server calls retryable."""
    headers = {"Authorization": f"Bearer {token}", "X-Test-User": user}
    last = ""
    with anyio.move_on_after(DEADLINE_S):
        while True:
            try:
                async with create_mcp_http_client(headers=headers) as http:
                    async with Client(streamable_http_client(url, http_client=http), mode=PROTOCOL) as client:
                        result = await client.call_tool(tool, args)
            except Exception as exc:  # noqa: BLE001 (the replica died under the call, or nginx had none yet)
                last = repr(exc)
                await anyio.sleep(0.2)
                continue
            text = " ".join(getattr(c, "text", "") for c in result.content)
            if not result.is_error:
                return result.structured_content
            assert "(retryable)" in text, f"{tool}({args}) on {url}: {text}"
            last = text
            await anyio.sleep(0.2)
    raise AssertionError(f"{tool} on {url} kept failing: {last}")


async def messages(url: str, user: str, token: str) -> list[dict[str, Any]]:
    """The user's session as the log holds it (the browsing resource), every page."""
    headers = {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=PROTOCOL) as client:
            found: list[dict[str, Any]] = []
            uri: str | None = f"memory://{user}/messages?session_id={SESSION}&limit=500"
            while uri:
                page = json.loads((await client.read_resource(uri)).contents[0].text)
                found += page["items"]
                uri = page["next"]
            return found


async def check(url: str, cluster: Cluster, users: tuple[str, ...] = USERS) -> None:
    """Through ``url``: every acknowledged memory of ``users`` is there once, none forgotten comes back."""
    for user in users:
        mem = cluster.users[user]
        stored = await messages(url, user, mem.token)
        ids = [m["id"] for m in stored]
        assert len(ids) == len(set(ids)) and len({m["text"] for m in stored}) == len(stored), f"{url} {user}: twice"
        assert set(ids) == set(mem.live()), f"{url} {user}: the log differs from what was acknowledged"
        for rid, word in mem.stored.items():
            found = await call(url, user, mem.token, "recall", query=f"the codeword {word}")
            returned = {i["id"] for i in found["items"]} | {i["id"] for i in found["items"] if word in i["text"]}
            if rid in mem.forgotten:
                assert rid not in returned and all(word not in i["text"] for i in found["items"]), \
                    f"{url} {user}: a forgotten memory came back"  # fmt: skip
            else:
                assert rid in returned, f"{url} {user}: an acknowledged memory is missing from recall"


async def write(cluster: Cluster, user: str, writing: anyio.Lock, rng: random.Random) -> None:
    """One write of the user through nginx: a new memory, or (one in three) a forget of an old one;
    then a recall there says it is (or is no longer) found. Writes are one at a time (module doc)."""
    mem = cluster.users[user]
    live = list(mem.live())
    async with writing:
        if len(live) > 2 and rng.random() < 1 / 3:
            rid = rng.choice(live)
            await call(cluster.proxy, user, mem.token, "forget", ids=[rid])
            mem.forgotten[rid] = mem.stored[rid]
        else:
            word = f"zq{rng.getrandbits(40):010x}"
            text = f"{user.title()} noted the codeword {word} in the ledger"
            done = await call(cluster.proxy, user, mem.token, "remember", content=text, session_id=SESSION)
            rid = done["ids"][0]
            mem.stored[rid] = word
    found = await call(cluster.proxy, user, mem.token, "recall", query=f"the codeword {mem.stored[rid]}")
    assert (rid in {i["id"] for i in found["items"]}) == (rid not in mem.forgotten), f"{user}: read after write"


async def scenario(cluster: Cluster) -> None:
    writing = anyio.Lock()
    rng = random.Random(40)

    async def writes(user: str, n: int, done: Callable[[], None] = lambda: None) -> None:
        for _ in range(n):
            await write(cluster, user, writing, rng)
            done()

    async with anyio.create_task_group() as tg:  # before the kill: every user, then every replica knows them
        for user in USERS:
            tg.start_soon(writes, user, WRITES_BEFORE)
    for r in cluster.replicas:  # (their caches of every user: stale, unless they catch up later)
        for user, mem in cluster.users.items():
            await call(r.url, user, mem.token, "recall", query="the codeword")

    victim = cluster.served_by(USERS[0])
    moved = [u for u in USERS if cluster.served_by(u) is victim]
    count = 0
    half = anyio.Event()

    def counted() -> None:
        nonlocal count
        count += 1
        if count >= len(USERS) * WRITES_AFTER // 2:
            half.set()

    async def kill_at_half() -> None:
        await half.wait()
        await anyio.to_thread.run_sync(victim.kill)

    async with anyio.create_task_group() as tg:  # mid-load, the replica of USERS[0] dies
        tg.start_soon(kill_at_half)
        for user in USERS:
            tg.start_soon(writes, user, WRITES_AFTER, counted)
    for user in moved:  # ... and its users were served by another
        await call(cluster.proxy, user, cluster.users[user].token, "recall", query="the codeword")
        assert cluster.served_by(user) is not victim
    survivors = [r for r in cluster.replicas if r is not victim]
    await check(cluster.proxy, cluster)
    for r in survivors:
        await check(r.url, cluster)

    await anyio.to_thread.run_sync(victim.start)  # back, on its old data directory and port
    user = moved[0]
    mem = cluster.users[user]
    with anyio.fail_after(DEADLINE_S):
        while cluster.served_by(user) is not victim:  # nginx tries it again after its fail_timeout
            await call(cluster.proxy, user, mem.token, "recall", query="the codeword")
            await anyio.sleep(0.2)
    await check(cluster.proxy, cluster)  # the users moved back see what was written while it was dead
    await check(victim.url, cluster)
    await write(cluster, user, writing, rng)  # and the others see what it writes now
    for r in survivors:
        await check(r.url, cluster, (user,))


def test_replicas_behind_nginx_lose_nothing_when_one_is_killed_and_restarted(cluster: Cluster) -> None:
    anyio.run(scenario, cluster)
