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
