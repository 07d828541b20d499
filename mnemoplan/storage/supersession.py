"""Facts and statements closed when a newer one replaces them: a fact by a newer value of the same
attribute, and the records that named a value now replaced or ended (history stays, ``current``
false)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from mnemoplan.extract.attributes import mentions, value_terms
from mnemoplan.model.records import as_utc
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.bm25 import BM25Index
from mnemoplan.storage.bookkeeping import WriteBookkeeping
from mnemoplan.storage.graph.client import GraphIndex
from mnemoplan.storage.locks import StoreLocks
from mnemoplan.storage.log.table import LanceLog
from mnemoplan.storage.overlays import OverlayWriter


class Supersession:
    """Closes what a newer statement replaced, in the log and the graph.

    Args:
        log: The log.
        bm25: The BM25 overlay (finds the records that may name a value).
        graph: The graph overlay (its relations close too).
        overlays: The overlays' writer (graph changes go after the user's pending writes).
        locks: The store's locks (the write lock is held around each update).
        bookkeeping: The write path's per-user state (closed facts leave the ledger).
        begin: Told the user whose records are about to change (see ``changed``).
        changed: Told the user whose records changed (a shared log's other servers hear of it).
    """

    def __init__(self, log: LanceLog, bm25: BM25Index, graph: GraphIndex, overlays: OverlayWriter, locks: StoreLocks,
                 bookkeeping: WriteBookkeeping, begin: Callable[[str], None],
                 changed: Callable[[str], None]) -> None:  # fmt: skip
        self._log, self._bm25, self._graph, self._overlays = log, bm25, graph, overlays
        self._locks, self._bookkeeping = locks, bookkeeping
        self._begin, self._changed = begin, changed

    def supersede(self, user_id: str, old_id: str, new_id: str, at: datetime | None = None) -> None:
        """Close an old fact's validity in favour of a newer one (history stays queryable).

        The message the old fact was read from is closed too once every fact read from it is:
        "I live in Oslo" is no longer current after "I moved to Bergen", and would otherwise
        outrank it ("...and I love skiing" stays current while that fact does).
        """
        with self._locks.write:
            now = at or datetime.now(UTC)
            self._begin(user_id)
            self._log.set_superseded([old_id], new_id, now, user_id)
            self._bookkeeping.ledger(user_id).retire_fact(old_id)
            old = self._log.get(user_id, [old_id]).get(old_id)
            closed = []
            for source in old.derived_from if old is not None else []:
                cited = RecordFilter(user_id, kinds=("fact",), cites=source)
                facts = self._log.select(cited, ["id", "superseded_by"])
                if all(f["superseded_by"] or f["id"] == old_id for f in facts):
                    closed.append(source)
            self._log.set_superseded(closed, new_id, now, user_id)
        self._overlays.after_pending(user_id, lambda: self._graph.close_relation(old_id, int(now.timestamp())))
        self._changed(user_id)

    def mentions(
        self, user_id: str, old_values: list[str], new_value: str, at: datetime, by_id: str, speakers: tuple[str, ...]
    ) -> int:
        """Close the records that stated a value now replaced or ended: current records said
        before ``at`` that name one of ``old_values`` and not ``new_value`` (messages only
        if one of ``speakers`` said them: the person, or an assistant answering them). Returns
        how many were closed. The caller holds the user's write lock (``writing``).

        The records that may name the values are found by BM25 (a user's whole memory was read
        and matched before: a scan per change, slow for a large user), then matched as ever."""
        wanted = [v for v in old_values if v]
        if not wanted:
            return 0
        who = {s.lower() for s in speakers}
        columns = ["id", "kind", "speaker", "text", "occurred_at"]
        naming = self._naming(user_id, wanted)
        if naming is None:
            rows = self._log.select(RecordFilter(user_id, current=True), columns)
        else:
            rows = [row for start in range(0, len(naming), 500) for row in self._log.select(
                RecordFilter(user_id, current=True, ids=tuple(naming[start : start + 500])), columns)]  # fmt: skip
        closing, facts = [], []
        for row in rows:
            said = row["occurred_at"]
            if row["id"] == by_id or said is None or as_utc(said) >= at:
                continue
            if row["kind"] == "message" and str(row["speaker"] or "").lower() not in who:
                continue
            text = str(row["text"] or "")
            if not any(mentions(text, v, unlike=new_value) for v in wanted):
                continue
            if new_value and any(mentions(text, new_value, unlike=v) for v in wanted):
                continue
            closing.append(row["id"])
            if row["kind"] == "fact":
                facts.append(row["id"])
        with self._locks.write:
            if closing:
                self._begin(user_id)
            self._log.set_superseded(closing, by_id, at, user_id)
            for fact_id in facts:
                self._bookkeeping.ledger(user_id).retire_fact(fact_id)
                self._overlays.after_pending(
                    user_id, lambda f=fact_id: self._graph.close_relation(f, int(at.timestamp())))
        if closing:
            self._changed(user_id)
        return len(closing)

    def _naming(self, user_id: str, values: list[str], most: int = 5_000) -> list[str] | None:
        """Ids of the user's records whose words include a word of one of ``values`` (BM25, its
        documents not yet committed included); None (read them all) when a value has no word BM25
        keeps, or too many records match to list."""
        waiting = self._overlays.unindexed(user_id)  # written, not yet committed to the index: scored here
        found: dict[str, None] = {}
        for value in values:
            text = " ".join([value, *value_terms(value)])
            hits = self._bm25.search(user_id, text, most) if self._bm25.terms(text) else None
            if hits is None or len(hits) >= most:
                return None
            found.update((rid, None) for rid, _ in [*hits, *self._bm25.score_unindexed(user_id, text, waiting)])
        return list(found)
