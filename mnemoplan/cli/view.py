"""``mnemoplan view``: the web view of memory on this machine's loopback address."""

from __future__ import annotations

import argparse
import sys

from mnemoplan.cli.common import add_common_arguments, open_service

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def run(args: argparse.Namespace) -> int:
    """Serve the web view (sessions, messages, facts with their history, the entity graph, search
    with its plan and scores, forget) at http://127.0.0.1:PORT/view. Only this machine can reach
    it; forgetting is allowed unless --read-only."""
    if args.host not in LOOPBACK:
        print("mnemoplan: the view listens on a loopback address only (127.0.0.1, ::1, localhost); "
              "use `serve --http` to reach it from elsewhere", file=sys.stderr)  # fmt: skip
        return 2
    import uvicorn

    from mnemoplan.web.app import create_view_app, service_caller

    service = open_service(args)
    try:
        app = create_view_app(service_caller(service), writes=not args.read_only)
        print(f"mnemoplan: the web view is at http://{args.host}:{args.port}/view (Ctrl-C stops it)",
              file=sys.stderr, flush=True)  # fmt: skip
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    except KeyboardInterrupt:
        return 130
    finally:
        service.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``view`` to the command's subparsers."""
    p = sub.add_parser("view", help="browse memory in a web browser (loopback only)", description=run.__doc__)
    add_common_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8766, help="port (default 8766)")
    p.add_argument("--read-only", action="store_true", help="no forgetting from the view")
    p.set_defaults(func=run)
