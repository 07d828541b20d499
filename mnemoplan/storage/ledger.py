"""Per-user bookkeeping the write path needs without querying the log each time.

Identities (content hashes, source ids), the messages of each session in order, the
current facts by subject (for near-duplicate and contradiction checks) and the summaries
of each session, with the stretch of messages each covers. Loaded from the log on a
user's first write, kept current by writes and deletes (dropped by a delete that makes
facts current again: read again at the next write).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

from mnemoplan.extract.facts import HEDGED_CONFIDENCE
from mnemoplan.extract.names import entity_key
from mnemoplan.model import Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.table import LanceLog

SUMMARIZER = "extractive"  # the metadata that marks a session summary the write path made
_COLUMNS = ["id", "content_hash", "source_id", "session_id", "seq", "kind", "metadata", "superseded_by", "mention_count",
            "occurred_at"]


@dataclass(frozen=True)
class KnownFact:
    """What fact updates need to know of a stored fact."""

    id: str
    subject_key: str
    predicate: str
    object: str
    negated: bool
    vector: np.ndarray
    mentions: int = 1
    hedged: bool = False
    said_at: datetime | None = None  # when what it says was said (a late reading of an older message is history)


def is_hedged(meta: dict) -> bool:
    """Whether a fact was said unsure. Facts stored before they said so, and an LLM's, which
    never say: as unsure as a hedge counts as one."""
    confidence = meta.get("confidence", 1.0)
    return bool(meta.get("hedged", isinstance(confidence, int | float) and confidence <= HEDGED_CONFIDENCE))


@dataclass(frozen=True)
class Summary:
    """A session summary the write path made, and the stretch of the session it covers: from
    message ``first`` to message ``last`` (ids). One made before stretches names neither and
    covers the session's first ``count`` messages."""

    id: str
    first: str
    last: str
    count: int


