"""Per-user bookkeeping the write path needs without querying the log each time.

Identities (content hashes, source ids), the last message of each session, the current
facts by subject (for near-duplicate and contradiction checks) and each session's
episode. Loaded from the log on a user's first write, kept current by writes, dropped
by deletes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from mnemoplan.extract.names import entity_key
from mnemoplan.indexes.derive import KnownFact, is_hedged
from mnemoplan.indexes.lance_log import LanceLog, sql_str
from mnemoplan.model import Record

_COLUMNS = ["id", "content_hash", "source_id", "session_id", "seq", "kind", "metadata", "superseded_by", "mention_count"]


@dataclass
class UserLedger:
    """One user's identities, session tails, current facts and episodes."""

    by_hash: dict[str, str] = field(default_factory=dict)
    by_source: dict[tuple[str, str], str] = field(default_factory=dict)
    session_tail: dict[str, tuple[int, str]] = field(default_factory=dict)
    session_messages: dict[str, int] = field(default_factory=dict)
    episodes: dict[str, tuple[str, int]] = field(default_factory=dict)
    facts: dict[str, list[KnownFact]] = field(default_factory=dict)

    @classmethod
    def load(cls, log: LanceLog, user_id: str) -> UserLedger:
        """Read a user's ledger from the log (one scan, plus the vectors of current facts)."""
        ledger = cls()
        pending: list[dict] = []
        for rows in log.scan(f"user_id = {sql_str(user_id)}", _COLUMNS):
            for row in rows:
                ledger._note_row(row)
                if row["kind"] == "fact" and not row["superseded_by"]:
                    pending.append(row)
        vectors = log.vectors(user_id, [r["id"] for r in pending]) if pending else {}
        for row in pending:
            if row["id"] in vectors:
                ledger.add_fact(row["id"], json.loads(row["metadata"] or "{}"), vectors[row["id"]],
                                int(row["mention_count"] or 1))  # fmt: skip
        return ledger

    def _note_row(self, row: dict) -> None:
        self.by_hash[row["content_hash"]] = row["id"]
        if row["source_id"]:
            self.by_source[(row["session_id"], row["source_id"])] = row["id"]
        if row["kind"] == "message":
            self.session_messages[row["session_id"]] = self.session_messages.get(row["session_id"], 0) + 1
            tail = self.session_tail.get(row["session_id"])
            if tail is None or row["seq"] > tail[0]:
                self.session_tail[row["session_id"]] = (row["seq"], row["id"])
        elif row["kind"] == "episode":
            meta = json.loads(row["metadata"] or "{}") if isinstance(row["metadata"], str) else row["metadata"]
            self.episodes[row["session_id"]] = (row["id"], int(meta.get("message_count", 0)))

    def note(self, rec: Record, vector: np.ndarray | None = None) -> None:
        """Account for a stored record."""
        self._note_row({**rec.model_dump(include={"id", "content_hash", "source_id", "session_id", "seq", "kind"}),
                        "metadata": rec.metadata})  # fmt: skip
        if rec.kind == "fact" and vector is not None:
            self.add_fact(rec.id, rec.metadata, vector, rec.mention_count, rec)

    def add_fact(self, rid: str, meta: dict, vector: np.ndarray, mentions: int = 1, rec: Record | None = None) -> None:
        """Remember a current fact under its subject (once)."""
        if any(f.id == rid for facts in self.facts.values() for f in facts):
            return
        subject = entity_key(str(meta.get("subject", "")))
        if not subject and rec is not None:
            subject = next((m.key for m in rec.entities if m.role == "subject"), "")
        known = KnownFact(rid, subject, str(meta.get("predicate", "")), str(meta.get("object", "")),
                          bool(meta.get("negated", False)), np.asarray(vector, dtype=np.float32), mentions,
                          is_hedged(meta))  # fmt: skip
        self.facts.setdefault(subject, []).append(known)

    def current_facts(self, subject: str) -> list[KnownFact]:
        """Current facts about a subject (every current fact when the subject is unknown)."""
        if subject:
            return self.facts.get(subject, [])
        return [f for facts in self.facts.values() for f in facts]

    def retire_fact(self, rid: str) -> None:
        """A fact was superseded: it no longer counts as current."""
        for subject, facts in self.facts.items():
            self.facts[subject] = [f for f in facts if f.id != rid]

    def reinforce(self, rid: str) -> int:
        """Count one more mention of a fact; returns the new count (0 for a fact not current)."""
        return self._recount(rid, lambda n: n + 1)

    def raise_mentions(self, rid: str, count: int) -> int:
        """Raise a fact's count to at least ``count`` (a count not yet in the log)."""
        return self._recount(rid, lambda n: max(n, count))

    def _recount(self, rid: str, new: Callable[[int], int]) -> int:
        for facts in self.facts.values():
            for i, f in enumerate(facts):
                if f.id == rid:
                    facts[i] = replace(f, mentions=new(f.mentions))
                    return facts[i].mentions
        return 0
