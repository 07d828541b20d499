"""``fact_store``: facts (subject, predicate, object) read from messages or given by the agent."""

from __future__ import annotations

from mnemoplan.extract.names import entity_key
from mnemoplan.search.base import Hit, SearchIndex, SearchRequest, query_param, top_k_param
from mnemoplan.model import IndexDescriptor, ParamSpec
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.table import LanceLog


class FactStoreIndex(SearchIndex):
    """Facts by similarity to the query, optionally about one subject; current ones by default."""

    descriptor = IndexDescriptor(
        name="fact_store",
        description="Facts distilled from messages (by rule, by the LLM when configured, or sent by the agent): "
        "subject, predicate, object, confidence, negation, validity. Superseded facts are kept as history.",
        stores="Fact records with metadata {subject, predicate, object, negated, confidence}, valid_from/valid_to, "
        "and a link to the messages they came from.",
        best_for=["what someone is, has, likes, did", "current state of something that changes (job, home)",
                  "yes/no questions about a person's preferences"],  # fmt: skip
        query_params=[
            query_param("What to match"),
            ParamSpec(name="subject", type="string", description="Only facts about this entity (name or key)."),
            ParamSpec(name="include_superseded", type="boolean", default=False,
                      description="Also facts a newer fact replaced (history)."),  # fmt: skip
            top_k_param(30, "How many facts to return."),
        ],
        returns="Fact records scored by similarity x confidence; detail shows subject | predicate | object.",
        examples=[{"query": "where does she live now", "params": {"subject": "Caroline"}}],
    )

    def __init__(self, log: LanceLog) -> None:
        self._log = log

    def available(self, user_id: str) -> bool:
        return self._log.count(RecordFilter(user_id, kinds=("fact",))) > 0

    def search(self, req: SearchRequest) -> list[Hit]:
        text = self.param(req, "query") or req.query
        top_k = int(self.param(req, "top_k"))
        subject = entity_key(self.param(req, "subject") or "")
        history = bool(self.param(req, "include_superseded"))
        where = RecordFilter(req.user_id, req.project_id, req.after, req.before, kinds=("fact",))
        found = self._log.vector_search(where, req.vector(text), top_k * 3)
        records = self._log.get(req.user_id, [rid for rid, _ in found])
        hits = []
        for rid, sim in found:
            rec = records.get(rid)
            if rec is None or (rec.superseded_by and not history):
                continue
            if subject and not any(m.key == subject and m.role == "subject" for m in rec.entities):
                continue
            meta = rec.metadata
            confidence = float(meta.get("confidence", 0.9))
            state = "superseded" if rec.superseded_by else "current"
            detail = f"{meta.get('subject', '?')} | {meta.get('predicate', '?')} | {meta.get('object', '?')} ({state})"
            hits.append(Hit(rid, sim * confidence, self.name, detail))
        hits.sort(key=lambda h: -h.score)
        return hits[:top_k]
