"""``working_memory``: what was said last, fading with distance from the latest turn."""

from __future__ import annotations

import math

import numpy as np

from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, top_k_param
from mnemoplan.model import IndexDescriptor, ParamSpec
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.table import LanceLog


class WorkingMemoryIndex(SearchIndex):
    """The user's most recent records, with attention decaying turn by turn."""

    descriptor = IndexDescriptor(
        name="working_memory",
        description="The most recent records of the user (or of one session), newest first; attention halves every "
        "`half_life` records back, and records that resemble the query keep more of it.",
        stores="Nothing of its own: the write order of the log.",
        best_for=["follow-ups ('and how much was it?')", "what we were just talking about", "recent context"],
        query_params=[
            top_k_param(20, "How many recent records."),
            ParamSpec(name="half_life", type="integer", default=10, minimum=1, maximum=100_000, description="Records back at which attention halves."),
            ParamSpec(name="session_id", type="string", description="Only this session."),
            ParamSpec(name="query_weight", type="number", default=0.5, minimum=0, maximum=1,
                      description="How much similarity to the query counts next to recency (0: pure recency)."),  # fmt: skip
        ],
        returns="Recent records scored by attention (1.0 for the latest).",
        examples=[{"query": "how much did it cost?", "params": {"top_k": 10}}],
    )

    def __init__(self, log: LanceLog) -> None:
        self._log = log

    def available(self, user_id: str) -> bool:
        return self._log.count(RecordFilter(user_id)) > 0

    def search(self, req: SearchRequest) -> list[Hit]:
        top_k = int(self.param(req, "top_k"))
        session = self.param(req, "session_id")
        view = self._log.user_view(req.user_id)
        if view is not None:
            mask = np.ones(len(view), dtype=bool) if not session else view.sessions == session
            rows = np.flatnonzero(mask)
            order = rows[np.argsort(-view.seqs[rows], kind="stable")][:top_k]
            ids = [view.ids[i] for i in order]
            sims = view.matrix[order] @ req.vector(req.query) if float(self.param(req, "query_weight")) > 0 else None
        else:
            where = RecordFilter(req.user_id, session_id=session or None)
            rows_ = sorted(self._log.select(where, ["id", "seq"]), key=lambda r: -r["seq"])[:top_k]
            ids = [r["id"] for r in rows_]
            sims = None
        half = max(1, int(self.param(req, "half_life")))
        weight = float(self.param(req, "query_weight"))
        hits = []
        for rank, rid in enumerate(ids):
            attention = math.pow(0.5, rank / half)
            if sims is not None:
                attention *= (1 - weight) + weight * max(0.0, float(sims[rank]))
            hits.append(Hit(rid, attention, self.name, f"{rank + 1} back"))
        hits.sort(key=lambda h: -h.score)
        return hits