@dataclass
class UserLedger:
    """One user's identities, session messages, current facts and session summaries."""

    by_hash: dict[str, str] = field(default_factory=dict)
    by_source: dict[tuple[str, str], str] = field(default_factory=dict)
    # (seq, id) of each session's messages, in order (sorted once after a load; appends come in order)
    session_messages: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    summaries: dict[str, dict[str, Summary]] = field(default_factory=dict)  # session -> id -> summary
    facts: dict[str, list[KnownFact]] = field(default_factory=dict)
    # fact id -> its subject in ``facts``: finding a fact by id scanned every fact, so loading a
    # user's facts was quadratic
    _subject_of: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, log: LanceLog, user_id: str) -> UserLedger:
        """Read a user's ledger from the log (one read, plus the vectors of current facts).

        Column by column: a dict per row was slow for a large user, and this load comes on a
        user's first write and the first after each forget."""
        ledger = cls()
        cols = log.columns(RecordFilter(user_id), _COLUMNS)
        ids, kinds, sessions = cols["id"], cols["kind"], cols["session_id"]
        ledger.by_hash = dict(zip(cols["content_hash"], ids, strict=True))
        ledger.by_source = {(session, source): rid for rid, session, source
                            in zip(ids, sessions, cols["source_id"], strict=True) if source}  # fmt: skip
        pending: list[int] = []
        for i, kind in enumerate(kinds):
            if kind == "message":
                ledger.session_messages.setdefault(sessions[i], []).append((cols["seq"][i], ids[i]))
            elif kind == "episode":
                ledger._note_summary(ids[i], sessions[i], json.loads(cols["metadata"][i] or "{}"))
            elif kind == "fact" and not cols["superseded_by"][i]:
                pending.append(i)
        for messages in ledger.session_messages.values():
            messages.sort()
        vectors = log.vectors(user_id, [ids[i] for i in pending]) if pending else {}
        for i in pending:
            if ids[i] in vectors:
                ledger.add_fact(ids[i], json.loads(cols["metadata"][i] or "{}"), vectors[ids[i]],
                                int(cols["mention_count"][i] or 1), said_at=cols["occurred_at"][i])  # fmt: skip
        return ledger

    def _note_summary(self, rid: str, session_id: str, meta: dict) -> None:
        if meta.get("summarizer") == SUMMARIZER:  # made here (a user's own episode is theirs to keep)
            self.summaries.setdefault(session_id, {})[rid] = Summary(
                rid, str(meta.get("first_message", "")), str(meta.get("last_message", "")),
                int(meta.get("message_count", 0)),
            )  # fmt: skip

    def drop(self, records: Sequence[Record]) -> None:
        """Take deleted records out: their hashes, sources, places in their sessions, summaries
        and facts. What they had replaced is not made current here: a delete that reopens
        facts drops the whole ledger instead (``WriteBookkeeping.forget_records``)."""
        gone = {rec.id for rec in records}
        for rec in records:
            if self.by_hash.get(rec.content_hash) == rec.id:
                del self.by_hash[rec.content_hash]
            if rec.source_id and self.by_source.get((rec.session_id, rec.source_id)) == rec.id:
                del self.by_source[(rec.session_id, rec.source_id)]
            summaries = self.summaries.get(rec.session_id)
            if summaries is not None and summaries.pop(rec.id, None) and not summaries:
                del self.summaries[rec.session_id]
            self.retire_fact(rec.id)
        for session in {rec.session_id for rec in records if rec.kind == "message"}:
            left = [m for m in self.session_messages.get(session, []) if m[1] not in gone]
            if left:
                self.session_messages[session] = left
            else:
                self.session_messages.pop(session, None)

    def last_message(self, session_id: str) -> str | None:
        """The id of the session's last message, if it has one."""
        messages = self.session_messages.get(session_id)
        return messages[-1][1] if messages else None

    def drop_summaries(self, session_id: str, ids: list[str]) -> None:
        """Summaries replaced by fresh ones no longer count."""
        held = self.summaries.get(session_id, {})
        for rid in ids:
            held.pop(rid, None)

    def to_summarise(
        self, session_id: str, new: list[str], every: int, span: int
    ) -> tuple[list[tuple[int, list[str]]], list[str]]:
        """The stretches of a session to summarise once ``new`` messages (ids) join it, and the
        summaries they replace.

        A summary covers at most ``span`` consecutive messages, so a long session is summarised
        stretch by stretch, and a summary costs as much at a session's 10,000th message as at
        its 100th (reading and scoring the whole session grew with it). The newest
        stretch is summarised again once ``every`` messages joined the session since its
        summary, or a new stretch begins when it is full. Stretches left without a summary (a
        forget deletes the summary of the stretch it touches) are summarised again with it.

        Returns:
            Each stretch as its place in the session (its first message's) and its message ids
            in order; and the ids of the summaries replaced.
        """
        every = max(every, 1)
        held_summaries = list(self.summaries.get(session_id, {}).values())
        if self._summarised_lately(session_id, new, held_summaries, every):
            return [], []
        ids = [rid for _, rid in self.session_messages.get(session_id, [])] + new
        where = {rid: i for i, rid in enumerate(ids)}
        covered: list[tuple[int, int, str]] = []  # [start, end) and the summary's id
        for summary in held_summaries:
            if not summary.first:  # from before stretches: the session's first ``count`` messages
                covered.append((0, min(summary.count, len(ids)), summary.id))
            elif summary.first in where and summary.last in where:
                covered.append((where[summary.first], where[summary.last] + 1, summary.id))
        newest = max(covered, key=lambda c: (c[1], c[0]), default=(0, 0, ""))
        if len(ids) - newest[1] < every:
            return [], []
        start, replaced = newest[1], []
        if newest[2] and newest[1] - newest[0] < span:  # not full: summarised again, with what follows
            start, replaced = newest[0], [newest[2]]
        held = [False] * start
        for a, b, _ in covered:
            held[a : min(b, start)] = [True] * max(0, min(b, start) - a)
        stretches: list[tuple[int, list[str]]] = []
        gap = 0
        while gap < start:  # each run of messages before ``start`` that no summary covers
            if held[gap]:
                gap += 1
                continue
            end = gap
            while end < start and not held[end]:
                end += 1
            stretches.extend((a, ids[a : min(a + span, end)]) for a in range(gap, end, span))
            gap = end
        stretches.extend((a, ids[a : a + span]) for a in range(start, len(ids), span))
        return stretches, replaced

    def _summarised_lately(self, session_id: str, new: list[str], held: list[Summary], every: int) -> bool:
        """Whether a summary ends fewer than ``every`` messages before the session's end (with
        ``new``): no new one is due. Looks at those last messages only, not the whole session."""
        messages = self.session_messages.get(session_id, [])
        total = len(messages) + len(new)
        if any(not s.first and total - s.count < every for s in held):  # from before stretches
            return True
        lasts = {s.last for s in held if s.first}
        before = max(0, every - len(new))
        recent = [*new[-every:], *(rid for _, rid in messages[max(0, len(messages) - before) :])]
        return any(rid in lasts for rid in recent)

    def note(self, rec: Record, vector: np.ndarray | None = None) -> None:
        """Account for a stored record."""
        self.by_hash[rec.content_hash] = rec.id
        if rec.source_id:
            self.by_source[(rec.session_id, rec.source_id)] = rec.id
        if rec.kind == "message":
            self.session_messages.setdefault(rec.session_id, []).append((rec.seq, rec.id))
        elif rec.kind == "episode":
            self._note_summary(rec.id, rec.session_id, rec.metadata)
        elif rec.kind == "fact" and vector is not None:
            self.add_fact(rec.id, rec.metadata, vector, rec.mention_count, rec)

    def add_fact(
        self, rid: str, meta: dict, vector: np.ndarray, mentions: int = 1, rec: Record | None = None,
        said_at: datetime | None = None,
    ) -> None:
        """Remember a current fact under its subject (once)."""
        if rid in self._subject_of:
            return
        subject = entity_key(str(meta.get("subject", "")))
        if not subject and rec is not None:
            subject = next((m.key for m in rec.entities if m.role == "subject"), "")
        known = KnownFact(rid, subject, str(meta.get("predicate", "")), str(meta.get("object", "")),
                          bool(meta.get("negated", False)), np.asarray(vector, dtype=np.float32), mentions,
                          is_hedged(meta), said_at or (rec.occurred_at if rec is not None else None))  # fmt: skip
        self.facts.setdefault(subject, []).append(known)
        self._subject_of[rid] = subject

    def current_facts(self, subject: str) -> list[KnownFact]:
        """Current facts about a subject (every current fact when the subject is unknown)."""
        if subject:
            return self.facts.get(subject, [])
        return [f for facts in self.facts.values() for f in facts]

    def retire_fact(self, rid: str) -> None:
        """A fact was superseded: it no longer counts as current."""
        subject = self._subject_of.pop(rid, None)
        if subject is not None:
            self.facts[subject] = [f for f in self.facts[subject] if f.id != rid]

    def reinforce(self, rid: str) -> int:
        """Count one more mention of a fact; returns the new count (0 for a fact not current)."""
        return self._recount(rid, lambda n: n + 1)

    def raise_mentions(self, rid: str, count: int) -> int:
        """Raise a fact's count to at least ``count`` (a count not yet in the log)."""
        return self._recount(rid, lambda n: max(n, count))

    def _recount(self, rid: str, new: Callable[[int], int]) -> int:
        subject = self._subject_of.get(rid)
        facts = self.facts.get(subject, []) if subject is not None else []
        for i, f in enumerate(facts):
            if f.id == rid:
                facts[i] = replace(f, mentions=new(f.mentions))
                return facts[i].mentions
        return 0
