"""``bm25``: keyword search (Tantivy BM25, stemmed, stop words removed)."""

from __future__ import annotations

from collections.abc import Callable

from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, kinds_param, query_param, top_k_param
from mnemoplan.storage.bm25 import BM25Doc, BM25Index
from mnemoplan.model import IndexDescriptor, ParamSpec


class BM25SearchIndex(SearchIndex):
    """BM25 over each record's text (and, for a message, the turn before it)."""

    descriptor = IndexDescriptor(
        name="bm25",
        description="Keyword relevance (BM25) over each memory's words, stemmed, stop words removed; "
        "a message is indexed with the turn before it.",
        stores="An inverted index per user of every record's text.",
        best_for=["names, rare words, exact terms", "questions that reuse the memory's own words"],
        query_params=[
            query_param("Words to match"),
            top_k_param(50),
            kinds_param(),
            ParamSpec(name="session_id", type="string", description="Only this session."),
        ],
        returns="Records with a BM25 score (unbounded, higher is better).",
        examples=[{"query": "adoption agencies", "params": {"top_k": 20}}],
    )

    def __init__(self, index: BM25Index, unindexed: Callable[[str], list[BM25Doc]] | None = None) -> None:
        """``unindexed(user_id)``: the user's documents accepted but not indexed yet (they wait to be
        embedded and stored); they are scored here, beside the index's own, so what remember
        acknowledged is found by its words before it is stored."""
        self._index = index
        self._unindexed = unindexed

    def search(self, req: SearchRequest) -> list[Hit]:
        text = self.param(req, "query") or req.query
        top_k, kinds, session = int(self.param(req, "top_k")), self.param(req, "kinds"), self.param(req, "session_id")
        hits = self._index.search(req.user_id, text, top_k, kinds=kinds, session_id=session,
                                  project_id=req.project_id or None)  # fmt: skip
        waiting = [d for d in self._unindexed(req.user_id) if (not kinds or d.kind in kinds)
                   and (not session or d.session_id == session)
                   and (not req.project_id or d.project_id == req.project_id)] if self._unindexed else []  # fmt: skip
        if waiting:
            known = {rid for rid, _ in hits}  # stored meanwhile: the index's score stands
            extra = [hit for hit in self._index.score_unindexed(req.user_id, text, waiting) if hit[0] not in known]
            hits = sorted(hits + extra, key=lambda hit: -hit[1])[:top_k]
        return [Hit(rid, score, self.name) for rid, score in hits]
