"""The ``graph_traversal`` index: the entity graph walked from the entities of the records earlier
plan steps found, up to three hops, with the path that led to each record."""

from __future__ import annotations

from collections.abc import Callable

from mnemoplan.extract.names import entity_key
from mnemoplan.model import IndexDescriptor, ParamSpec
from mnemoplan.search.base import Hit, SearchRequest
from mnemoplan.search.entity_graph import WALK_PARAMS, EntityWalkIndex, requested_entities
from mnemoplan.storage.catalog import EntityCatalog
from mnemoplan.storage.documents import KeyHasher
from mnemoplan.storage.graph.client import GraphIndex
from mnemoplan.storage.log.table import LanceLog


class GraphTraversalIndex(EntityWalkIndex):
    """Multi-hop walk seeded from what earlier steps found (or named seeds)."""

    descriptor = IndexDescriptor(
        name="graph_traversal",
        description="Multi-hop traversal of the entity graph starting from the entities of the records that "
        "earlier steps found (give it depends_on) or from named seeds, with the reasoning path to each "
        "record.",
        stores="The entity graph (see entity_graph).",
        best_for=["multi-hop questions ('the friend who moved from Sweden - what does she do?')",
                  "connecting facts said in different sessions"],  # fmt: skip
        query_params=[
            ParamSpec(name="seeds", type="string_list", description="Entity names or keys to start from."),
            ParamSpec(name="hops", type="integer", default=2, minimum=1, maximum=3,
                      description="How far to walk (1-3)."),
            ParamSpec(name="max_seeds", type="integer", default=8, minimum=1, maximum=100,
                      description="Entities taken from upstream records."),
            *WALK_PARAMS,
        ],
        returns="Records with the path that reached them (e.g. 'Melanie -> Max (mention)').",
        examples=[{"query": "what breed is the dog of the friend from Sweden",
                   "params": {"hops": 2}, "depends_on": ["bm25"]}],  # fmt: skip
    )

    def __init__(self, graph: GraphIndex, keys: Callable[[str], KeyHasher | None],
                 catalog: Callable[[str], EntityCatalog], log: LanceLog) -> None:  # fmt: skip
        super().__init__(graph, keys, catalog)
        self._log = log

    def search(self, req: SearchRequest) -> list[Hit]:
        catalog = self._catalog(req.user_id)
        named = self.param(req, "seeds") or []
        seeds: dict[str, float] = {entity_key(s): 1.0 for s in named if entity_key(s)}
        if not seeds and req.upstream:
            top = list(dict.fromkeys(h.id for h in sorted(req.upstream, key=lambda h: -h.score)))[:20]
            records = self._log.get(req.user_id, top)
            for rank, rid in enumerate(top):
                for m in records[rid].entities if rid in records else []:
                    info = catalog.entities.get(m.key)
                    if info is not None and not info.spoke and m.key not in seeds:
                        seeds[m.key] = 1.0 / (1 + rank / 5)
            seeds = dict(sorted(seeds.items(), key=lambda kv: -kv[1])[: int(self.param(req, "max_seeds"))])
        if not seeds:
            seeds = {k: 1.0 for k in requested_entities(req, None, catalog)}
        return self._walk(req, seeds, max(1, min(3, int(self.param(req, "hops")))))
