"""A lossless export of memory to one JSONL file, and its import.

The first line says what the file is (``{"type": "mnemoplan-export", "version": 1, ...}``); each
next line is one record of the log as stored: id, user, project, session, kind, speaker, text,
times, source id, metadata, entities, event times, and for facts their validity and what replaced
them (``superseded_by``), with derived records (facts, summaries) naming their sources. What was
forgotten is no longer in the log, so it is in no export.

Vectors are left out unless asked for (``vectors``): then the header names the embedding model
(``"vectors": {"model": ..., "dim": ...}``) and each record carries its embedding and packed
token vectors (``"embedding"``, ``"tokens"``: base64 of the stored bytes), and importing into a
store of the same model writes them as they were, without embedding anything again (a move or
a restore at storage speed, ranking as the original did). Into a store of another model, or
from an export without vectors, the text is embedded again.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np

from pydantic import ValidationError

from mnemoplan import __version__
from mnemoplan.errors import InvalidInput
from mnemoplan.ingest.restore import restore_records
from mnemoplan.model import Record, check_scope
from mnemoplan.model.scope import RecordFilter
from mnemoplan.service.browse import MemoryBrowser
from mnemoplan.service.service import MemoryService

FORMAT_NAME = "mnemoplan-export"
VERSION = 1
RESTORE_BATCH = 2_000
Advance = Callable[[int, int, int], None]  # (done, total, records in the step)


@dataclass
class Restored:
    """What importing an export did."""

    users: list[str] = field(default_factory=list)
    read: int = 0
    stored: int = 0
    duplicates: int = 0
    sessions: int = 0
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def export_users(service: MemoryService, user_id: str | None) -> list[str]:
    """The users an export holds: one, or (``None``) every user with a record."""
    if user_id is not None:
        return [user_id]
    return MemoryBrowser(service.store).users()


def write_export(service: MemoryService, out: IO[str], users: list[str], advance: Advance | None = None, *,
                 vectors: bool = False) -> int:  # fmt: skip
    """Write the export of ``users`` to ``out`` (with each record's vectors if ``vectors``); returns
    how many records it holds."""
    browser = MemoryBrowser(service.store)
    totals = {u: service.store.log.count(RecordFilter(u)) for u in users}
    header: dict[str, Any] = {"type": FORMAT_NAME, "version": VERSION, "mnemoplan": __version__,
                              "exported_at": datetime.now(UTC).isoformat(), "users": users,
                              "records": sum(totals.values())}  # fmt: skip
    if vectors:
        header["vectors"] = {"model": service.embedder.name, "dim": service.embedder.dim}
    out.write(json.dumps(header, ensure_ascii=False) + "\n")
    written = 0
    for user in users:
        rows = browser.stored(user) if vectors else ((rec, None, None) for rec in browser.records(user))
        for rec, embedding, tokens in rows:
            row = {"type": "record", **rec.model_dump(mode="json")}
            if embedding is not None:
                row["embedding"] = base64.b64encode(np.ascontiguousarray(embedding, "<f4").tobytes()).decode()
                row["tokens"] = base64.b64encode(tokens).decode() if tokens else None
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            written += 1
            if advance and written % 500 == 0:
                advance(written, header["records"], 500)
    if advance:
        advance(written, header["records"], written % 500)
    return written


def restore_export(
    service: MemoryService, path: Path, *, user_id: str | None = None, advance: Advance | None = None
) -> Restored:
    """Store the records of an export that memory lacks (under ``user_id`` if given, else each
    record's own user).

    Raises:
        InvalidInput: the file is not an export of a version this reads.
    """
    service.store.check_writable()
    done = Restored()
    pending: list[Record] = []
    stored_vectors: dict[str, tuple[np.ndarray, bytes | None]] = {}
    sessions: set[tuple[str, str]] = set()

    def flush() -> None:
        if not pending:
            return
        stored, present = restore_records(service.ingestor, pending, stored_vectors)
        stored_vectors.clear()
        done.stored, done.duplicates = done.stored + stored, done.duplicates + present
        if advance:
            advance(done.read, 0, len(pending))
        pending.clear()

    with path.open(encoding="utf-8") as fh:
        first = fh.readline()
        try:
            header = json.loads(first)
        except json.JSONDecodeError:
            header = {}
        if not isinstance(header, dict) or header.get("type") != FORMAT_NAME:
            raise InvalidInput(f"{path} is not a mnemoplan export (its first line says what it is).")
        if header.get("version") != VERSION:
            raise InvalidInput(f"{path} is an export of version {header.get('version')}; this reads version {VERSION}.")
        made = header.get("vectors") or {}
        reuse = made.get("model") == service.embedder.name and made.get("dim") == service.embedder.dim
        if made and not reuse:
            done.notes.append(f"the export's vectors are of {made.get('model')!r}, this store embeds with "
                              f"{service.embedder.name!r}: every record is embedded again")  # fmt: skip
        for n, line in enumerate(fh, 2):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict) or row.pop("type", None) != "record":
                    raise ValueError("not a record line")
                embedding, tokens = row.pop("embedding", None), row.pop("tokens", None)
                rec = Record.model_validate(row)
                vector = np.frombuffer(base64.b64decode(embedding), "<f4") if reuse and embedding else None
                if vector is not None and vector.shape != (service.embedder.dim,):
                    raise ValueError(f"its embedding has {vector.size} numbers, not {service.embedder.dim}")
                check_scope(rec.user_id, what="user_id", required=True)
            except (ValueError, ValidationError, InvalidInput) as exc:
                done.skipped.append(f"line {n}: {str(exc).splitlines()[0]}")
                continue
            if user_id is not None:
                rec = rec.model_copy(update={"user_id": user_id})
            if pending and (pending[0].user_id != rec.user_id or len(pending) >= RESTORE_BATCH):
                flush()
            if rec.user_id not in done.users:
                done.users.append(rec.user_id)
            sessions.add((rec.user_id, rec.session_id))
            pending.append(rec)
            if vector is not None:
                stored_vectors[rec.id] = (vector, base64.b64decode(tokens) if tokens else None)
            done.read += 1
        flush()
    done.sessions = len(sessions)
    return done
