"""A question about one of the asker's attributes ("Where do I work?", "Where did I live
before?"): its answer first, and what the answer holds against it marked as possibly changed.

The attribute facts are read by ``extract.attributes`` and decided by ``ingest.attributes``;
here recall puts the asked attribute's current fact (or, asked about the past, its superseded
ones) before what the search ranked, and reads the answer's own messages for a value the
rules did not read (``HeldValue``). The records come from recall's ``RecordSource``, with its
``select`` when it has one (the log).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from mnemoplan.extract.attribute_doubts import names_another_value
from mnemoplan.extract.attributes import asked_attribute, mentions
from mnemoplan.model import MemoryItem, Record
from mnemoplan.model.records import REQUESTING_ROLES, requests
from mnemoplan.model.scope import RecordFilter
from mnemoplan.planner.fusion import Candidate

__all__ = ["BROADER", "SLOT_MOST", "HeldValue", "slot_first"]


class Reads(Protocol):
    """Records of one user by id (recall's ``RecordSource``; a ``select`` is used when it has one)."""

    def get(self, user_id: str, ids: list[str]) -> dict[str, Record]:
        """Records of one user by id."""
        ...


@dataclass
class HeldValue:
    """For one answer to a question about the asker's now: the value the attribute's newest fact
    holds, and which of the returned items it may no longer hold for (``mark``: they stay current,
    with ``metadata.possibly_changed``). Nothing stored changes: the store closes a value only on a
    statement it reads as a change.

    - ``newer``, a message of the asker's newer than the fact that names another value
      (``_said_since``): what names the held value and is older than it may have changed;
    - otherwise an older message of the asker's naming another value of the attribute
      (``names_another_value``: "the tram was packed again" before the fact "commute: cycle",
      whose old value was said where no rule read it) may have changed, by the fact.
    """

    attribute: str
    held: str
    fact_id: str
    fact_at: datetime
    alone: bool = True  # the one current value (a second car said to add: another name may be it)
    newer: tuple[Candidate, datetime] | None = None  # the newer message, and when it was said

    def mark(self, items: list[MemoryItem]) -> list[MemoryItem]:
        for item in items:
            if not item.current:
                continue
            if self.newer is not None:
                newer, at = self.newer
                if item.id != newer.id and item.occurred_at < at and mentions(item.text, self.held):
                    _possibly_changed(item, newer.id, at)
            elif (self.alone and requests(item.kind, item.speaker)
                  and item.occurred_at < self.fact_at and names_another_value(item.text, self.attribute, self.held)):
                _possibly_changed(item, self.fact_id, self.fact_at)
        return items


def _possibly_changed(item: MemoryItem, by: str, at: datetime) -> None:
    """Precision first: what only this answer reads against a value stays current, and says it may
    have changed (by which record, said when), so that the agent can ask; only a statement the store
    reads as a change closes a value (``ingest.attributes``)."""
    item.metadata["possibly_changed"] = {"by": by, "at": at.isoformat()}


SLOT_MOST = 3  # facts put first for a question about an attribute (a multi-valued one has several)
NEWER_LOOK = 5  # how many of the best candidates may hold a newer statement of the asked attribute
BROADER = {"neighbourhood": "home_city"}  # an attribute whose value answers a question about another


def slot_first(
    records: Reads, query: str, order: list[Candidate], user_id: str
) -> tuple[list[Candidate], HeldValue | None]:
    """A question about one of the asker's attributes ("Where do I work?") gets its answer
    first: the current value's fact (the newest first; an ending when the value ended), or
    for a question about the past ("Where did I live before?") the superseded values, newest
    first. Facts about a requesting speaker (a user, who asks) only. A newer message of the
    asker's that names another value goes before the fact; what the answer holds against the
    fact's value is returned as possibly changed (``HeldValue``)."""
    attribute, past = asked_attribute(query)
    select = getattr(records, "select", None)
    if not attribute or not order or select is None:
        return order, None
    rows = select(RecordFilter(user_id, kinds=("fact",), current=None if past else True),
                  ["id", "metadata", "occurred_at", "seq", "superseded_by"])
    slots: dict[str, list[tuple[Any, int, str]]] = {}  # (said at, written, id): the newest first
    values: dict[str, str] = {}
    metas: dict[str, dict[str, Any]] = {}
    for row in rows:
        meta = json.loads(row["metadata"] or "{}") if isinstance(row["metadata"], str) else (row["metadata"] or {})
        if str(meta.get("subject", "")).lower() not in REQUESTING_ROLES:
            continue
        if past and not (row["superseded_by"] and meta.get("value")):
            continue
        slots.setdefault(str(meta.get("attribute")), []).append((row["occurred_at"], row["seq"], row["id"]))
        values[row["id"]] = str(meta.get("value") or "")
        metas[row["id"]] = meta
    # "Which neighbourhood do I live in?" when only the place one lives in was said
    slot = slots.get(attribute) or slots.get(BROADER.get(attribute, ""), [])
    if not slot:
        return order, None
    slot.sort(reverse=True)
    by_id = {c.id: c for c in order}
    lead = order[0].score
    first = []
    for i, (_, _, rid) in enumerate(slot[:SLOT_MOST]):
        cand = by_id.get(rid) or Candidate(rid, 0.0, provenance=["attribute"])
        raised = lead + 1e-3 * (len(slot) - i)
        cand.scores["slot"] = round(raised - cand.score, 4)
        cand.score = raised
        first.append(cand)
    held = None
    doubted = [str(v) for v in metas.get(slot[0][2], {}).get("possibly_changes", [])] if not past else []
    if doubted:  # the newest value was said beside the held ones, not as a change of them: both stay
        return first + [c for c in order if c.id not in {f.id for f in first}], HeldValue(
            attribute, doubted[0], "", slot[0][0], alone=False, newer=(first[0], slot[0][0]))
    if not past and attribute in slots and values[slot[0][2]]:
        held = HeldValue(attribute, values[slot[0][2]], slot[0][2], slot[0][0], alone=len(slot) == 1)
        newer = _said_since(records, order[:NEWER_LOOK], user_id, attribute, held.fact_at, held.held)
        if newer is not None:  # a newer message of the asker's may name the value now: it leads
            held.newer = newer
            newer[0].score = lead + 1e-3 * (len(slot) + 1)
            newer[0].scores["slot"] = 0.0
            first.insert(0, newer[0])
    chosen = {c.id for c in first}
    return first + [c for c in order if c.id not in chosen], held


def _said_since(
    records: Reads, top: list[Candidate], user_id: str, attribute: str, since: Any, held: str
) -> tuple[Candidate, datetime] | None:
    """The best of ``top`` that is the asker's own message, newer than the held value's fact
    and naming another value it could have (``names_another_value``), if any: the search
    found it for the question, so it is about the attribute, and the rules that read values
    may not know its phrasing ("the Kia EV6 charges in 20 minutes" after "I drive a Civic")."""
    if not held:
        return None
    found = records.get(user_id, [c.id for c in top])
    for cand in top:
        rec = found.get(cand.id)
        if (rec is not None and rec.requests and not rec.superseded_by and rec.occurred_at > since
                and names_another_value(rec.text, attribute, held)):
            return cand, rec.occurred_at
    return None
