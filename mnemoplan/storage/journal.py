"""Write intents, so a crash between the log and an overlay is repaired on start-up.

Before a write touches any store, an intent naming its records (ids only, never
content) is written and synced; once every store has the change, the intent is
removed. Intents still present at start-up are replayed: an add makes every overlay
agree with the log for those ids, a delete is run again. Both are idempotent. A delete
done in every store leaves a purge intent until its bytes have left the disk.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal


@dataclass
class Intent:
    """One pending write."""

    op: Literal["add", "delete", "drop_user", "purge", "rebuild_graph", "rebuild_user"]
    user_id: str
    ids: list[str] = field(default_factory=list)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    # What the write needs once its rows are gone: a delete's links ({"prev": {id: id}, ...}).
    extra: dict[str, dict[str, str]] = field(default_factory=dict)


class WriteJournal:
    """A directory of intent files, one per write in flight."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def begin(self, intent: Intent) -> Intent:
        """Durably record an intent before the write starts."""
        tmp = self.path / f"{intent.token}.tmp"
        data = {"op": intent.op, "user_id": intent.user_id, "ids": intent.ids, "extra": intent.extra}
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path / f"{intent.token}.json")
        return intent

    def done(self, intent: Intent) -> None:
        """Forget an intent whose write reached every store."""
        (self.path / f"{intent.token}.json").unlink(missing_ok=True)

    def pending(self) -> list[Intent]:
        """Intents left by writes that did not finish, oldest first."""
        for tmp in self.path.glob("*.tmp"):  # never began: nothing was written
            tmp.unlink(missing_ok=True)
        intents = []
        for _, path in sorted(_stamped(self.path.glob("*.json"))):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:  # done meanwhile
                continue
            except (OSError, ValueError):
                path.unlink(missing_ok=True)
                continue
            intents.append(Intent(data["op"], data["user_id"], data.get("ids", []), path.stem, data.get("extra", {})))
        return intents


def _stamped(paths: Iterable[Path]) -> Iterator[tuple[float, Path]]:
    """(modification time, path) of the files still there."""
    for path in paths:
        try:
            yield path.stat().st_mtime, path
        except FileNotFoundError:
            continue
