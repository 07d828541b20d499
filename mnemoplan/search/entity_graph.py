"""The ``entity_graph`` index: the records that mention, or were said by, the entities a query
names, and one hop further along entity links; and the walk over the entity graph (Kùzu) it
shares with ``graph_traversal`` (search/graph_traversal.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from mnemoplan.extract.names import entity_key
from mnemoplan.search.base import TOP_K_MAX, Hit, SearchIndex, SearchRequest, top_k_param
from mnemoplan.storage.catalog import EntityCatalog
from mnemoplan.storage.documents import KeyHasher
from mnemoplan.storage.graph.client import GraphIndex
from mnemoplan.model import IndexDescriptor, ParamSpec

ROLE_WEIGHT = {"subject": 1.0, "object": 0.9, "mention": 0.8, "speaker": 0.6}

WALK_PARAMS = [
    ParamSpec(name="roles", type="string_list", description="Only links of these roles.",
              choices=list(ROLE_WEIGHT)),  # fmt: skip
    ParamSpec(name="decay", type="number", default=0.5, minimum=0, maximum=1, description="Score factor per extra hop."),
    ParamSpec(name="max_per_entity", type="integer", default=30, minimum=1, maximum=TOP_K_MAX,
              description="Records taken per linked entity beyond the first hop."),  # fmt: skip
    top_k_param(200),
]


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


@dataclass
class Walk:
    """Spreading activation over the entity graph of one user."""

    graph: GraphIndex
    keys: KeyHasher
    catalog: EntityCatalog
    roles: list[str] | None
    decay: float
    cap: int
    scores: dict[str, tuple[float, str]] = field(default_factory=dict)

    def _label(self, key: str) -> str:
        info = self.catalog.entities.get(key)
        return info.name if info else key

    def _visit(self, rows: list[tuple[str, str, str]], key_of: dict[str, str], factor: dict[str, float],
               path: dict[str, str]) -> None:  # fmt: skip
        for rid, ent, role in rows:
            info = self.catalog.entities.get(key_of.get(ent, ""))
            specificity = 1.0 / math.log(2.0 + (info.mentions if info else 1))
            score = factor[ent] * ROLE_WEIGHT.get(role, 0.5) * specificity
            if score > self.scores.get(rid, (0.0, ""))[0]:
                self.scores[rid] = (score, f"{path[ent]} ({role})")

    def _records(self, frontier: dict[str, str], limit: int) -> list[tuple[str, str, str]]:
        """The records that mention entities of ``frontier`` (hashed key -> key): (record, hashed
        key, role), newest first; from the catalog's ``MentionIndex`` when it has one, which holds
        the user's own rows (the graph filters a scan of every entity in the store)."""
        index = self.catalog.mentions
        if index is None:
            return self.graph.entity_records(self.keys.user, list(frontier), limit, self.roles)
        hashed_of = {key: hashed for hashed, key in frontier.items()}
        found = index.records(list(hashed_of), limit, self.roles, order=hashed_of)
        return [(rid, hashed_of[key], role) for rid, key, role in found]

    def run(self, seeds: dict[str, float], hops: int, limit: int) -> list[tuple[str, float, str]]:
        """Walk from seed entity keys (with starting weights); (record id, score, path), best first."""
        hashed = {self.keys("entity", k): k for k in seeds}
        factor = {h: seeds[k] for h, k in hashed.items()}
        path = {h: self._label(k) for h, k in hashed.items()}
        frontier = dict(hashed)
        reverse: dict[str, str] | None = None
        for hop in range(max(1, hops)):
            cap = limit if hop == 0 else self.cap * len(frontier)
            rows = self._records(frontier, cap)
            if hop:  # beyond the first hop, each entity contributes at most ``cap`` records
                kept, per_entity = [], {}
                for row in rows:
                    per_entity[row[1]] = per_entity.get(row[1], 0) + 1
                    if per_entity[row[1]] <= self.cap:
                        kept.append(row)
                rows = kept
            self._visit(rows, hashed, factor, path)
            if hop + 1 >= hops:
                break
            if reverse is None:
                reverse = {self.keys("entity", k): k for k in self.catalog.entities}
            nxt: dict[str, str] = {}
            for src, dst, weight in self.graph.related_entities(self.keys.user, list(frontier), limit=20):
                if dst in reverse and dst not in hashed:
                    hashed[dst] = nxt[dst] = reverse[dst]
                    factor[dst] = factor[src] * self.decay * weight
                    path[dst] = f"{path[src]} -> {self._label(reverse[dst])}"
            if not nxt:
                break
            frontier = nxt
        ranked = sorted(self.scores.items(), key=lambda kv: -kv[1][0])[:limit]
        return [(rid, score, detail) for rid, (score, detail) in ranked]


