"""``hierarchical``: session -> chunk -> message. Find the sessions about the query, then the
stretches of conversation inside them, then the turns."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, query_param
from mnemoplan.storage.bm25 import BM25Index
from mnemoplan.model import IndexDescriptor, ParamSpec
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.schema import KIND_CODES
from mnemoplan.storage.log.table import LanceLog

_POOL = 400  # candidate turns when a user is too large to score in memory
_EPISODES = 200  # summaries scored at level one


class HierarchicalIndex(SearchIndex):
    """Sessions scored by their episode summary and their best turns; then chunks; then turns."""

    descriptor = IndexDescriptor(
        name="hierarchical",
        description="Three levels: sessions (scored by their episode summary, by keywords and meaning, and by their "
        "best-matching turns), chunks of consecutive turns inside the best sessions, and the turns of the best "
        "chunks. Finds answers spread over a conversation, or phrased unlike the question.",
        stores="Episode summaries per session (per stretch of up to 100 messages in a long one), and each turn's "
        "place in its session.",
        best_for=["questions whose answer spans several turns", "'what did we discuss about X'",
                  "multi-part and list questions"],  # fmt: skip
        query_params=[
            query_param("What to match"),
            ParamSpec(name="top_sessions", type="integer", default=4, minimum=1, maximum=100, description="Sessions kept at level one."),
            ParamSpec(name="chunk_size", type="integer", default=6, minimum=1, maximum=100, description="Turns per chunk."),
            ParamSpec(name="top_chunks", type="integer", default=2, minimum=1, maximum=100, description="Chunks kept per session."),
            ParamSpec(name="per_chunk", type="integer", default=3, minimum=1, maximum=100, description="Turns returned per chunk."),
        ],
        returns="Turns scored by session x chunk x turn relevance; detail names the session and the chunk.",
        examples=[{"query": "what hobbies has she picked up", "params": {"top_sessions": 5}}],
    )

    def __init__(self, log: LanceLog, bm25: BM25Index) -> None:
        self._log = log
        self._bm25 = bm25

    def available(self, user_id: str) -> bool:
        return self._log.count(RecordFilter(user_id, in_session=True)) > 0

    def _turns(self, req: SearchRequest, vector: np.ndarray) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
        """Message ids, their similarity to the query, their sessions and their order."""
        view = self._log.user_view(req.user_id)
        if view is not None:
            rows = np.flatnonzero((view.kinds == KIND_CODES["message"]) & (view.sessions != ""))
            if req.project_id:
                rows = rows[view.projects[rows] == req.project_id]
            sims = view.matrix[rows] @ vector
            return [view.ids[i] for i in rows], sims, list(view.sessions[rows]), view.seqs[rows]
        messages = RecordFilter(req.user_id, req.project_id, kinds=("message",))
        found = self._log.vector_search(messages, vector, _POOL)
        records = self._log.get(req.user_id, [rid for rid, _ in found])
        kept = [(rid, sim) for rid, sim in found if rid in records and records[rid].session_id]
        return (
            [rid for rid, _ in kept],
            np.asarray([sim for _, sim in kept], dtype=np.float32),
            [records[rid].session_id for rid, _ in kept],
            np.asarray([records[rid].seq for rid, _ in kept], dtype=np.int64),
        )

    def _episode_scores(self, req: SearchRequest, text: str, vector: np.ndarray) -> dict[str, float]:
        """Session -> relevance of its best episode summary by meaning plus its best by keywords
        (each in [0, 1]; a long session has a summary per stretch)."""
        # Room for a session summarised in many stretches (one per 100 messages) beside the others.
        episodes = self._log.vector_search(RecordFilter(req.user_id, kinds=("episode",)), vector, _EPISODES)
        lexical = self._bm25.search(req.user_id, text, _EPISODES, kinds=["episode"])
        ids = list(dict.fromkeys([rid for rid, _ in episodes] + [rid for rid, _ in lexical]))
        records = self._log.get(req.user_id, ids)
        top_lex = max((s for _, s in lexical), default=0.0) or 1.0
        meaning: dict[str, float] = defaultdict(float)
        keywords: dict[str, float] = defaultdict(float)
        for rid, sim in episodes:
            if rid in records:
                session = records[rid].session_id
                meaning[session] = max(meaning[session], 0.5 * max(0.0, sim))
        for rid, score in lexical:
            if rid in records:
                session = records[rid].session_id
                keywords[session] = max(keywords[session], 0.5 * score / top_lex)
        return {s: meaning.get(s, 0.0) + keywords.get(s, 0.0) for s in meaning.keys() | keywords.keys()}

    def search(self, req: SearchRequest) -> list[Hit]:
        text = self.param(req, "query") or req.query
        vector = req.vector(text)
        ids, sims, sessions, seqs = self._turns(req, vector)
        if not ids:
            return []
        by_session: dict[str, list[int]] = defaultdict(list)
        for i, session in enumerate(sessions):
            by_session[session].append(i)
        episode = self._episode_scores(req, text, vector)
        session_score = {}
        for session, rows in by_session.items():
            best = np.sort(sims[rows])[::-1][:3]
            session_score[session] = float(best.mean()) + episode.get(session, 0.0)
        top_sessions = sorted(session_score, key=lambda s: -session_score[s])[: int(self.param(req, "top_sessions"))]
        size = max(1, int(self.param(req, "chunk_size")))
        hits: list[Hit] = []
        for session in top_sessions:
            rows = sorted(by_session[session], key=lambda i: seqs[i])
            chunks = [rows[j : j + size] for j in range(0, len(rows), max(1, size // 2))]
            ranked = sorted(chunks, key=lambda c: -float(np.sort(sims[c])[::-1][:2].mean()))
            for chunk in ranked[: int(self.param(req, "top_chunks"))]:
                chunk_score = float(np.sort(sims[chunk])[::-1][:2].mean())
                for i in sorted(chunk, key=lambda i: -sims[i])[: int(self.param(req, "per_chunk"))]:
                    score = session_score[session] * max(0.0, chunk_score) * max(0.0, float(sims[i]))
                    detail = f"session {session} > turns {chunk.index(i) + 1}/{len(chunk)} of a chunk"
                    hits.append(Hit(ids[i], score, self.name, detail))
        best: dict[str, Hit] = {}
        for hit in hits:
            if hit.id not in best or hit.score > best[hit.id].score:
                best[hit.id] = hit
        return sorted(best.values(), key=lambda h: -h.score)
