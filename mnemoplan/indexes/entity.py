"""``entity_graph``: records that mention, or were said by, the entities a query names (Kùzu)."""

from __future__ import annotations

import math
from collections.abc import Callable

from mnemoplan.extract.names import entity_key
from mnemoplan.indexes.base import Hit, SearchIndex, SearchRequest
from mnemoplan.indexes.catalog import EntityCatalog
from mnemoplan.indexes.documents import KeyHasher
from mnemoplan.indexes.graph import GraphIndex
from mnemoplan.model import IndexDescriptor, ParamSpec

ROLE_WEIGHT = {"subject": 1.0, "object": 0.9, "mention": 0.8, "speaker": 0.6}


def requested_entities(req: SearchRequest, explicit: list[str] | None) -> list[str]:
    """Entity keys a step asks for: its own list, else the query's resolved entities."""
    if explicit:
        return [entity_key(e) for e in explicit if entity_key(e)]
    if req.analysis is None:
        return []
    return [e.key for e in req.analysis.entities if e.known]


class EntityGraphIndex(SearchIndex):
    """One hop in the entity graph: entity -> the records that mention it."""

    descriptor = IndexDescriptor(
        name="entity_graph",
        description="Records linked to named entities (people, places, things) through MENTIONS edges; "
        "a speaker is linked to what they said.",
        stores="Entity nodes per user (keys, aliases, types) and MENTIONS edges with a role "
        "(speaker, mention, subject, object).",
        best_for=["questions about a named person, place or thing", "everything said by or about someone"],
        query_params=[
            ParamSpec(name="entities", type="string_list", description="Names or keys; default: the query's."),
            ParamSpec(name="roles", type="string_list", description="Only these roles (speaker, mention, ...)."),
            ParamSpec(name="top_k", type="integer", default=200, description="How many records to return."),
        ],
        returns="Records with a score from the role of the link and how specific the entity is.",
        examples=[{"query": "what does Caroline do", "params": {"entities": ["Caroline"]}}],
    )

    def __init__(
        self, graph: GraphIndex, keys: Callable[[str], KeyHasher | None], catalog: Callable[[str], EntityCatalog]
    ) -> None:
        self._graph = graph
        self._keys = keys
        self._catalog = catalog

    def available(self, user_id: str) -> bool:
        return bool(self._catalog(user_id).entities)

    def search(self, req: SearchRequest) -> list[Hit]:
        wanted = requested_entities(req, self.param(req, "entities"))
        keys = self._keys(req.user_id)
        if not wanted or keys is None:
            return []
        catalog = self._catalog(req.user_id)
        hashed = {keys("entity", k): k for k in wanted}
        roles = set(self.param(req, "roles") or ROLE_WEIGHT)
        scores: dict[str, tuple[float, str]] = {}
        for rid, ent, role in self._graph.entity_records(keys.user, list(hashed), int(self.param(req, "top_k"))):
            if role not in roles:
                continue
            key = hashed.get(ent, "")
            info = catalog.entities.get(key)
            specificity = 1.0 / math.log(2.0 + (info.mentions if info else 1))
            score = ROLE_WEIGHT.get(role, 0.5) * specificity
            if score > scores.get(rid, (0.0, ""))[0]:
                scores[rid] = (score, f"{role} of {info.name if info else key}")
        ranked = sorted(scores.items(), key=lambda kv: -kv[1][0])
        return [Hit(rid, score, self.name, detail) for rid, (score, detail) in ranked]
