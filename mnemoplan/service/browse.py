"""Read-only views of one user's memory: sessions, a session's messages, facts with their history,
and the entity graph. Built once, read by the MCP resources, the web view and the export.

Every read is confined to one user (a ``RecordFilter``) and paged by offset: a page holds at most
``limit`` rows and says where the next one starts (None at the end).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from mnemoplan.errors import InvalidInput, NotFound
from mnemoplan.model import Record, check_scope
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.store import MemoryStore

MAX_PAGE = 500


@dataclass
class Page:
    """One page of rows, with the offset of the next page (None when there is none)."""

    items: list[dict[str, Any]]
    offset: int
    total: int
    next_offset: int | None

    def as_dict(self) -> dict[str, Any]:
        """The page as JSON-ready data."""
        return {"items": self.items, "offset": self.offset, "total": self.total, "next_offset": self.next_offset}


@dataclass
class Graph:
    """Entities (nodes) and how often two are mentioned together (edges)."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    edges: list[dict[str, Any]] = field(default_factory=list)


def _page(rows: list[dict[str, Any]], offset: int, limit: int) -> Page:
    if offset < 0 or not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"offset must be >= 0 and limit between 1 and {MAX_PAGE}.")
    part = rows[offset : offset + limit]
    nxt = offset + limit if offset + limit < len(rows) else None
    return Page(part, offset, len(rows), nxt)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def message_view(rec: Record) -> dict[str, Any]:
    """What a page shows of a message (or any record)."""
    return {
        "id": rec.id, "kind": rec.kind, "speaker": rec.speaker, "text": rec.text,
        "occurred_at": _iso(rec.occurred_at), "session_id": rec.session_id, "project_id": rec.project_id,
        "source_id": rec.source_id, "metadata": rec.metadata,
    }  # fmt: skip


def fact_view(rec: Record) -> dict[str, Any]:
    """What a page shows of a fact: its text, validity and where it came from."""
    return {
        "id": rec.id, "text": rec.text, "occurred_at": _iso(rec.occurred_at),
        "valid_from": _iso(rec.valid_from), "valid_to": _iso(rec.valid_to),
        "superseded_by": rec.superseded_by, "current": not rec.superseded_by, "derived_from": rec.derived_from,
        "mention_count": rec.mention_count, "session_id": rec.session_id,
        "subject": rec.metadata.get("subject", ""), "predicate": rec.metadata.get("predicate", ""),
        "object": rec.metadata.get("object", ""),
    }  # fmt: skip


