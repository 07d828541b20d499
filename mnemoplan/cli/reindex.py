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
    from mnemoplan.progress import ProgressBar

    service = open_service(args)
    try:
        users = [args.user] if args.user else service.store.log.user_ids()
        print(f"re-indexing {len(users)} user(s)", file=sys.stderr)
        with ProgressBar("overlays", len(users), "user") as bar:

            def rebuilt(user: str, records: int) -> None:
                bar.advance()
                if not bar.drawn:  # on a terminal the bar shows it; elsewhere a line per user
                    print(f"[{bar.done}/{len(users)}] {user}: {records} records re-indexed", file=sys.stderr)

            service.store.rebuild(args.user, rebuilt)  # every user's overlays before the slow token backfill
        for i, user in enumerate(users, 1):
            with ProgressBar(f"{user}: token vectors", None, "rec") as bar:
                seen = [0]

                def advance(done: int, total: int) -> None:
                    bar.set_total(total)
                    bar.advance(done - seen[0])
                    seen[0] = done

                tokens = service.ingestor.backfill_tokens(user, advance)
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
