"""``mnemoplan import`` and ``mnemoplan export``: bring memory in from other tools, take it out whole."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mnemoplan.cli.common import add_common_arguments, open_service

if TYPE_CHECKING:
    from mnemoplan.service.service import MemoryService

IMPORT_FORMATS = ("auto", "chatgpt", "claude", "mcp-memory", "jsonl", "markdown", "mnemoplan")


def run_import(args: argparse.Namespace) -> int:
    """Import a ChatGPT or Claude.ai data export (conversations.json or the zip), the MCP memory
    server's memory.jsonl, the bench's JSONL of messages, a folder of Markdown notes, or a
    mnemoplan export. Each conversation becomes a session with its times and speakers; importing
    the same file again adds nothing; records that cannot be read are listed and skipped."""
    from mnemoplan.progress import ProgressBar
    from mnemoplan.transfer.importer import import_file

    path: Path = args.file
    if not path.exists():
        print(f"mnemoplan: there is no file or folder {path}", file=sys.stderr)
        return 2
    service = open_service(args)
    try:
        with ProgressBar("import", None, "msg") as bar:
            def advance(read: int, total: int, messages: int) -> None:
                bar.advance(messages)
                if total:
                    bar.note(f"{100 * read // total}% of the file")

            started = time.perf_counter()
            summary = import_file(service, path, fmt=args.format, user_id=args.user, advance=advance)
        before = _derived(service, summary.user_id) - summary.derived
        _index(service)
        # the summary's time and derived records: until all of it is searchable, not until accepted
        summary.seconds = time.perf_counter() - started
        summary.derived = _derived(service, summary.user_id) - before
    finally:
        service.close()
    for line in summary.lines():
        print(line)
    failed = service.deferred.failures if service.deferred is not None else []
    for failure in dict.fromkeys(failed):  # accepted and kept in the inbox: the next start stores them
        print(f"mnemoplan: warning: {failure}", file=sys.stderr)
    return 1 if failed else 0


def _derived(service: MemoryService, user_id: str) -> int:
    from mnemoplan.model.scope import RecordFilter

    return service.store.log.count(RecordFilter(user_id, kinds=("fact", "procedure", "episode")))


def _index(service: MemoryService) -> None:
    """Wait, with a bar, until what the import stored is searchable: the messages are durable
    when the import answers; embedding them and reading their facts follow in the background
    and take most of an import's time."""
    from mnemoplan.progress import ProgressBar

    deferred = service.deferred
    left = deferred.pending() if deferred is not None else 0
    if left:
        with ProgressBar("index", left, "msg") as bar:
            while left:
                time.sleep(0.5)  # a bar's refresh, not a wait for the work: settle() below waits for that
                now = deferred.pending()
                bar.advance(max(0, left - now))
                left = now
    service.settle()


def run_export(args: argparse.Namespace) -> int:
    """Write one user's memory (--user) or every user's (--all) to a JSONL file that holds all
    needed to rebuild it (records, sessions, times, metadata, facts with their validity and
    history; with --vectors their embeddings too, so an import into a store of the same model
    embeds nothing); `mnemoplan import` reads it back. Forgotten memories are not in it."""
    from mnemoplan.progress import ProgressBar
    from mnemoplan.transfer.export import export_users, write_export

    if bool(args.user) == bool(args.all):
        print("mnemoplan: name the user (--user U) or pass --all", file=sys.stderr)
        return 2
    service = open_service(args, existing=True)
    try:
        users = export_users(service, None if args.all else args.user)
        with ProgressBar("export", None, "rec") as bar:
            def advance(done: int, total: int, step: int) -> None:
                bar.set_total(total)
                bar.advance(step)

            if args.output and str(args.output) != "-":
                tmp = args.output.with_name(args.output.name + ".part")
                with tmp.open("w", encoding="utf-8") as out:
                    count = write_export(service, out, users, advance, vectors=args.vectors)
                tmp.replace(args.output)  # a failed export leaves no truncated file under the name asked for
            else:
                count = write_export(service, sys.stdout, users, advance, vectors=args.vectors)
    finally:
        service.close()
    where = f" to {args.output}" if args.output and str(args.output) != "-" else ""
    print(f"exported {count} record(s) of {len(users)} user(s){where}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``import`` and ``export`` to the command's subparsers."""
    p = sub.add_parser("import", help="import conversations, notes or an export", description=run_import.__doc__)
    add_common_arguments(p, user_help="whose memory to import into (default: the default user; for an "
                                      "export, each record's own user)")  # fmt: skip
    p.add_argument("file", type=Path, help="the export file, zip or folder of notes")
    p.add_argument("--format", choices=IMPORT_FORMATS, default="auto", help="the file's format (default: guessed)")
    p.set_defaults(func=run_import)
    e = sub.add_parser("export", help="export memory to a JSONL file", description=run_export.__doc__)
    add_common_arguments(e, user_help="the user to export")
    e.add_argument("--all", action="store_true", help="export every user")
    e.add_argument("-o", "--output", type=Path, help="the file to write (default: standard output)")
    e.add_argument("--vectors", action="store_true", help="include each memory's vectors: importing into a store "
                   "of the same embedding model then embeds nothing (several times larger a file)")  # fmt: skip
    e.set_defaults(func=run_export)