class MemoryBrowser:
    """Read-only browsing of the memory in ``store``."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def _user(self, user_id: str) -> str:
        user = check_scope(user_id, what="user_id", required=True)
        self.store.wait_for_writes(user)
        return user

    def users(self) -> list[str]:
        """Every user with at least one record, sorted."""
        return sorted(self.store.log.user_ids())

    def sessions(self, user_id: str, *, offset: int = 0, limit: int = 50) -> Page:
        """A user's sessions, most recent first: id, first and last time, messages (what was stored,
        not what was derived from it), first words."""
        user = self._user(user_id)
        cols = self.store.log.columns(RecordFilter(user),
                                      ["session_id", "occurred_at", "seq", "text", "speaker", "derived_from"])  # fmt: skip
        found: dict[str, dict[str, Any]] = {}
        for sid, when, seq, text, speaker, sources in zip(cols["session_id"], cols["occurred_at"], cols["seq"],
                                                          cols["text"], cols["speaker"], cols["derived_from"],
                                                          strict=True):  # fmt: skip
            if sources:
                continue
            s = found.setdefault(sid or "", {"session_id": sid or "", "messages": 0, "first": when, "last": when,
                                             "first_seq": seq, "title": ""})  # fmt: skip
            s["messages"] += 1
            s["first"], s["last"] = min(s["first"], when), max(s["last"], when)
            if seq <= s["first_seq"]:
                s["first_seq"], s["title"] = seq, f"{speaker}: {text}" if speaker else text
        rows = sorted(found.values(), key=lambda s: (s["last"], s["session_id"]), reverse=True)
        for s in rows:
            s["title"] = s["title"][:120]
            s["first"], s["last"] = _iso(s["first"]), _iso(s["last"])
            del s["first_seq"]
        return _page(rows, offset, limit)

    def messages(self, user_id: str, session_id: str, *, offset: int = 0, limit: int = 100) -> Page:
        """A session's messages (and memories stored in it, not those derived) in the order they
        were stored.

        Raises:
            NotFound: no such session.
        """
        user = self._user(user_id)
        records = [r for r in self.store.log.records(RecordFilter(user, session_id=session_id)) if not r.derived_from]
        if not records:
            raise NotFound(f"User {user!r} has no session {session_id!r}.", hint="List the sessions first.")
        records.sort(key=lambda r: r.seq)
        return _page([message_view(r) for r in records], offset, limit)

    def facts(self, user_id: str, *, offset: int = 0, limit: int = 100) -> Page:
        """Current facts, newest first, each with the facts it replaced (``history``, newest first)."""
        user = self._user(user_id)
        facts = self.store.log.records(RecordFilter(user, kinds=("fact",)))
        replaced: dict[str, list[Record]] = {}
        for f in facts:
            if f.superseded_by:
                replaced.setdefault(f.superseded_by, []).append(f)
        rows = []
        for f in sorted((f for f in facts if not f.superseded_by), key=lambda r: (r.occurred_at, r.seq), reverse=True):
            history, todo, seen = [], list(replaced.get(f.id, [])), {f.id}
            while todo:  # the chain of what this fact replaced, and what those replaced
                old = todo.pop()
                if old.id in seen:
                    continue
                seen.add(old.id)
                history.append(old)
                todo.extend(replaced.get(old.id, []))
            history.sort(key=lambda r: (r.occurred_at, r.seq), reverse=True)
            rows.append({**fact_view(f), "history": [fact_view(h) for h in history]})
        return _page(rows, offset, limit)

    def graph(self, user_id: str, *, max_nodes: int = 80) -> Graph:
        """The entities most mentioned and the pairs mentioned in the same record."""
        user = self._user(user_id)
        cols = self.store.log.columns(RecordFilter(user), ["entities"])
        counts: Counter[str] = Counter()
        names: dict[str, tuple[str, str]] = {}
        pairs: Counter[tuple[str, str]] = Counter()
        for mentions in cols["entities"]:
            keys = sorted({m["key"] for m in mentions or [] if m.get("key")})
            for m in mentions or []:
                if m.get("key"):
                    names.setdefault(m["key"], (m.get("name") or m["key"], m.get("type") or ""))
            counts.update(keys)
            pairs.update((a, b) for i, a in enumerate(keys) for b in keys[i + 1 :])
        top = {k for k, _ in counts.most_common(max_nodes)}
        nodes = [{"id": k, "label": names[k][0], "type": names[k][1], "count": counts[k]} for k in sorted(top)]
        edges = [{"source": a, "target": b, "weight": n} for (a, b), n in pairs.most_common() if a in top and b in top]
        return Graph(nodes, edges[: max_nodes * 3])

    def records(self, user_id: str) -> Iterator[Record]:
        """Every record of a user, in the order it was stored (what an export holds)."""
        user = self._user(user_id)
        yield from sorted(self.store.log.iter_records(RecordFilter(user)), key=lambda r: r.seq)

    def stored(self, user_id: str) -> Iterator[tuple[Record, np.ndarray, bytes | None]]:
        """Every record of a user in the order it was stored, with its embedding and packed token
        vectors (what an export with vectors holds)."""
        user = self._user(user_id)
        yield from sorted(self.store.log.iter_stored(RecordFilter(user)), key=lambda row: row[0].seq)
