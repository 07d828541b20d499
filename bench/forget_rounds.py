#!/usr/bin/env python3
"""Rounds of remember-then-forget over MCP stdio, then every data file searched for the secrets.

    python bench/forget_rounds.py --rounds 50                 # a fresh data directory in /tmp
    python bench/forget_rounds.py --rounds 50 --data-dir D --embedding-model hash

Starts ``mnemoplan serve`` and drives it with the MCP SDK's own client, as a host does.
Each round remembers a batch of 1 to 6 messages, each holding the round's unique secret,
in a session and project of the round's own, with the speakers varying from round to round
(none, user and assistant, names); every fifth round first remembers a note to keep, in a
session of its own. Then the batch is forgotten, by its ids, by its session or by its project
in turn. A forget that fails is called again once, as a caller would, and must finish.

Then, with the server still running and again after it exited, every file under the data
directory is searched for the bytes of each forgotten secret (and of the kept ones, which
must be found, or the search proves nothing), as it is for each round's secret once its
forget returned. Prints the failed forgets and the files holding a forgotten secret;
exits with 1 if there is any.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("ids", "session", "project")
SPEAKERS: tuple[tuple[str | None, ...], ...] = ((None,), ("user", "assistant"), ("Ann", "Ben", "Chidi"))
USER = "rounds"


@dataclass
class RoundsResult:
    """What the rounds did, and what failed."""

    forgotten: list[str] = field(default_factory=list)  # each round's secret
    kept: list[str] = field(default_factory=list)  # the secrets of the notes kept
    modes: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    failed: list[str] = field(default_factory=list)  # forgets that failed: "round N (mode): error"
    unfinished: list[str] = field(default_factory=list)  # of those, the ones a second call did not finish
    lingering: list[str] = field(default_factory=list)  # secrets still on disk when their forget returned


def secret(rng: random.Random) -> str:
    """A token no text, id or key would hold by chance."""
    return f"zq{rng.getrandbits(48):012x}xv"


async def run_rounds(client: Any, rounds: int, data: Path, seed: int = 0) -> RoundsResult:
    """Run ``rounds`` rounds of remember-then-forget through ``client`` (an MCP client session of a
    server on ``data``); after each forget, the files under ``data`` must no longer hold its secret."""
    rng = random.Random(seed)
    result = RoundsResult()
    for n in range(rounds):
        if n % 5 == 0:
            kept = secret(rng)
            result.kept.append(kept)
            await _tool(client, "remember", content=f"Keep this one: the shed key is {kept}.", user_id=USER,
                        session_id=f"kept-{n}")  # fmt: skip
        token = secret(rng)
        result.forgotten.append(token)
        speakers = SPEAKERS[n % len(SPEAKERS)]
        size = 1 + n % 6
        messages = [
            {"content": f"Message {i} of round {n}: my locker code is {token}, near the pool in Lisbon.",
             **({"speaker": speakers[i % len(speakers)]} if speakers[i % len(speakers)] else {})}
            for i in range(size)
        ]  # fmt: skip
        result.messages += size
        stored = await _tool(client, "remember", messages=messages, user_id=USER, session_id=f"session-{n}",
                             project_id=f"project-{n}")  # fmt: skip
        mode = MODES[n % len(MODES)]
        result.modes[mode] = result.modes.get(mode, 0) + 1
        args: dict[str, Any] = {"user_id": USER}
        if mode == "ids":
            args["ids"] = stored["ids"]
        else:
            args.update(scope=mode, **{f"{mode}_id": f"{mode}-{n}"})
        outcome = await client.call_tool("forget", args)
        if outcome.is_error:
            result.failed.append(f"round {n} ({mode}): {_text(outcome)}")
            again = await client.call_tool("forget", args)
            receipt = again.structured_content or {}
            done = {*receipt.get("finished_ids", []), *receipt.get("ids", [])}
            if again.is_error or not done >= set(stored["ids"]):
                result.unfinished.append(f"round {n} ({mode}): {_text(again) or again.structured_content}")
        for name in files_holding(data, [token]).get(token, []):
            result.lingering.append(f"round {n} ({mode}): {name}")
    return result


async def _tool(client: Any, name: str, **args: Any) -> dict[str, Any]:
    outcome = await client.call_tool(name, args)
    if outcome.is_error:
        raise RuntimeError(f"{name} failed: {_text(outcome)}")
    return outcome.structured_content


def _text(outcome: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in outcome.content) if outcome.is_error else ""


def files_holding(root: Path, needles: list[str]) -> dict[str, list[str]]:
    """For each needle found, the files under ``root`` whose bytes hold it."""
    found: dict[str, list[str]] = {}
    raw = [(n, n.encode()) for n in needles]
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # removed while the server runs
            continue
        for needle, pattern in raw:
            if pattern in data:
                found.setdefault(needle, []).append(str(path.relative_to(root)))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, help="a new or empty directory (default: a temporary one)")
    parser.add_argument("--embedding-model", help="the server's MNEMOPLAN_EMBEDDING_MODEL")
    args = parser.parse_args(argv)

    import anyio
    from mcp import Client, StdioServerParameters

    data = args.data_dir or Path(tempfile.mkdtemp(prefix="forget-rounds-")) / "data"
    env = {**os.environ, "MNEMOPLAN_DATA_DIR": str(data), "ANTHROPIC_API_KEY": "", "LANCE_LOG": "error"}
    if args.embedding_model:
        env["MNEMOPLAN_EMBEDDING_MODEL"] = args.embedding_model
    serve = ["-m", "mnemoplan", "serve"]
    params = StdioServerParameters(command=sys.executable, args=serve, env=env)
    scans: dict[str, dict[str, list[str]]] = {}

    async def session() -> RoundsResult:
        async with Client(params, mode="legacy") as client:
            result = await run_rounds(client, args.rounds, data, args.seed)
            scans["running"] = files_holding(data, result.forgotten + result.kept)
            return result

    started = time.perf_counter()
    result = anyio.run(session)
    elapsed = time.perf_counter() - started
    scans["exited"] = files_holding(data, result.forgotten + result.kept)

    modes = ", ".join(f"{mode} {count}" for mode, count in result.modes.items())
    print(f"data directory: {data}")
    print(f"rounds: {args.rounds} ({modes}); messages forgotten: {result.messages}; {elapsed:.1f} s")
    print(f"failed forgets: {len(result.failed)} (not finished by a second call: {len(result.unfinished)})")
    for line in result.failed + result.unfinished:
        print(f"  {line}")
    print(f"files holding a round's secret when its forget returned: {len(result.lingering)}")
    for line in result.lingering:
        print(f"  {line}")
    bad = len(result.lingering)
    for when, found in scans.items():
        leaks = {s: files for s, files in found.items() if s in result.forgotten}
        files = sorted({f for fs in leaks.values() for f in fs})
        kept = sum(1 for s in result.kept if s in found)
        print(f"files holding a forgotten secret ({when}): {len(files)} ({len(leaks)} of "
              f"{len(result.forgotten)} secrets); kept secrets found: {kept} of {len(result.kept)}")
        for name in files:
            print(f"  {name}")
        bad += len(files) + (len(result.kept) - kept)
    return 1 if result.failed or bad else 0


if __name__ == "__main__":
    sys.exit(main())
