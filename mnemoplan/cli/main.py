"""The ``mnemoplan`` command: serve (default), config, reindex, search, stats, users, token, bench, import,
export, view.

The parser and the entry point; each command lives in a module of its own.
"""

from __future__ import annotations

import argparse
import sys

from mnemoplan import __version__
from mnemoplan.cli import bench, config, reindex, search, serve, stats, token, transfer, users, view
from mnemoplan.runtime import configure


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="mnemoplan",
        description="Long-term memory for AI agents, served over MCP. Without a command, runs `serve`.",
    )
    parser.add_argument("--version", action="version", version=f"mnemoplan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (serve, config, reindex, search, stats, users, token, bench, transfer, view):
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mnemoplan`` console script."""
    configure()  # before numpy, torch or LanceDB load (runtime.py says why)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["serve", *(argv or sys.argv[1:])])
    from mnemoplan.errors import MnemoError, storage_failure
    from mnemoplan.storage.graph.client import GraphError

    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        # Bad input, a locked data directory, a full disk or one that cannot be written (whichever
        # storage library said so): one line with a hint, not a traceback.
        failure = exc if isinstance(exc, MnemoError) else storage_failure(exc, args.command)
        if failure is not None:
            print(f"mnemoplan: {failure.to_text()}", file=sys.stderr)
            return 2
        if isinstance(exc, GraphError):  # the graph's process could not start (held elsewhere), or died
            print(f"mnemoplan: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, OSError):  # a data directory that is a file, say
            where = f": {exc.filename}" if exc.filename else ""
            print(f"mnemoplan: {exc.strerror or exc}{where}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
