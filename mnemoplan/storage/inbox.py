"""Messages accepted by ``remember`` and not yet in the log: durable before the caller hears back.

Each accepted call is one file holding its records (with their ids, text and times), written
and synced before ``remember`` returns; it is removed once the log and the overlays' journal
intent hold the records. Files still here at start-up are stored then: a crash loses nothing
that was acknowledged. Unlike the journal's intents this holds content, so a forget of the
user removes the user's files (``drop``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mnemoplan.model import Record

log = logging.getLogger(__name__)


@dataclass
class Accepted:
    """One accepted call: its records, in order, and where they wait."""

    user_id: str
    session_id: str
    records: list[Record]
    token: str


class Inbox:
    """A directory of accepted calls, one synced file each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._seq = 0
        self._seq_lock = threading.Lock()  # calls of different users are accepted at once

    def put(self, user_id: str, session_id: str, records: list[Record]) -> Accepted:
        """Write one call's records durably (file synced, then renamed into place).

        Raises:
            OSError: The disk could not take it (nothing was accepted).
        """
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        # Names sort in acceptance order within a run, and runs apart by their start.
        token = f"{seq:012d}-{uuid.uuid4().hex}"
        data = {"user_id": user_id, "session_id": session_id,
                "records": [r.model_dump(mode="json") for r in records]}  # fmt: skip
        tmp = self.path / f"{token}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(data, fh, ensure_ascii=False)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path / f"{token}.json")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return Accepted(user_id, session_id, records, token)

    def done(self, accepted: Accepted) -> None:
        """The call's records are stored: drop its file."""
        (self.path / f"{accepted.token}.json").unlink(missing_ok=True)

    def left_over(self) -> list[Accepted]:
        """Calls accepted by an earlier run and never stored, oldest first (at start-up: a file
        still being written is one the caller never heard was accepted, and goes)."""
        for tmp in self.path.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        return self._files()

    def _files(self) -> list[Accepted]:
        out: list[Accepted] = []
        for path in _stamped(self.path.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                records = [Record.model_validate(r) for r in data["records"]]
            except FileNotFoundError:  # stored meanwhile
                continue
            except (OSError, ValueError, KeyError):
                log.warning("an unreadable accepted-message file was skipped: %s", path.name)
                continue
            out.append(Accepted(data["user_id"], data.get("session_id", ""), records, path.stem))
        with self._seq_lock:
            self._seq = max(self._seq, len(out))
        return out

    def drop(self, user_id: str) -> None:
        """Remove every file of one user (their memory is forgotten)."""
        for accepted in self._files():
            if accepted.user_id == user_id:
                self.done(accepted)


def _stamped(paths: Iterable[Path]) -> Iterator[Path]:
    """Paths in the order they were written (modification time, then name), those still there."""
    stamped = []
    for path in paths:
        try:
            stamped.append((path.stat().st_mtime, path.name, path))
        except FileNotFoundError:
            continue
    return iter(p for _, _, p in sorted(stamped))
