#!/usr/bin/env python3
"""Does an LLM make ``remember`` wait? Its latency with no LLM, and with one that hangs, fails or is slow.

    python bench/llm_hang.py --calls 300 --rounds 3             # prints a table, writes JSON with --out

Each configuration is a fresh service (the server's default: ``remember`` answers once the
messages are durably accepted; the bundled embedding model, or ``--embedding-model hash``),
whose LLM is a loopback OpenAI-compatible server (``tests/llm_server.py``) that never
answers (``hanging``: the request waits out the 20 s timeout), answers 500 at once
(``failing``), or answers a valid reply after 2 s (``slow``). Extraction is due at every
message (``MNEMOPLAN_LLM_EXTRACTION_EVERY=1``), so every call gives the LLM work. Each call
stores one message of the updates suite's conversations, in order; the configurations run
in turn, ``--rounds`` times, each round starting with the next one, so that the machine's
drift falls on all alike. Reports the
p50/p95 of the calls' latency per configuration, and the p50 relative to ``none``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnemoplan.bench.updates import load  # noqa: E402
from mnemoplan.config import Settings  # noqa: E402
from mnemoplan.model import MessageIn  # noqa: E402
from mnemoplan.runtime import configure  # noqa: E402
from mnemoplan.service.bootstrap import build_service, settings_embedding  # noqa: E402
from tests.llm_corpus import GOOD  # noqa: E402
from tests.llm_server import LoopbackLLMServer, Reply  # noqa: E402

REPLIES = {
    "hanging": Reply(text="{}", delay_s=3600),  # answered only when the server stops
    "failing": Reply(status=500, error_type="api_error", message="down"),
    "slow": Reply(text=GOOD, delay_s=2.0),
}


def messages(n: int) -> list[MessageIn]:
    said = [m for conv in load() for m in conv["messages"]]
    return [MessageIn(content=m["text"], speaker=m["speaker"]) for m in (said * (n // len(said) + 1))[:n]]


def time_calls(config: str, calls: list[MessageIn], embedding: Any, server: LoopbackLLMServer | None) -> list[float]:
    """Milliseconds of each remember, in a fresh data directory."""
    llm: dict[str, Any] = {"llm_provider": "none"}
    if server is not None:
        llm = {"llm_provider": "openai", "llm_base_url": server.base_url, "llm_model": "bench",
               "llm_extraction_every": 1, "llm_max_calls_per_remember": 0}  # fmt: skip
    data = Path(tempfile.mkdtemp(prefix=f"mnemoplan-hang-{config}-"))
    service = build_service(Settings(data_dir=data, **llm), embedding=embedding)
    latencies = []
    try:
        for i, message in enumerate(calls):
            started = time.perf_counter()
            service.remember(messages=[message], user_id="bench", session_id=f"s{i // 20}")
            latencies.append((time.perf_counter() - started) * 1000)
        service.settle()
    finally:
        if server is not None:
            server.stop()  # the hanging requests end; closing need not wait out their timeout
        service.close()
        shutil.rmtree(data, ignore_errors=True)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="remember calls per configuration and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--embedding-model", default="all-MiniLM-L6-v2")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    configure()
    embedding = settings_embedding(Settings(embedding_model=args.embedding_model, llm_provider="none"))
    embedding.embedder.embed(["warm up"])
    calls = messages(args.calls)
    time_calls("warm-up", calls[:30], embedding, None)  # the first service built pays for lazy imports
    runs: dict[str, list[float]] = {name: [] for name in ("none", *REPLIES)}
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_no in range(args.rounds):
        for name in names[round_no % len(names):] + names[:round_no % len(names)]:  # each first in turn
            server = None
            if name in REPLIES:
                server = LoopbackLLMServer(api="openai", responder=lambda _, r=REPLIES[name]: r).start()
            timed = time_calls(name, calls, embedding, server)
            runs[name] += timed
            per_round[name].append(round(statistics.median(timed), 3))
    base = statistics.median(runs["none"])
    table = {name: {"calls": len(v), "p50_ms": round(statistics.median(v), 3),
                    "p95_ms": round(sorted(v)[int(0.95 * (len(v) - 1))], 3),
                    "p50_vs_none": round(statistics.median(v) / base - 1, 4), "round_p50s": per_round[name]}
             for name, v in runs.items()}  # fmt: skip
    print("| LLM | calls | p50 ms | p95 ms | p50 vs none | p50 of each round, ms |\n|---|---|---|---|---|---|")
    for name, row in table.items():
        print(f"| {name} | {row['calls']} | {row['p50_ms']} | {row['p95_ms']} | {100 * row['p50_vs_none']:+.1f} % | "
              f"{', '.join(map(str, row['round_p50s']))} |")
    if args.out:
        args.out.write_text(json.dumps({"calls": args.calls, "rounds": args.rounds, "table": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
