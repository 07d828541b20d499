"""``mnemoplan reindex``: the overlays rebuilt from the log, token vectors backfilled."""

from __future__ import annotations

import argparse
import sys

from mnemoplan.cli.common import add_common_arguments, open_service


def run(args: argparse.Namespace) -> int:
    """Rebuild the BM25 and graph overlays from the log, derive again the search vectors of long
    turns and of the turns after them (a log written before long turns stood alone), and give
    token vectors to the records written before the log kept them. Without --user the graph is
    written to a new file: one written before Kùzu ran in a process of its own can hold bytes of
    text it leaked."""
    service = open_service(args)
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


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``reindex`` to the command's subparsers."""
    p = sub.add_parser("reindex", help="rebuild the overlays from the log, backfill token vectors",
                       description=run.__doc__)  # fmt: skip
    add_common_arguments(p)
    p.set_defaults(func=run)
