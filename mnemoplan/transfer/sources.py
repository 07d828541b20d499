"""What an import reads: conversations of messages, or records it could not read, by position.

Each reader (``chat_exports``, ``notes``, ``graph_memory``) yields, in file order, either a
``Conversation`` (one session to store) or a ``Bad`` record (where it is, what is wrong); the
importer stores the first and reports the second. A reader never stops at a malformed record,
only at a file that cannot be read on (broken JSON syntax).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import ijson

from mnemoplan.errors import InvalidInput

FORMATS = ("chatgpt", "claude", "mcp-memory", "jsonl", "markdown", "mnemoplan")


@dataclass
class Message:
    """One message to store, with the source's own id (its identity on a re-import)."""

    text: str
    speaker: str
    occurred_at: datetime | None
    source_id: str
    kind: str = "message"


@dataclass
class Conversation:
    """One conversation of the source: a session."""

    position: str
    session_id: str
    title: str
    messages: list[Message]
    problems: list[str] = field(default_factory=list)  # messages skipped, by position


@dataclass
class Bad:
    """A record that could not be read: where it is, and why."""

    position: str
    reason: str


Item = Conversation | Bad
Tell = Callable[[], int]  # bytes of the source read so far (for a progress bar)


def digest(*parts: str) -> str:
    """A short stable id made of ``parts`` (for sources without ids of their own)."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:24]


def epoch_time(value: Any) -> datetime | None:
    """A Unix time in seconds (ChatGPT's ``create_time``) as UTC; None when absent.

    Raises:
        ValueError: not a number of seconds.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"time {value!r} is not a number of seconds")
    return datetime.fromtimestamp(float(value), UTC)


def iso_time(value: Any) -> datetime | None:
    """An ISO-8601 time ('2024-05-01T14:00:00.123456Z'); naive times are UTC. None when absent.

    Raises:
        ValueError: not an ISO-8601 time.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"time {value!r} is not a string")
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


class Source:
    """An open file to import: a plain file, a member of a zip, or a folder (``markdown``)."""

    def __init__(self, path: Path, member: str = "conversations.json") -> None:
        if not path.exists():
            raise InvalidInput(f"There is no file or folder {path}.")
        self.path = path
        self.member = member
        self._zip: zipfile.ZipFile | None = None

    def open(self) -> tuple[IO[bytes], int]:
        """The file's bytes and their size; a zip's ``conversations.json`` (at any depth).

        Raises:
            InvalidInput: a zip without that member, or a folder.
        """
        if self.path.is_dir():
            raise InvalidInput(f"{self.path} is a folder; only Markdown notes are imported from a folder.",
                               hint="Pass --format markdown, or the export's file.")  # fmt: skip
        if zipfile.is_zipfile(self.path):
            self._zip = zipfile.ZipFile(self.path)
            names = [n for n in self._zip.namelist() if n.rsplit("/", 1)[-1] == self.member]
            if not names:
                raise InvalidInput(f"{self.path} holds no {self.member}.",
                                   hint="Pass the zip of a ChatGPT or Claude data export.")  # fmt: skip
            info = self._zip.getinfo(min(names, key=len))
            return self._zip.open(info), info.file_size
        return self.path.open("rb"), self.path.stat().st_size

    def close(self) -> None:
        """Close the zip, if one was opened."""
        if self._zip is not None:
            self._zip.close()


def json_items(stream: IO[bytes], what: str) -> Iterator[tuple[int, Any]]:
    """The elements of a top-level JSON array, one at a time (a big export is never read whole).

    Raises:
        InvalidInput: the file is not a JSON array, or its syntax breaks off (at element ``n``).
    """
    n = -1
    try:
        for n, item in enumerate(ijson.items(stream, "item", use_float=True)):
            yield n, item
    except ijson.JSONError as exc:
        raise InvalidInput(f"{what} is not valid JSON after element {n}: {exc}.",
                           hint="Re-download the export; the records before this point were imported.") from None


def json_lines(stream: IO[bytes]) -> Iterator[tuple[int, dict[str, Any] | Bad]]:
    """Each non-blank line of a JSON Lines file, parsed, with its line number; a line that is not
    a JSON object is a ``Bad`` record."""
    for n, raw in enumerate(stream, 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            yield n, Bad(f"line {n}", f"not JSON ({getattr(exc, 'msg', exc)})")
            continue
        yield n, row if isinstance(row, dict) else Bad(f"line {n}", "not a JSON object")


def sniff(path: Path) -> str:
    """The format of ``path``, from its first record.

    Raises:
        InvalidInput: a file of none of the known formats.
    """
    if path.is_dir():
        return "markdown"
    source = Source(path)
    try:
        stream, _ = source.open()
        with stream:
            head = stream.read(1 << 16).lstrip()
    finally:
        source.close()
    if head.startswith(b"["):
        text = head.decode("utf-8", "replace")
        if '"mapping"' in text:
            return "chatgpt"
        if '"chat_messages"' in text:
            return "claude"
    elif head.startswith(b"{"):
        first = head.split(b"\n", 1)[0]
        try:
            row = json.loads(first)
        except json.JSONDecodeError:
            row = {}
        if row.get("type") == "mnemoplan-export":
            return "mnemoplan"
        if row.get("type") in ("entity", "relation"):
            return "mcp-memory"
        if "conv_id" in row:
            return "jsonl"
    raise InvalidInput(f"The format of {path} is none of {', '.join(FORMATS)}.",
                       hint="Pass --format to say which it is.")  # fmt: skip
