"""Calls that wait do not hold up the others: through the SDK's own client (in memory), on a real
store with the small test embedder."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer

from mnemoplan.config import Settings
from mnemoplan.model.scope import RecordFilter
from mnemoplan.server import app as server_app
from mnemoplan.server.app import FORGET_THREADS, create_app
from mnemoplan.service.bootstrap import build_service
from mnemoplan.service.service import MemoryService

WORKER_THREADS = 40  # anyio's default for calls run in worker threads


def calls_in_threads() -> int:
    """Tool calls of the server holding, or waiting for, a worker thread (any limiter's)."""
    limiters = [anyio.to_thread.current_default_thread_limiter(), *server_app._FORGET_LIMITERS.values()]
    return sum(lim.statistics().borrowed_tokens + lim.statistics().tasks_waiting for lim in limiters)


def app_keeping_services(tmp_path: Path) -> tuple[MCPServer, list[MemoryService]]:
    """The server over a data directory in ``tmp_path``, and the services it builds (once started)."""
    settings = Settings(data_dir=tmp_path / "data", embedding_model="hash", anthropic_api_key=None)
    services: list[MemoryService] = []

    def factory() -> MemoryService:
        services.append(build_service(settings))
        return services[-1]

    return create_app(settings, factory), services


def test_recall_answers_while_more_forgets_than_worker_threads_wait_for_their_purge(tmp_path: Path) -> None:
    app, services = app_keeping_services(tmp_path)
    waiting = WORKER_THREADS + 8
    assert FORGET_THREADS < waiting

    async def main() -> None:
        async with Client(app) as client:
            notes = [{"content": f"garden note {i}: the tomatoes need water"} for i in range(waiting)]
            stored = await client.call_tool("remember", {"messages": notes, "user_id": "f", "session_id": "s"})
            ids = stored.structured_content["ids"]
            await client.call_tool("remember", {"content": "The bike lock code is 4821", "user_id": "g"})
            await client.call_tool("recall", {"query": "tomatoes", "user_id": "f"})  # every note stored
            removed: list[int] = []

            async def forget(rid: str) -> None:
                result = await client.call_tool("forget", {"ids": [rid], "user_id": "f"})
                assert not result.is_error, result.content
                removed.append(result.structured_content["removed"])

            maintenance = services[0].store.locks.maintenance
            maintenance.acquire()  # every forget's purge waits behind it
            async with anyio.create_task_group() as forgets:
                for rid in ids:
                    forgets.start_soon(forget, rid)
                while calls_in_threads() < waiting:  # until every forget has reached the server
                    await anyio.wait_all_tasks_blocked()
                # Were the forgets holding every worker thread, this recall would wait for the
                # lock's release below: the bound turns that wait into a failure, not a hang.
                with anyio.move_on_after(300) as bound:
                    found: Any = await client.call_tool("recall", {"query": "bike lock code", "user_id": "g"})
                maintenance.release()
                assert not bound.cancelled_caught, "the recall waited behind the forgets"
                assert "4821" in "".join(c.text for c in found.content)
                assert not removed  # the recall came first: no purge could run yet
            assert len(removed) == waiting and min(removed) >= 1  # (a summary of the notes may go with one)

    anyio.run(main)


def test_remember_over_mcp_answers_once_accepted_while_the_log_is_busy(tmp_path: Path) -> None:
    """The server's default: a ``remember`` without a progress token is answered once accepted,
    not after the embedding and the log's append (which wait here for the store's write lock)."""
    app, services = app_keeping_services(tmp_path)
    held, done = threading.Event(), threading.Event()

    def hold_the_log(service: MemoryService) -> None:
        with service.store.locks.write:  # no append reaches the log meanwhile
            held.set()
            # Stored before answering, the call would wait for this release: the bound turns
            # that wait into a failed assertion below, not a hang.
            done.wait(300)

    async def main() -> None:
        async with Client(app) as client:
            await client.call_tool("remember", {"content": "The shed key is under the blue pot", "user_id": "u"})
            service = services[0]
            assert service.deferred is not None
            service.deferred.wait(stored=True)
            holder = threading.Thread(target=hold_the_log, args=(service,))
            holder.start()
            assert held.wait(300), "the write lock was not taken"
            try:
                result: Any = await client.call_tool(
                    "remember", {"content": "The boat's spare fuel is in the red can", "user_id": "u"})
                assert not result.is_error, result.content
                rid = result.structured_content["ids"][0]
                assert service.deferred.pending("u") == 1, "remember waited for the log"
                found: Any = await client.call_tool("recall", {"query": "spare fuel for the boat", "user_id": "u"})
                assert rid in [i["id"] for i in found.structured_content["items"]]  # found by its words
            finally:
                done.set()
                holder.join()
            service.deferred.wait("u", stored=True)
            assert rid in service.store.log.ids(RecordFilter("u"))

    anyio.run(main)
