"""``token_match``: every memory scored by matching the query's tokens one by one (late interaction)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Literal

import numpy as np

from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, kinds_param, query_param, top_k_param
from mnemoplan.inference.embedder import TokenVectors
from mnemoplan.inference.token_vectors import project, token_weights
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.table import LanceLog
from mnemoplan.model import IndexDescriptor, ParamSpec

QUERY_PARAMS = [
    query_param("Text to match"),
    top_k_param(100),
    ParamSpec(
        name="min_score", type="number", default=0.25, minimum=-1, maximum=1,
        description="Floor on the weighted match; weaker memories are dropped.",
    ),
    kinds_param("message, fact, procedure, passage"),
    ParamSpec(
        name="scan_log", type="boolean", default=False,
        description="For a user whose tokens are too many to hold in memory, read them all from the log "
        "(slow for such a user); without it such a user gets no hits from this index.",
    ),
    ParamSpec(
        name="max_memories", type="integer", default=0, minimum=0,
        description="Skip users with more memories than this (0: no limit); the scan's time grows with them.",
    ),
]  # fmt: skip


class TokenMatchIndex(SearchIndex):
    """Each memory's score is the mean, over the query's tokens weighted by their rarity in the
    user's memory, of the best cosine between that token and the memory's tokens."""

    descriptor = IndexDescriptor(
        name="token_match",
        description="Token-level matching (late interaction): each query word meets its closest word in "
        "each memory, in the embedding model's contextual token space, weighted by how rare the "
        "query word is in this user's memory. Finds memories that share no word with the query "
        "but answer it ('exercises' meets 'kickboxing').",
        stores="The content tokens of every message and fact (not summaries), 128-d int8.",
        best_for=["lists and categories ('what exercises', 'which pets')", "paraphrase at the level of single words",
                  "multi-hop questions whose pieces each match one word"],
        query_params=QUERY_PARAMS,
        returns="Records with their weighted mean best cosine (roughly 0.2-0.9).",
        examples=[{"query": "what instruments does she play", "params": {"top_k": 100}}],
    )

    def __init__(
        self,
        log: LanceLog,
        query_tokens: Callable[[str], TokenVectors],
        word_idf: Callable[[str, list[str]], list[float]],
    ) -> None:
        self._log = log
        self._query_tokens = query_tokens
        self._word_idf = word_idf
        # (user, what is counted) -> (generation, n)
        self._counts: dict[tuple[str, str], tuple[tuple[int, int], int]] = {}

    def _count(self, user_id: str, what: Literal["with", "lacking"]) -> int:
        """A count of the user's rows in the log, read again only after a change to their rows
        (every write, delete and backfill bumps the token cache's generation): each count is a
        LanceDB query, asked on every deep search and every description of the index."""
        stamp = self._log.token_cache.generation(user_id)
        known = self._counts.get((user_id, what))
        if known is not None and known[0] == stamp:
            return known[1]
        log = self._log
        n = log.count_with_tokens(user_id) if what == "with" else log.count_lacking_tokens(user_id)
        self._counts[(user_id, what)] = (stamp, n)
        return n

    def available(self, user_id: str) -> bool:
        return self._count(user_id, "with") > 0

    def complete(self, user_id: str) -> bool:
        """Whether every memory of the user this index can hold has its token vectors (none was
        written before them and left without by ``mnemoplan reindex``)."""
        return self._count(user_id, "lacking") == 0

    def search(self, req: SearchRequest) -> list[Hit]:
        text = self.param(req, "query") or req.query
        top_k = int(self.param(req, "top_k"))
        blocks = self._log.token_blocks(req.user_id, scan=bool(self.param(req, "scan_log")),
                                        most=int(self.param(req, "max_memories")))  # fmt: skip
        first = next(blocks, None)
        if first is None:  # nothing to match: the query is not even embedded
            return []
        q = self._query_tokens(text)
        if not len(q.vectors):
            return []
        weights = token_weights(text, q.words, lambda words: self._word_idf(req.user_id, words))
        # A stop word's token weighs 0: matched against every stored token for nothing (a long
        # question's cost grows with its tokens: bench/README.md, "Long questions").
        weighed = weights > 0
        query, weights = project(q.vectors[weighed]), weights[weighed]
        kinds = tuple(self.param(req, "kinds") or ())
        where = RecordFilter(req.user_id, req.project_id, req.after, req.before, kinds=kinds)
        ids: list[str] = []
        scores: list[np.ndarray] = []
        parts: dict[str, np.ndarray] = {}  # the passages' best cosines, which their messages are scored from
        composed: list[tuple[str, tuple[str, ...]]] = []
        for block in itertools.chain([first], blocks):  # one block at a time: a scanned user is never whole
            best = block.best(query)
            parts.update(block.part_columns(best))
            n = len(block.starts)
            keep = np.flatnonzero(block.mask(where))
            composed += [(block.ids[i], block.parts[i - n]) for i in keep[keep >= n]]
            keep = keep[keep < n]
            if keep.size:
                match = weights @ best[:, keep]
                top = np.argsort(-match, kind="stable")[:top_k]
                ids.extend(block.ids[keep[i]] for i in top)
                scores.append(match[top])
        if composed:  # a long message: per query token, the best of its passages'
            ids += [rid for rid, _ in composed]
            scores.append(np.array([weights @ np.max(found, axis=0) if (found := [parts[p] for p in of if p in parts])
                                    else 0.0 for _, of in composed]))  # fmt: skip
        if not ids:
            return []
        merged = np.concatenate(scores)
        order = np.argsort(-merged, kind="stable")[:top_k]
        floor = float(self.param(req, "min_score"))
        return [Hit(ids[i], float(merged[i]), self.name) for i in order if merged[i] >= floor]
