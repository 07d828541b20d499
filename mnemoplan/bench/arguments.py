"""The options of ``mnemoplan bench`` and ``bench-scale``, apart from the code that runs them.

Building the CLI's parser must stay cheap: ``mnemoplan serve`` builds it too, and the bench
modules import the storage and planning stack (0.8 s of imports before the server could
answer ``initialize``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

MODES = ("recall", "deep", "bm25", "vector")


def modes_argument(value: str) -> str:
    """``--mode``: ``all``, ``abstain``, or modes joined by commas.

    Raises:
        argparse.ArgumentTypeError: an unknown mode.
    """
    if value in ("all", "abstain"):
        return value
    unknown = [m for m in value.split(",") if m not in MODES]
    if unknown or not value:
        raise argparse.ArgumentTypeError(f"unknown mode {', '.join(unknown) or value!r}: "
                                         f"use {', '.join(MODES)} (joined by commas), all or abstain")
    return value


def bench_arguments(p: argparse.ArgumentParser) -> None:
    """The bench command's options."""
    src = p.add_argument_group("data (one of)")
    src.add_argument("--dataset", type=Path, 
                     help="a benchmark in LoCoMo's JSON format (e.g. locomo10.json), or a directory "
                          "holding messages.jsonl and questions.jsonl")  # fmt: skip
    src.add_argument("--messages", type=Path, help="generic format: messages JSONL")
    src.add_argument("--questions", type=Path, help="generic format: questions JSONL")
    src.add_argument("--suite", choices=["updates"],
                     help="a bundled suite: 'updates' scores facts that change (see bench/suites/updates/README.md)")
    p.add_argument("--split", choices=["dev", "heldout", "all"], default="all",
                   help="with --suite: the conversations to run (default all; figures are given per split)")
    p.add_argument("--mode", type=modes_argument, default="recall",
                   help="what to query: one of recall, deep, bm25, vector, or several joined by commas "
                   "(recall,deep), or all (default recall); abstain: each question of its own and of another "
                   "conversation, scored by the AUROC of recall's confidence")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="directory for rankings, metrics, report and plots")
    p.add_argument("--data-dir", type=Path, help="memory data directory (default: a fresh temporary one)")
    p.add_argument("--limit-conversations", type=int, metavar="N", help="only the first N conversations")
    p.add_argument("--questions-per-conversation", type=int, metavar="N",
                   help="only the first N questions of each conversation (asked mid-conversation: the "
                        "conversation is stored only up to the last of them)")  # fmt: skip
    p.add_argument("--no-session", action="store_true",
                   help="mid-conversation: recall is not told the session it is asked from, nor its recent turns")
    p.add_argument("--mcp-sample", type=int, default=50, metavar="N",
                   help="questions timed through a real MCP stdio round trip (0: skip; default 50)")  # fmt: skip
    p.add_argument("--cold-starts", type=int, default=3, metavar="N",
                   help="fresh server processes timed from initialize to the first recall reply (0: skip; default 3)")
    p.add_argument("--embedding-model", default="all-MiniLM-L6-v2", help="embedding model (default bundled MiniLM)")
    p.add_argument("--readme", type=Path, help="update this README's results block with the overall table")
    p.add_argument("--keep-data", action="store_true", help="keep the temporary data directory")
    p.add_argument("--llm", action="store_true",
                   help="with the LLM the environment configures (MNEMOPLAN_LLM_PROVIDER, ..., or ANTHROPIC_API_KEY): "
                        "the updates suite, and --dataset if given, run without it and with it; quality side by "
                        "side, with the LLM's calls, tokens and time per message (llm.md). Without --llm, no LLM.")


def scale_arguments(p: argparse.ArgumentParser) -> None:
    """The bench-scale command's options."""
    p.add_argument("--dataset", type=Path, action="append", required=True,
                   help="source text, repeatable: LoCoMo's JSON, or a directory of messages.jsonl and questions.jsonl "
                        "(e.g. --dataset ../shared/data/locomo10.json --dataset ../shared/data/realmem-dev)")  # fmt: skip
    p.add_argument("--users", type=int, default=1000, metavar="U", help="users of --per-user messages (1000)")
    p.add_argument("--per-user", type=int, default=1000, metavar="M", help="messages of each such user (1000)")
    p.add_argument("--big-user", type=int, default=100_000, metavar="N",
                   help="messages of the one big user (100000; 0: none); two users of 10 x M besides")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="directory for scale.json and scale.md")
    p.add_argument("--data-dir", type=Path, help="data directory: a store built there is resumed or reused")
    p.add_argument("--queries", type=int, default=200, metavar="Q", help="timed recalls per user size (200)")
    p.add_argument("--clients", type=int, default=50, metavar="C",
                   help="HTTP clients at once, each its own user and token (50; 0: no HTTP load)")  # fmt: skip
    p.add_argument("--load-seconds", type=float, default=300.0, metavar="S", help="length of the HTTP load (300)")
    p.add_argument("--load-rate", type=float, default=21.0, metavar="R", help="calls per second, all clients (21)")
    p.add_argument("--embedding-model", default="all-MiniLM-L6-v2", help="embedding model (bundled MiniLM)")
    p.add_argument("--keep-data", action="store_true", help="keep the data directory at the end")


def _sizes(value: str) -> list[int]:
    try:
        sizes = [int(v) for v in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes are numbers joined by commas, got {value!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("each size is at least 1")
    return sizes


def replicas_arguments(p: argparse.ArgumentParser) -> None:
    """The bench-replicas command's options."""
    p.add_argument("--sizes", type=_sizes, default=[1000, 10_000], help="users' sizes for the first touch "
                   "(memories, joined by commas; default 1000,10000)")  # fmt: skip
    p.add_argument("--calls", type=int, default=500, help="freshness checks timed (500)")
    p.add_argument("--users", type=int, default=4, help="users calling at once over HTTP (4)")
    p.add_argument("--memories", type=int, default=300, help="memories of each HTTP user (300)")
    p.add_argument("--rounds", type=int, default=60, help="timed rounds per user (2 recalls + 1 remember each; 60)")
    p.add_argument("--no-http", action="store_true", help="skip nginx and the HTTP servers")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, stores)")
    p.add_argument("--out", type=Path, default=Path("bench/results/replicas"), help="where replicas.json goes")