class EntityWalkIndex(SearchIndex):
    """An index that answers by a walk over the entity graph (``entity_graph``, ``graph_traversal``).

    Args:
        graph: The entity graph.
        keys: A user's key hasher (None for a user with no memory yet).
        catalog: A user's entity catalog.
    """

    def __init__(
        self, graph: GraphIndex, keys: Callable[[str], KeyHasher | None], catalog: Callable[[str], EntityCatalog]
    ) -> None:
        self._graph = graph
        self._keys = keys
        self._catalog = catalog

    def available(self, user_id: str) -> bool:
        return bool(self._catalog(user_id).entities)

    def _walk(self, req: SearchRequest, seeds: dict[str, float], hops: int) -> list[Hit]:
        keys = self._keys(req.user_id)
        if not seeds or keys is None:
            return []
        walk = Walk(self._graph, keys, self._catalog(req.user_id), self.param(req, "roles"),
                    float(self.param(req, "decay")), int(self.param(req, "max_per_entity")))  # fmt: skip
        return [Hit(rid, score, self.name, detail) for rid, score, detail in
                walk.run(seeds, hops, int(self.param(req, "top_k")))]  # fmt: skip


class EntityGraphIndex(EntityWalkIndex):
    """Entity -> the records that mention it, and one hop further along entity links."""

    descriptor = IndexDescriptor(
        name="entity_graph",
        description="Records linked to named entities (people, places, things) through MENTIONS edges, and, at "
        "hop two, records of entities linked to those (by a fact, or mentioned together). A speaker is linked "
        "to what they said; the conversation's participants are skipped unless named in `entities`.",
        stores="Entity nodes per user (keyed hashes; names, aliases and types live in the log) and MENTIONS edges "
        "with a role (speaker, mention, subject, object); RELATED edges from facts.",
        best_for=["questions about a named person, place or thing", "everything said about someone"],
        query_params=[
            ParamSpec(name="entities", type="string_list", description="Names or keys; default: the query's."),
            ParamSpec(name="entity_type", type="string",
                      description="Every known entity of this type (person, pet, place, organization): for "
                      "'who are my friends', 'list the places I visited'."),  # fmt: skip
            ParamSpec(name="hops", type="integer", default=2, minimum=1, maximum=2,
                      description="1: the entities' own records; 2: one more."),
            *WALK_PARAMS,
        ],
        returns="Records scored by link role, entity specificity and hop; detail is the path.",
        examples=[{"query": "what do I know about Max", "params": {"entities": ["Max"]}}],
    )

    def search(self, req: SearchRequest) -> list[Hit]:
        catalog = self._catalog(req.user_id)
        etype = self.param(req, "entity_type")
        if etype and not self.param(req, "entities"):
            typed = [info for info in catalog.entities.values() if info.type == etype and not info.spoke]
            typed.sort(key=lambda info: -info.mentions)
            return self._walk(req, {info.key: 1.0 for info in typed[:30]}, 1)
        wanted = requested_entities(req, self.param(req, "entities"), catalog)
        return self._walk(req, {k: 1.0 for k in wanted}, min(2, int(self.param(req, "hops"))))
