#!/usr/bin/env python3
"""An agent loop's write rate: one message per ``remember``, as an agent stores its turns.

    python bench/agent_loop.py --dataset ../shared/data/realmem-dev --conversation realmem_Kenta_Tanaka
    python bench/agent_loop.py --dataset ../shared/data/realmem-dev --messages 400 --runtime torch

Sends the first N messages of one conversation (a directory of messages.jsonl, the bench's
generic format) through the service's ``remember``, one message per call, then waits until
every one is embedded and stored. Prints the acknowledged rate (what the agent waits for) and
the stored rate (messages embedded, indexed and in the log per second, start to end): recall
finds a message by its words from the moment it is acknowledged, by its meaning once stored.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from mnemoplan.config import Settings
from mnemoplan.model import MessageIn
from mnemoplan.runtime import configure
from mnemoplan.service.bootstrap import build_service


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", type=Path, required=True, help="directory holding messages.jsonl")
    parser.add_argument("--conversation", default="", help="conversation id (default: the first)")
    parser.add_argument("--messages", type=int, default=400, help="messages to send (400)")
    parser.add_argument("--runtime", default="auto", choices=["auto", "onnx", "torch"], help="embedding runtime")
    args = parser.parse_args()
    configure()
    rows = [json.loads(line) for line in (args.dataset / "messages.jsonl").open(encoding="utf-8")]
    conv = args.conversation or rows[0]["conv_id"]
    messages = [r for r in rows if r["conv_id"] == conv and str(r["text"]).strip()][: args.messages]
    if not messages:
        raise SystemExit(f"no messages of conversation {conv!r} in {args.dataset}")
    with tempfile.TemporaryDirectory() as tmp:
        service = build_service(Settings(data_dir=Path(tmp) / "data", embedding_runtime=args.runtime))
        try:
            service.embedder.embed(["warm up"])  # the model's load is not the loop's cost
            started = time.perf_counter()
            for m in messages:
                message = MessageIn(content=m["text"], speaker=m.get("speaker") or None,
                                    occurred_at=m.get("timestamp"), source_id=m.get("dia_id"))  # fmt: skip
                service.remember(messages=[message], user_id=conv, session_id=f"session_{m.get('session', '')}")
            acknowledged = time.perf_counter()
            service.settle()
            stored = time.perf_counter()
        finally:
            service.close()
    n = len(messages)
    print(f"{n} messages of {conv}, one per remember ({service.embedder.runtime}): "
          f"acknowledged {n / (acknowledged - started):.1f}/s, stored {n / (stored - started):.1f}/s")  # fmt: skip


if __name__ == "__main__":
    main()
