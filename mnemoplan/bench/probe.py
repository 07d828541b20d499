"""Time tool calls through a real MCP stdio round trip: the SDK's client spawning ``mnemoplan serve``."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any


def time_stdio_calls(
    data_dir: Path, tool: str, calls: list[dict[str, Any]], *, env: dict[str, str] | None = None,
    warmup_calls: list[dict[str, Any]] | None = None,
) -> list[float]:
    """Round-trip milliseconds of each call, client to server to client, after untimed
    ``warmup_calls`` (default: the first five calls).

    Raises:
        RuntimeError: a call came back as a tool error.
    """
    import anyio
    from mcp import Client, StdioServerParameters

    server_env = {"MNEMOPLAN_DATA_DIR": str(data_dir), "LANCE_LOG": "error", "PYTHONPATH": os.pathsep.join(sys.path)}
    server_env.update(env or {})
    params = StdioServerParameters(command=sys.executable, args=["-m", "mnemoplan", "serve"], env=server_env)
    latencies: list[float] = []

    async def main() -> None:
        async with Client(params, mode="legacy") as client:
            for args in calls[:5] if warmup_calls is None else warmup_calls:
                await client.call_tool(tool, args)
            for args in calls:
                started = time.perf_counter()
                result = await client.call_tool(tool, args)
                latencies.append((time.perf_counter() - started) * 1000)
                if result.is_error:
                    raise RuntimeError(f"{tool} failed over MCP: {result.content}")

    with open(os.devnull, "w") as devnull:
        # The server's stderr is inherited; keep its log lines out of the caller's progress output.
        old, sys.stderr = sys.stderr, devnull
        try:
            anyio.run(main)
        finally:
            sys.stderr = old
    return latencies


def cold_first_calls(
    data_dir: Path, call: dict[str, Any], *, starts: int = 3, tool: str = "recall", env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Start the server ``starts`` times, each a fresh process, and time each start: from spawning
    to the end of ``initialize`` (``initialize_ms``), and from there to the reply to the first
    ``tool`` call (``first_call_ms``), with that reply's warnings (a search answered before the
    embedding model was loaded says so).

    Raises:
        RuntimeError: the call came back as a tool error.
    """
    import anyio
    from mcp import Client, StdioServerParameters

    server_env = {"MNEMOPLAN_DATA_DIR": str(data_dir), "LANCE_LOG": "error", "PYTHONPATH": os.pathsep.join(sys.path)}
    server_env.update(env or {})
    params = StdioServerParameters(command=sys.executable, args=["-m", "mnemoplan", "serve"], env=server_env)
    runs: list[dict[str, Any]] = []

    async def main() -> None:
        started = time.perf_counter()
        async with Client(params, mode="legacy") as client:
            ready = time.perf_counter()
            result = await client.call_tool(tool, call)
            done = time.perf_counter()
            if result.is_error:
                raise RuntimeError(f"{tool} failed over MCP: {result.content}")
            warnings = (result.structured_content or {}).get("warnings", [])
            runs.append({"initialize_ms": round((ready - started) * 1000, 1),
                         "first_call_ms": round((done - ready) * 1000, 1), "warnings": warnings})  # fmt: skip

    with open(os.devnull, "w") as devnull:
        old, sys.stderr = sys.stderr, devnull
        try:
            for _ in range(starts):
                anyio.run(main)
        finally:
            sys.stderr = old
    return runs
