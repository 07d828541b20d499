"""The ``mnemoplan`` command: serve (default), config, reindex, search, stats, bench."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from mnemoplan import __version__


def _setup_logging(level: str, log_file: Path | None) -> None:
    # stdout belongs to the MCP stdio transport: logs go to stderr or a file.
    os.environ.setdefault("LANCE_LOG", "error")  # LanceDB's own (Rust) logger
    handler: logging.Handler = logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "sentence_transformers", "transformers", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _settings(args: argparse.Namespace):
    from pydantic import ValidationError

    from mnemoplan.config import Settings

    overrides = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    if getattr(args, "user", None):
        overrides["default_user_id"] = args.user
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        sys.exit(f"mnemoplan: invalid configuration:\n{exc}")


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the MCP server (stdio by default)."""
    settings = _settings(args)
    if args.http:
        settings = settings.model_copy(update={"transport": "http"})
    if args.host:
        settings = settings.model_copy(update={"http_host": args.host})
    if args.port:
        settings = settings.model_copy(update={"http_port": args.port})
    _setup_logging(settings.log_level, settings.log_file)
    from mnemoplan.server.app import create_app

    if settings.transport == "http":
        where = f"MCP over http://{settings.http_host}:{settings.http_port}/mcp"
    else:  # in a terminal, what looks like a prompt is a server waiting for its client
        where = "MCP over stdio: waiting for an MCP client on stdin"
        if sys.stdin is not None and sys.stdin.isatty():
            where += " (this is no prompt; Ctrl-C or Ctrl-D stops the server)"
    try:
        memory = f"memory in {settings.data_dir} (default user {settings.default_user_id!r})"
        print(f"mnemoplan {__version__}: {memory}; {where}", file=sys.stderr, flush=True)
        app = create_app(settings)
        if settings.transport == "http":
            app.run("streamable-http", host=settings.http_host, port=settings.http_port)
        else:
            import anyio

            from mnemoplan.server.stdio import serve_stdio

            anyio.run(serve_stdio, app)
    except KeyboardInterrupt:  # Ctrl-C: what the server opened, it closed on its way out
        print("mnemoplan: stopped (Ctrl-C)", file=sys.stderr, flush=True)
        return 130
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Print the effective configuration as JSON."""
    settings = _settings(args)
    print(json.dumps(settings.public_dict(), indent=2, default=str))
    return 0


def _open_service(args: argparse.Namespace, *, existing: bool = False):
    """The service over the data directory; with ``existing``, one that must hold a memory
    already (a search in a mistyped directory is an error, not an empty store made there)."""
    settings = _settings(args)
    if existing and not settings.data_dir.exists():
        from mnemoplan.errors import NotFound

        raise NotFound(f"There is no data directory {settings.data_dir}.",
                       hint="Check --data-dir or $MNEMOPLAN_DATA_DIR.")  # fmt: skip
    _setup_logging("WARNING" if not getattr(args, "verbose", False) else "INFO", settings.log_file)
    from mnemoplan.errors import MnemoError
    from mnemoplan.service.bootstrap import build_service

    try:
        return build_service(settings)
    except MnemoError as exc:
        sys.exit(f"mnemoplan: {exc.to_text()}")


def cmd_reindex(args: argparse.Namespace) -> int:
    """Rebuild the BM25 and graph overlays from the log, derive again the search vectors of long
    turns and of the turns after them (a log written before long turns stood alone), and give
    token vectors to the records written before the log kept them. Without --user the graph is
    written to a new file: one written before Kùzu ran in a process of its own can hold bytes of
    text it leaked."""
    service = _open_service(args)
    try:
        users = [args.user] if args.user else service.store.log.user_ids()
        print(f"re-indexing {len(users)} user(s)", file=sys.stderr)
        finished = 0

        def rebuilt(user: str, records: int) -> None:
            nonlocal finished
            finished += 1
            print(f"[{finished}/{len(users)}] {user}: {records} records re-indexed", file=sys.stderr)

        service.store.rebuild(args.user, rebuilt)  # every user's overlays before the slow token backfill
        for i, user in enumerate(users, 1):
            tokens = service.ingestor.backfill_tokens(
                user, lambda done, total: print(f"  token vectors {done}/{total}", file=sys.stderr)
            )
            if tokens:
                print(f"[{i}/{len(users)}] {user}: {tokens} records given token vectors", file=sys.stderr)
        service.store.maintain()
    finally:
        service.close()
    return 0


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 1 and 65535, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="mnemoplan",
        description="Long-term memory for AI agents, served over MCP. Without a command, runs `serve`.",
    )
    parser.add_argument("--version", action="version", version=f"mnemoplan {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def common(p: argparse.ArgumentParser, user_help: str = "") -> None:
        p.add_argument("--data-dir", type=Path, help="data directory (default: $MNEMOPLAN_DATA_DIR or ~/.local/share/mnemoplan)")
        p.add_argument("--user", help=user_help or "default user id (default: $MNEMOPLAN_DEFAULT_USER_ID or 'default')")

    p = sub.add_parser("serve", help="run the MCP server (stdio unless --http)", description=cmd_serve.__doc__)
    common(p)
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", help="HTTP host (default 127.0.0.1)")
    p.add_argument("--port", type=_port, help="HTTP port (default 8765)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("config", help="print the effective configuration", description=cmd_config.__doc__)
    common(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("reindex", help="rebuild the overlays from the log, backfill token vectors",
                       description=cmd_reindex.__doc__)  # fmt: skip
    common(p)
    p.set_defaults(func=cmd_reindex)

    from mnemoplan.cli import commands

    commands.add_commands(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``mnemoplan`` console script."""
    # Before numpy loads: OpenBLAS's worker threads spin on after each product and take the
    # cores the embedding model runs on (deep search p50 190 -> 120 ms on LoCoMo, recall the
    # same; bench/README.md). Set it yourself to choose otherwise.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
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
