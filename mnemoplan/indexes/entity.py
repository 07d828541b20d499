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


def requested_entities(req: SearchRequest, explicit: list[str] | None, catalog: EntityCatalog) -> list[str]:
    """Entity keys a step asks for: its own list, else the query's resolved entities.

    By default the conversation's own participants (entities that speak) are left out:
    they are linked to most of what is said, so they locate nothing; the words of the
    query do that better. What the graph adds is the things and people talked about.
    """
    if explicit:
        return [entity_key(e) for e in explicit if entity_key(e)]
    if req.analysis is None:
        return []
    keys = [e.key for e in req.analysis.entities if e.known]
    return [k for k in keys if k in catalog.entities and not catalog.entities[k].spoke]


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
            ParamSpec(name="hops", type="integer", default=2,
                      description="1: the entities' own records; 2: also records of entities linked to them "
                      "(by a fact, or mentioned together)."),  # fmt: skip
            ParamSpec(name="decay", type="number", default=0.5, description="Score factor per extra hop."),
            ParamSpec(name="max_per_entity", type="integer", default=30,
                      description="Records taken per linked entity at the second hop."),  # fmt: skip
            ParamSpec(name="top_k", type="integer", default=200, description="How many records to return."),
        ],
        returns="Records with a score from the role of the link, how specific the entity is, and the hop; "
        "detail names the path.",
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
        catalog = self._catalog(req.user_id)
        wanted = requested_entities(req, self.param(req, "entities"), catalog)
        keys = self._keys(req.user_id)
        if not wanted or keys is None:
            return []
        hashed = {keys("entity", k): k for k in wanted}
        roles = self.param(req, "roles")
        top_k = int(self.param(req, "top_k"))
        scores: dict[str, tuple[float, str]] = {}

        def visit(rows: list[tuple[str, str, str]], factor: float, via: dict[str, str]) -> None:
            for rid, ent, role in rows:
                info = catalog.entities.get(names.get(ent, ""))
                specificity = 1.0 / math.log(2.0 + (info.mentions if info else 1))
                score = factor * ROLE_WEIGHT.get(role, 0.5) * specificity * strength.get(ent, 1.0)
                if score > scores.get(rid, (0.0, ""))[0]:
                    label = info.name if info else "?"
                    scores[rid] = (score, f"{via[ent]}{role} of {label}" if ent in via else f"{role} of {label}")

        names = dict(hashed)
        strength: dict[str, float] = {}
        visit(self._graph.entity_records(keys.user, list(hashed), top_k, roles), 1.0, {})
        if int(self.param(req, "hops")) >= 2:
            # Spreading activation: one more hop along entity links, decayed, capped per entity.
            linked = self._graph.related_entities(keys.user, list(hashed), limit=20)
            reverse = {keys("entity", k): k for k in catalog.entities}
            via: dict[str, str] = {}
            for src, dst, weight in linked:
                if dst in reverse and dst not in hashed:
                    names[dst] = reverse[dst]
                    strength[dst] = max(strength.get(dst, 0.0), weight)
                    via[dst] = f"{catalog.entities[names[src]].name if names.get(src) in catalog.entities else '?'} -> "
            if strength:
                cap = int(self.param(req, "max_per_entity"))
                rows = self._graph.entity_records(keys.user, list(strength), cap * len(strength), roles)
                per_entity: dict[str, int] = {}
                capped = []
                for row in rows:
                    per_entity[row[1]] = per_entity.get(row[1], 0) + 1
                    if per_entity[row[1]] <= cap:
                        capped.append(row)
                visit(capped, float(self.param(req, "decay")), via)
        ranked = sorted(scores.items(), key=lambda kv: -kv[1][0])[:top_k]
        return [Hit(rid, score, self.name, detail) for rid, (score, detail) in ranked]
