"""``bm25``: keyword search (Tantivy BM25, stemmed, stop words removed)."""

from __future__ import annotations

from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, kinds_param, query_param, top_k_param
from mnemoplan.storage.bm25 import BM25Index
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

    def __init__(self, index: BM25Index) -> None:
        self._index = index

    def search(self, req: SearchRequest) -> list[Hit]:
        text = self.param(req, "query") or req.query
        hits = self._index.search(
            req.user_id,
            text,
            int(self.param(req, "top_k")),
            kinds=self.param(req, "kinds"),
            session_id=self.param(req, "session_id"),
            project_id=req.project_id or None,
        )
        return [Hit(rid, score, self.name) for rid, score in hits]
