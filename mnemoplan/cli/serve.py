"""``mnemoplan serve``: the MCP server, over stdio or streamable HTTP."""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING

from mnemoplan import __version__
from mnemoplan.cli.common import add_common_arguments, settings_from_args, setup_logging

if TYPE_CHECKING:
    from mnemoplan.config import Settings


class Stopped(KeyboardInterrupt):
    """A stop asked for by a signal; a KeyboardInterrupt so that every layer unwinds it as Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: FrameType | None) -> None:
    """The first Ctrl-C or SIGTERM stops the server cleanly; a second one ends it at once."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Stopped(signum)


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop the server, closing what it opened.

    Python installs its Ctrl-C handler only when SIGINT is not ignored at start: a server
    started by a shell as a background job, or by a parent that ignores SIGINT, inherits it
    ignored, and Ctrl-C in its terminal did nothing. SIGTERM (how hosts and service managers
    stop a server) killed it without closing its stores.
    """
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)


def run(args: argparse.Namespace) -> int:
    """Run the MCP server (stdio by default)."""
    _stop_on_signals()
    settings = settings_from_args(args)
    if args.http:
        settings = settings.model_copy(update={"transport": "http"})
    if args.host:
        settings = settings.model_copy(update={"http_host": args.host})
    if args.port:
        settings = settings.model_copy(update={"http_port": args.port})
    setup_logging(settings.log_level, settings.log_file)
    if settings.transport == "http":
        where = (f"MCP over http://{settings.http_host}:{settings.http_port}/mcp, the web view at "
                 f"http://{settings.http_host}:{settings.http_port}/view (loopback callers only)")
    else:  # in a terminal, what looks like a prompt is a server waiting for its client
        where = "MCP over stdio: waiting for an MCP client on stdin"
        if sys.stdin is not None and sys.stdin.isatty():
            where += " (this is no prompt; Ctrl-C or Ctrl-D stops the server)"
    options: dict = {}
    if settings.transport == "http":
        options = http_options(settings)
        if options["tokens"] is not None:
            where = where.replace("(loopback callers only)", "(sign in with a token)")
            where += " (bearer token required: `mnemoplan token create`)"
    try:  # a stop can come at any moment, the imports included
        from mnemoplan.server.app import create_app

        memory = f"memory in {settings.data_dir} (default user {settings.default_user_id!r})"
        print(f"mnemoplan {__version__}: {memory}; {where}", file=sys.stderr, flush=True)
        app = create_app(settings, tokens=options.get("tokens"), base_url=options.get("base_url"))
        if settings.transport == "http":
            from mnemoplan.server.auth import transport_security

            security = transport_security(settings.http_host, settings.http_port, settings.http_allowed_hosts)
            # Servers sharing a log (replicas behind a proxy) keep no session: a call may land on any of them.
            app.run("streamable-http", host=settings.http_host, port=settings.http_port,
                    transport_security=security, stateless_http=settings.shared_storage)  # fmt: skip
        else:
            import anyio

            from mnemoplan.server.stdio import serve_stdio

            signum = anyio.run(serve_stdio, app)
            if signum is not None:
                raise Stopped(signum)
    except KeyboardInterrupt as stop:  # what the server opened, it closed on its way out
        signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
        how = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        print(f"mnemoplan: stopped ({how})", file=sys.stderr, flush=True)
        return 128 + signum
    # The client went away and the stores are closed. Python's exit may still wait for the
    # embedding model's load to end; a host's SIGTERM meanwhile ends the process, no traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return 0


def http_options(settings: Settings) -> dict:
    """The HTTP server's tokens and public URL. Without tokens, only a loopback address is served
    (with a warning): any other would give every user's memory to whoever reaches the port.

    Raises:
        SystemExit: A non-loopback address and no token.
    """
    from mnemoplan.server.auth import is_loopback
    from mnemoplan.service.bootstrap import open_tokens

    tokens = open_tokens(settings)
    host = settings.http_host
    shown = f"[{host}]" if ":" in host else host
    base_url = (settings.http_public_url or f"http://{shown}:{settings.http_port}").rstrip("/")
    if tokens.configured():
        return {"tokens": tokens, "base_url": base_url}
    if not is_loopback(host):
        sys.exit(f"mnemoplan: refusing to serve HTTP on {host} without authentication: anyone who reaches the "
                 f"port could read and delete every user's memory. Create a token first (`mnemoplan token create "
                 f"--user NAME` or `--admin`, same --data-dir), or serve on 127.0.0.1.")  # fmt: skip
    print(f"mnemoplan: warning: HTTP without authentication on {host}: every local process can reach every "
          "user's memory. Create a token (`mnemoplan token create`) and restart to require one.",
          file=sys.stderr, flush=True)  # fmt: skip
    return {"tokens": None, "base_url": base_url}


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is between 1 and 65535, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to the command's subparsers."""
    p = sub.add_parser("serve", help="run the MCP server (stdio unless --http)", description=run.__doc__)
    add_common_arguments(p)
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", help="HTTP host (default 127.0.0.1; any other address needs a token: "
                                  "`mnemoplan token create`)")
    p.add_argument("--port", type=_port, help="HTTP port (default 8765)")
    p.set_defaults(func=run)
