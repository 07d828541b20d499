"""Readers of notes and knowledge graphs: a folder of Markdown notes, and the MCP reference memory
server's ``memory.jsonl``.

A note is a session of its own (its path in the folder), one message per section (a heading
starts one), dated by its front matter's ``date`` (or ``created``), else the file's modification
time. The memory server's file has no conversations: each entity is a session whose observations,
and the relations it starts, are facts.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO, Any

import yaml

from mnemoplan.transfer.sources import Bad, Conversation, Item, Message, digest, iso_time, json_lines

NOTE_SUFFIXES = (".md", ".markdown")
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*(?:\n|\Z)", re.S)
_HEADING = re.compile(r"^#{1,6}\s", re.M)


def _note_time(meta: dict[str, Any], path: Path) -> datetime:
    for key in ("date", "created", "created_at"):
        value = meta.get(key)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, date):
            return datetime(value.year, value.month, value.day, tzinfo=UTC)
        if isinstance(value, str):
            try:
                when = iso_time(value)
            except ValueError:
                continue
            if when is not None:
                return when
    return datetime.fromtimestamp(path.stat().st_mtime, UTC)


def _sections(body: str) -> list[str]:
    starts = [m.start() for m in _HEADING.finditer(body)]
    cuts = [0, *[s for s in starts if s > 0], len(body)]
    return [body[a:b].strip() for a, b in zip(cuts, cuts[1:], strict=False) if body[a:b].strip()]


def markdown_folder(folder: Path) -> Iterator[Item]:
    """Each Markdown note under ``folder`` (sorted by path) as a session of sections."""
    notes = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.suffix.lower() in NOTE_SUFFIXES)
    for path in notes:
        rel = path.name if path == folder else path.relative_to(folder).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            yield Bad(rel, f"cannot be read ({exc})")
            continue
        meta: dict[str, Any] = {}
        match = _FRONT_MATTER.match(text)
        if match:
            try:
                loaded = yaml.safe_load(match.group(1))
            except yaml.YAMLError as exc:
                yield Bad(rel, f"front matter is not YAML ({str(exc).splitlines()[0]})")
                continue
            meta = loaded if isinstance(loaded, dict) else {}
            text = text[match.end() :]
        when = _note_time(meta, path)
        title = str(meta.get("title") or path.stem)
        messages = [Message(s, "user", when, f"{rel}#{digest(s)}") for s in _sections(text)]
        yield Conversation(rel, f"notes:{rel}", title, messages)


def _words(name: str) -> str:
    return name.replace("_", " ")


def mcp_memory(stream: IO[bytes], file_time: datetime) -> Iterator[Item]:
    """Entities and relations of the MCP memory server's JSONL, one session per entity, its
    observations and the relations from it as facts. Times: an entity's ``createdAt`` if the file
    has it, else the file's modification time. The file is read whole first: a relation may come
    before the entity it starts from."""
    entities: dict[str, Conversation] = {}

    def session(name: str, position: str) -> Conversation:
        if name not in entities:
            entities[name] = Conversation(position, f"mcp-memory:{name}", name, [])
        return entities[name]

    for n, row in json_lines(stream):
        if isinstance(row, Bad):
            yield row
            continue
        kind = row.get("type")
        try:
            when = iso_time(row.get("createdAt")) or file_time
        except ValueError as exc:
            yield Bad(f"line {n}", str(exc))
            continue
        if kind == "entity":
            name, observations = row.get("name"), row.get("observations", [])
            if not isinstance(name, str) or not name.strip() or not isinstance(observations, list):
                yield Bad(f"line {n}", "an entity needs a name and a list of observations")
                continue
            conv = session(name, f"line {n} (entity {name})")
            label = f"{_words(name)} ({row['entityType']})" if isinstance(row.get("entityType"), str) else _words(name)
            for obs in observations:
                if isinstance(obs, str) and obs.strip():
                    conv.messages.append(Message(f"{label}: {obs.strip()}", "", when, f"obs:{digest(name, obs)}", "fact"))
                else:
                    conv.problems.append(f"line {n}: an observation of {name} is not text")
        elif kind == "relation":
            ends = [row.get("from"), row.get("relationType"), row.get("to")]
            if not all(isinstance(e, str) and e.strip() for e in ends):
                yield Bad(f"line {n}", "a relation needs from, relationType and to")
                continue
            src, rel, dst = ends
            text = f"{_words(src)} {_words(rel)} {_words(dst)}"
            session(src, f"line {n} (relation from {src})").messages.append(
                Message(text, "", when, f"rel:{digest(src, rel, dst)}", "fact"))  # fmt: skip
        else:
            yield Bad(f"line {n}", f"type {kind!r} is neither 'entity' nor 'relation'")
    yield from entities.values()
