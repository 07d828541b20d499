"""``mnemoplan token``: the bearer tokens the HTTP server requires (create, list, revoke)."""

from __future__ import annotations

import argparse
import sys

from mnemoplan.cli.common import add_common_arguments, settings_from_args


def run(args: argparse.Namespace) -> int:
    """Create, list or revoke the bearer tokens of the HTTP server on this data directory."""
    from mnemoplan.service.bootstrap import open_tokens

    settings = settings_from_args(args)
    tokens = open_tokens(settings)
    if args.action == "create":
        first = not tokens.configured()
        secret, info = tokens.create(user_id=None if args.admin else args.user, admin=args.admin,
                                     read_only=args.read_only, note=args.note or "")  # fmt: skip
        who = "admin (any user)" if info.admin else f"user {info.user_id!r}"
        print(secret)  # alone on stdout: `TOKEN=$(mnemoplan token create --user alice)`
        print(f"token {info.id} for {who}{', read-only' if info.read_only else ''}; the secret above is shown "
              "once: pass it as the header `Authorization: Bearer <token>`.", file=sys.stderr)  # fmt: skip
        if first:
            print("This is the first token: restart a running HTTP server to require tokens.", file=sys.stderr)
    elif args.action == "list":
        rows = tokens.list()
        if not rows:
            print("no tokens (HTTP is served without authentication, on loopback only)")
        for t in rows:
            who = "admin" if t.admin else f"user={t.user_id}"
            extra = " read-only" if t.read_only else ""
            note = f"  {t.note}" if t.note else ""
            print(f"{t.id}  {who}{extra}  created {t.created_at}{note}")
    else:
        info = tokens.revoke(args.id)
        print(f"revoked token {info.id}; it is refused from the next request on", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``token`` and its actions to the command's subparsers."""
    p = sub.add_parser("token", help="create, list or revoke HTTP bearer tokens", description=run.__doc__)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="make a token (the secret is printed once)",
                                description="Make a token for one user (--user) or an admin token (--admin).")  # fmt: skip
    add_common_arguments(create, user_help="the user whose memory the token reaches")
    create.add_argument("--admin", action="store_true", help="an admin token: may name any user_id")
    create.add_argument("--read-only", action="store_true", help="recall and search only: no remember or forget")
    create.add_argument("--note", help="what the token is for (shown by `token list`)")
    create.set_defaults(func=_create)
    listing = actions.add_parser("list", help="list tokens (never their secrets)", description="List tokens.")
    add_common_arguments(listing)
    listing.set_defaults(func=run)
    revoke = actions.add_parser("revoke", help="revoke a token by its id", description="Revoke a token.")
    add_common_arguments(revoke)
    revoke.add_argument("id", help="the token's id (from `token list`)")
    revoke.set_defaults(func=run)


def _create(args: argparse.Namespace) -> int:
    if args.admin == bool(args.user):
        print("mnemoplan token create: pass --user USER or --admin (one of them)", file=sys.stderr)
        return 2
    return run(args)
