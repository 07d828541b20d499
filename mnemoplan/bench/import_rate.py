"""How fast ``mnemoplan import`` reads a chat export: a synthetic ChatGPT-shaped
``conversations.json`` of N messages, imported into a fresh data directory, timed end to end
(parsing, embedding, storing, fact extraction), then imported again (nothing new: the cost of
recognising repeats).

    python -m mnemoplan.bench.import_rate --messages 10000 --out /tmp/import-rate

The text is made from a seeded random vocabulary (no dataset's wording), in conversations of
alternating user and assistant turns, a minute apart.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mnemoplan.config import Settings
from mnemoplan.model.scope import RecordFilter
from mnemoplan.progress import ProgressBar
from mnemoplan.service.bootstrap import build_service
from mnemoplan.transfer.importer import import_file

WORDS = ("garden trip sister budget recipe train meeting doctor guitar novel flat bike coffee museum "
         "river winter project deadline puppy concert market lesson camera holiday bakery hiking office "
         "invoice painting marathon kitchen library festival ferry island report gym cousin wedding").split()
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana"]


def synthetic_export(n_messages: int, per_conversation: int = 50, seed: int = 7) -> list[dict[str, Any]]:
    """A ChatGPT ``conversations.json`` of ``n_messages`` messages."""
    rng = random.Random(seed)
    out, made, start = [], 0, 1_700_000_000.0
    for c in range(0, n_messages, per_conversation):
        count = min(per_conversation, n_messages - c)
        mapping: dict[str, Any] = {f"r{c}": {"id": f"r{c}", "message": None, "parent": None, "children": []}}
        parent = f"r{c}"
        t0 = start + c * 3600
        for i in range(count):
            nid = f"n{c}-{i}"
            role = "user" if i % 2 == 0 else "assistant"
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))
            text = (f"I told {rng.choice(NAMES)} about the {words}." if role == "user"
                    else f"That sounds like a good plan for the {words}.")  # fmt: skip
            mapping[nid] = {"id": nid, "parent": parent, "children": [],
                            "message": {"id": nid, "author": {"role": role}, "create_time": t0 + 60 * i,
                                        "content": {"content_type": "text", "parts": [text]}, "metadata": {}}}  # fmt: skip
            mapping[parent]["children"].append(nid)
            parent = nid
            made += 1
        out.append({"title": f"conversation {c // per_conversation}", "create_time": t0, "mapping": mapping,
                    "current_node": parent, "conversation_id": f"synthetic-{c}"})  # fmt: skip
    assert made == n_messages
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; writes import_rate.json under --out and prints a summary."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=1, help="fresh imports to time (the median is reported)")
    p.add_argument("--embedding-model", default=None, help="'hash' for the test embedder (default: the real model)")
    p.add_argument("--out", type=Path, default=Path("import-rate"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    export = args.out / "conversations.json"
    export.write_text(json.dumps(synthetic_export(args.messages)), encoding="utf-8")
    firsts, repeats, done = [], [], []
    derived = 0
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="mnemoplan-import-") as tmp:
            extra = {"embedding_model": args.embedding_model} if args.embedding_model else {}
            service = build_service(Settings(data_dir=Path(tmp) / "data", **extra))
            try:
                service.embedder.embed(["warm up the model"])  # the model's load is not the import's
                started = time.perf_counter()
                with ProgressBar(f"run {run + 1}", args.messages, "msg") as bar:
                    first = import_file(service, export, user_id="bench",
                                        advance=lambda _r, _t, n: bar.advance(n))  # fmt: skip
                # the import answers once the messages are durable; embedding and derived facts
                # follow in the background: the rate is until all of it is searchable
                service.settle()
                searchable = time.perf_counter() - started
                derived = service.store.log.count(RecordFilter("bench", kinds=("fact", "procedure", "episode")))
                again = import_file(service, export, user_id="bench")
            finally:
                service.close()
        assert first.stored == args.messages and again.stored == 0, (first.lines(), again.lines())
        with (args.out / "runs.jsonl").open("a") as runs:  # each run as it ends: a long run is not lost
            runs.write(json.dumps({"run": run + 1, "accepted_seconds": round(first.seconds, 2),
                                   "searchable_seconds": round(searchable, 2),
                                   "reimport_seconds": round(again.seconds, 2)}) + "\n")  # fmt: skip
        firsts.append(first)
        done.append(searchable)
        repeats.append(again)
    result = {
        "messages": args.messages, "runs": args.runs, "embedding_model": args.embedding_model or "default",
        "file_mb": round(export.stat().st_size / 1e6, 2),
        "accepted_seconds": [round(s.seconds, 2) for s in firsts],
        "searchable_seconds": [round(s, 2) for s in done],
        "median_msg_per_s": round(args.messages / statistics.median(done), 1),
        "reimport_seconds": [round(s.seconds, 2) for s in repeats],
        "derived": derived,  # facts and summaries read from the messages, in the last run
    }  # fmt: skip
    (args.out / "import_rate.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
