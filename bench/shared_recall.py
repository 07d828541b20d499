"""Recall latency through a second host (relayed to the process holding the store) beside the
direct one, in one run: two `mnemoplan serve` over stdio on one data directory, as two hosts.

    .venv/bin/python bench/shared_recall.py [--memories 300] [--queries 60] [--model hash]

Calls alternate between the two hosts so both see the same machine load; medians and p95 are
printed as JSON. The relay adds one Unix-socket round trip and JSON (de)serialisation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

PEOPLE = ["Ingrid", "Olav", "Mei", "Tomás", "Amara", "Jonas", "Priya", "Kofi", "Lena", "Yusuf"]
THINGS = ["the garden", "a new bike", "the piano lessons", "a trip to Lisbon", "the dentist", "a book club",
          "the kitchen tiles", "a marathon", "the cat's vet visit", "a job interview"]  # fmt: skip
VERBS = ["talked about", "booked", "finished", "postponed", "is worried about", "paid for", "planned"]


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(PEOPLE)} {rng.choice(VERBS)} {rng.choice(THINGS)} on day {rng.randint(1, 365)}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(data: Path, model: str, memories: int, queries: int) -> dict[str, Any]:
    env = {"MNEMOPLAN_DATA_DIR": str(data), "MNEMOPLAN_EMBEDDING_MODEL": model, "ANTHROPIC_API_KEY": "",
           "LANCE_LOG": "error", "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    params = StdioServerParameters(command=sys.executable, args=["-m", "mnemoplan", "serve"], env=env)
    rng = random.Random(7)
    times: dict[str, list[float]] = {"direct": [], "relayed": []}
    async with Client(params, mode="legacy") as first:
        for start in range(0, memories, 50):  # the first host holds the store
            batch = [{"role": "user", "content": sentence(rng)} for _ in range(min(50, memories - start))]
            await first.call_tool("remember", {"messages": batch, "user_id": "u", "session_id": f"s{start}"})
        while not (data / "serve.sock").exists():
            await anyio.sleep(0.1)
        async with Client(params, mode="legacy") as second:
            asks = [f"What did {rng.choice(PEOPLE)} do about {rng.choice(THINGS)}?" for _ in range(queries)]
            for host in (first, second):  # warm-up, untimed
                for q in asks[:5]:
                    await host.call_tool("recall", {"query": q, "user_id": "u"})
            for i, q in enumerate(asks):
                order = [("direct", first), ("relayed", second)]
                for name, host in order if i % 2 == 0 else order[::-1]:
                    started = time.perf_counter()
                    result = await host.call_tool("recall", {"query": q, "user_id": "u"})
                    times[name].append((time.perf_counter() - started) * 1000)
                    if result.is_error:
                        raise RuntimeError(result.content)
    out: dict[str, Any] = {"memories": memories, "queries": queries, "model": model}
    for name, values in times.items():
        out[name] = {"median_ms": round(statistics.median(values), 2), "p95_ms": round(pct(values, 0.95), 2)}
    out["relay_overhead_median_ms"] = round(out["relayed"]["median_ms"] - out["direct"]["median_ms"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=300)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--model", default="all-MiniLM-L6-v2", help="embedding model ('hash': the test embedder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(anyio.run(measure, Path(tmp) / "data", args.model, args.memories, args.queries), indent=2))


if __name__ == "__main__":
    main()
