"""``import``: read a source (``sources.sniff`` tells which), store each conversation as a session.

Each message goes in with its source's id (``source_id``), so importing the same file again
stores nothing new (``remember`` skips a source id its session holds). A record that cannot be
read is reported by its position and skipped; a conversation is stored in as few ``remember``
calls as the limits allow, each of which stores all of its messages or none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from mnemoplan.errors import MnemoError
from mnemoplan.model import MessageIn, check_text
from mnemoplan.service.service import MemoryService
from mnemoplan.transfer import chat_exports, notes
from mnemoplan.transfer.export import restore_export
from mnemoplan.transfer.sources import FORMATS, Bad, Conversation, Item, Message, Source, sniff

Advance = Callable[[int, int, int], None]  # (bytes read so far, bytes in all, messages stored in the step)


@dataclass
class ImportSummary:
    """What an import did."""

    format: str
    user_id: str
    conversations: int = 0
    sessions_with_new: int = 0
    messages: int = 0
    stored: int = 0
    duplicates: int = 0
    derived: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def lines(self, most: int = 20) -> list[str]:
        """The summary as lines for a terminal."""
        rate = self.messages / self.seconds if self.seconds else 0.0
        out = [
            f"imported {self.format} for user {self.user_id!r}: {self.conversations} conversation(s), "
            f"{self.messages} message(s) in {self.seconds:.1f} s ({rate:.0f} msg/s)",
            f"  {self.stored} stored, {self.duplicates} already in memory, {self.derived} facts or summaries "
            f"derived; {self.sessions_with_new} session(s) gained messages",
        ]
        out += [f"  note: {note}" for note in self.notes]
        if self.skipped:
            out.append(f"  {len(self.skipped)} record(s) skipped:")
            out.extend(f"    {s}" for s in self.skipped[:most])
            if len(self.skipped) > most:
                out.append(f"    ... and {len(self.skipped) - most} more")
        return out


def _split(text: str, most: int) -> list[str]:
    """``text`` in parts of at most ``most`` characters, cut at a paragraph or line where one is near."""
    parts = []
    while len(text) > most:
        cut = max(text.rfind("\n\n", 0, most), text.rfind("\n", 0, most))
        cut = cut if cut > most // 2 else most
        parts.append(text[:cut])
        text = text[cut:].lstrip("\n")
    return [*parts, text] if text.strip() else parts


def _messages(conv: Conversation, service: MemoryService, fmt: str) -> tuple[list[MessageIn], list[str]]:
    """The conversation's messages as ``remember`` takes them; a text too long is stored in parts."""
    limit = service.limits.max_text_chars
    out: list[MessageIn] = []
    problems = list(conv.problems)
    meta = {"imported_from": fmt}
    for i, msg in enumerate(conv.messages):
        pieces = _split(msg.text, limit) if len(msg.text) > limit else [msg.text]
        for j, piece in enumerate(pieces):
            try:
                text = check_text(piece.replace("\x00", ""), what="text", max_chars=limit)
            except MnemoError as exc:
                problems.append(f"{conv.position}, message {i}: {exc.message}")
                break
            source = msg.source_id if len(pieces) == 1 else f"{msg.source_id}#{j + 1}"
            extra = meta if len(pieces) == 1 else {**meta, "part": j + 1, "parts": len(pieces)}
            out.append(MessageIn(content=text, speaker=msg.speaker or None, occurred_at=msg.occurred_at,
                                 source_id=source[:200], kind=msg.kind, metadata=extra))  # type: ignore[arg-type]  # fmt: skip
    return out, problems


def read_items(path: Path, fmt: str, advance: Callable[[int, int], None] | None = None) -> Iterator[Item]:
    """The conversations and bad records of ``path`` in format ``fmt``; ``advance(read, total)``
    hears how far into the file (bytes; notes: files) reading has come."""
    if fmt == "markdown":
        items = list(notes.markdown_folder(path))
        for i, item in enumerate(items, 1):
            yield item
            if advance:
                advance(i, len(items))
        return
    source = Source(path)
    try:
        stream, size = source.open()
        with stream:
            if fmt == "chatgpt":
                reader = chat_exports.chatgpt(stream)
            elif fmt == "claude":
                reader = chat_exports.claude(stream)
            elif fmt == "jsonl":
                reader = chat_exports.generic_jsonl(stream)
            else:
                reader = notes.mcp_memory(stream, datetime.fromtimestamp(path.stat().st_mtime, UTC))
            for item in reader:
                yield item
                if advance:
                    advance(stream.tell(), size)
    finally:
        source.close()


def import_file(
    service: MemoryService, path: Path, *, fmt: str = "auto", user_id: str | None = None,
    advance: Advance | None = None,
) -> ImportSummary:  # fmt: skip
    """Import ``path`` into ``user_id``'s memory (the service's default user when None).

    Raises:
        InvalidInput: an unknown format, or a file that cannot be read as one.
    """
    from mnemoplan.errors import InvalidInput

    fmt = sniff(path) if fmt == "auto" else fmt
    if fmt not in FORMATS:
        raise InvalidInput(f"Unknown format {fmt!r}.", hint=f"Use one of: auto, {', '.join(FORMATS)}.")
    user = user_id or service.default_user_id
    summary = ImportSummary(fmt, user)
    started = time.perf_counter()
    if fmt == "mnemoplan":
        restored = restore_export(service, path, user_id=user_id, advance=advance)
        summary.user_id, summary.messages = ", ".join(restored.users) or user, restored.read
        summary.stored, summary.duplicates, summary.skipped = restored.stored, restored.duplicates, restored.skipped
        summary.conversations, summary.notes = restored.sessions, restored.notes
        summary.seconds = time.perf_counter() - started
        return summary
    position = [0, 0]

    def moved(read: int, total: int) -> None:
        position[:] = [read, total]

    batch = service.limits.max_messages_per_call
    for item in read_items(path, fmt, moved):
        if isinstance(item, Bad):
            summary.skipped.append(f"{item.position}: {item.reason}")
            continue
        summary.conversations += 1
        messages, problems = _messages(item, service, fmt)
        summary.skipped.extend(problems)
        summary.messages += len(messages)
        stored = 0
        for start in range(0, len(messages), batch):
            try:
                result = service.remember(messages=messages[start : start + batch], user_id=user,
                                          session_id=item.session_id[:200])  # fmt: skip
            except MnemoError as exc:  # a bad batch: reported, the rest goes on
                summary.skipped.append(f"{item.position}, messages {start}-{start + batch - 1}: {exc.message}")
                continue
            stored += result.stored
            summary.duplicates += result.duplicates
            summary.derived += result.derived
        summary.stored += stored
        summary.sessions_with_new += stored > 0
        if advance:
            advance(position[0], position[1], len(messages))
    summary.seconds = time.perf_counter() - started
    return summary
