"""``temporal``: records whose time falls in a window (when said, or the event times they mention)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, top_k_param
from mnemoplan.model import IndexDescriptor, ParamSpec
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.table import LanceLog


class TemporalIndex(SearchIndex):
    """Time-window look-up over the log's ``occurred_at`` and resolved event intervals."""

    descriptor = IndexDescriptor(
        name="temporal",
        description="Records by time: when they were said, or the event dates they mention, resolved "
        "('yesterday' said on 8 May 2023 means 7 May 2023).",
        stores="occurred_at of every record, and the resolved [event_start, event_end) of time expressions.",
        best_for=["'what happened in May 2023'", "'before / after X' questions", "'when did ...' questions"],
        query_params=[
            ParamSpec(name="start", type="datetime", description="Window start; default: the query's window."),
            ParamSpec(name="end", type="datetime", description="Window end (exclusive)."),
            ParamSpec(
                name="dated_only", type="boolean", default=False,
                description="Only records that mention an event time; with depends_on, keeps the dated "
                "records among those earlier steps found (good for 'when' questions).",
            ),
            ParamSpec(name="anchor_relation", type="string",
                      description="'before' or 'after': with depends_on, the window ends (starts) at the time of "
                      "the best record the earlier step found (an anchor event such as 'the wedding')."),  # fmt: skip
            top_k_param(200),
        ],
        returns="Records in the window; events inside it score 1.0, records merely said in it 0.6.",
        examples=[{"query": "what did I do last week", "params": {}}],
    )

    def __init__(self, log: LanceLog) -> None:
        self._log = log

    def available(self, user_id: str) -> bool:
        return self._log.count(RecordFilter(user_id)) > 0

    def window(self, req: SearchRequest) -> tuple[datetime | None, datetime | None]:
        """The window a step asks for: explicit, relative to an anchor event, else the analyzer's."""
        start, end = self.param(req, "start"), self.param(req, "end")
        relation = self.param(req, "anchor_relation")
        if relation in ("before", "after") and req.upstream and start is None and end is None:
            best = max(req.upstream, key=lambda h: h.score)
            anchor = self._log.get(req.user_id, [best.id]).get(best.id)
            if anchor is not None:
                when = anchor.event_start or anchor.occurred_at
                return (None, when) if relation == "before" else (anchor.event_end or anchor.occurred_at, None)
        if start is None and end is None and req.analysis and req.analysis.time_window:
            start, end = req.analysis.time_window.start, req.analysis.time_window.end
        return start, end

    def _dated_upstream(self, req: SearchRequest, start: datetime | None, end: datetime | None) -> list[Hit]:
        """The dated records among those earlier steps found."""
        ids = list(dict.fromkeys(h.id for h in req.upstream))
        events = self._log.events(req.user_id, ids)
        hits = []
        for rid in ids:
            if rid not in events:
                continue
            event_start, event_end = events[rid]
            if (start and event_end <= start) or (end and event_start >= end):
                continue
            hits.append(Hit(rid, 1.0, self.name))
        return hits[: int(self.param(req, "top_k"))]

    def search(self, req: SearchRequest) -> list[Hit]:
        start, end = self.window(req)
        dated_only = bool(self.param(req, "dated_only"))
        if dated_only and req.upstream:
            return self._dated_upstream(req, start, end)
        if self.param(req, "anchor_relation"):
            req = replace(req, upstream=[])  # the upstream was the anchor, not a set to narrow
        if start is None and end is None and not (dated_only and req.upstream):
            return []
        where = RecordFilter(
            req.user_id, req.project_id, start, end, time_of="event" if dated_only else "said_or_event",
            # narrow the records earlier steps found
            ids=tuple(dict.fromkeys(h.id for h in req.upstream)) if req.upstream else None,
        )
        rows = self._log.first(where, int(self.param(req, "top_k")) * 4)
        hits = [Hit(rid, 1.0 if dated else 0.6, self.name) for rid, dated, _ in rows]
        order = {rid: seq for rid, _, seq in rows}
        hits.sort(key=lambda h: (-h.score, -order[h.id]))
        return hits[: int(self.param(req, "top_k"))]
