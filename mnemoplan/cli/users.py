"""``mnemoplan users``: the users a store holds, with counts."""

from __future__ import annotations

import argparse
import json

from mnemoplan.cli.common import add_common_arguments, open_service, settings_from_args


def run(args: argparse.Namespace) -> int:
    """List the users the data directory holds, with their records and sessions (through the
    server that holds the directory, if one runs)."""
    settings = settings_from_args(args)
    service = open_service(args, existing=True, shared=True)
    try:
        users = service.users()
    finally:
        service.close()
    if args.json:
        print(json.dumps([u.model_dump() for u in users], indent=2))
        return 0
    if not users:
        print(f"no memories in {settings.data_dir} yet")
        return 0
    width = max(len(u.user_id) for u in users)
    print(f"{'user':<{width}}  {'records':>8}  {'sessions':>8}")
    for u in users:
        mark = "  (default)" if u.user_id == settings.default_user_id else ""
        print(f"{u.user_id:<{width}}  {u.records:>8}  {u.sessions:>8}{mark}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``users`` to the command's subparsers."""
    p = sub.add_parser("users", help="list the users a store holds, with counts", description=run.__doc__)
    add_common_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)
