"""``semantic``: nearest records by embedding (LanceDB vector search over the log)."""

from __future__ import annotations

from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, kinds_param, query_param, top_k_param
from mnemoplan.model import IndexDescriptor, ParamSpec
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.partitions import PARTITION_ROWS
from mnemoplan.storage.log.table import LanceLog

QUERY_PARAMS = [
    query_param("Text to embed"),
    top_k_param(50),
    ParamSpec(
        name="min_similarity", type="number", default=0.15, minimum=-1, maximum=1,
        description="Cosine floor; weaker matches are dropped.",
    ),
    kinds_param("message, fact, procedure, episode, passage"),
]


class SemanticIndex(SearchIndex):
    """Vector search over the log's contextual embeddings."""

    descriptor = IndexDescriptor(
        name="semantic",
        description="Dense similarity between the query and each memory (all-MiniLM-L6-v2 embeddings; "
        "a message's vector also leans towards the turn before it).",
        stores="One 384-d vector per record: messages, facts, procedures and episode summaries. A user "
        f"of {PARTITION_ROWS:,} records or more is searched in the groups of vectors nearest the query, "
        "not exhaustively.",
        best_for=["paraphrases and vague wording", "questions whose words differ from the memory's words"],
        query_params=QUERY_PARAMS,
        returns="Records with cosine similarity in [-1, 1].",
        examples=[{"query": "what does she do for fun", "params": {"top_k": 30}}],
    )

    def __init__(self, log: LanceLog) -> None:
        self._log = log

    def available(self, user_id: str) -> bool:
        return self._log.count(RecordFilter(user_id)) > 0

    def search(self, req: SearchRequest) -> list[Hit]:
        text = self.param(req, "query") or req.query
        floor = float(self.param(req, "min_similarity"))
        kinds = tuple(self.param(req, "kinds") or ())
        where = RecordFilter(req.user_id, req.project_id, req.after, req.before, kinds=kinds)
        # The query is embedded once the user's vectors are loaded.
        rows = self._log.vector_search(where, lambda: req.vector(text), int(self.param(req, "top_k")))
        return [Hit(rid, sim, self.name) for rid, sim in rows if sim >= floor]
