"""The composition root: Settings in, a ready MemoryService out."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType

from mnemoplan.config import Settings
from mnemoplan.indexes.embedder import Embedder, make_embedder
from mnemoplan.indexes.entity import EntityGraphIndex
from mnemoplan.indexes.lexical import BM25SearchIndex
from mnemoplan.indexes.registry import IndexRegistry
from mnemoplan.indexes.semantic import SemanticIndex
from mnemoplan.indexes.store import MemoryStore
from mnemoplan.indexes.temporal import TemporalIndex
from mnemoplan.planner.analyzer import QueryAnalyzer
from mnemoplan.planner.deep import DeepSearch
from mnemoplan.planner.executor import PlanExecutor
from mnemoplan.planner.ranking import RankingConfig
from mnemoplan.planner.recall import RecallConfig, RecallPipeline
from mnemoplan.server.service import Limits, MemoryService

log = logging.getLogger(__name__)


def build_registry(store: MemoryStore) -> IndexRegistry:
    """Every searchable index over one store."""
    registry = IndexRegistry()
    registry.register(SemanticIndex(store.log))
    registry.register(BM25SearchIndex(store.bm25))
    registry.register(EntityGraphIndex(store.graph, lambda u: store.keys(u, create=False), store.catalog))
    registry.register(TemporalIndex(store.log))
    return registry


def recall_config(settings: Settings) -> RecallConfig:
    """Recall's knobs from Settings."""
    return RecallConfig(
        ranking=RankingConfig(recency_half_life_days=settings.recency_half_life_days),
        weights=MappingProxyType(dict(settings.recall_weights)),
        token_budget=settings.recall_token_budget,
    )


def build_service(settings: Settings, *, embedder: Embedder | None = None) -> MemoryService:
    """Open the stores under ``settings.data_dir``, repair interrupted writes, wire everything.

    Raises:
        DataDirLocked: another process owns the data directory.
    """
    embedder = embedder or make_embedder(
        settings.embedding_model,
        batch_size=settings.embedding_batch_size,
        threads=settings.embedding_threads,
        precision=settings.embedding_precision,
    )
    store = MemoryStore(settings.data_dir)
    repaired = store.repair()
    if repaired:
        log.warning("repaired %d interrupted write(s)", repaired)
    registry = build_registry(store)
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mnemoplan-step")
    recall = RecallPipeline(
        registry=registry,
        analyzer=QueryAnalyzer(store.catalog),
        executor=PlanExecutor(registry, pool, prefetch=store.log.get),
        records=store.log,
        embed_query=embedder.embed_query,
        config=recall_config(settings),
    )
    limits = Limits(
        max_text_chars=settings.max_text_chars,
        max_query_chars=settings.max_query_chars,
        max_messages_per_call=settings.max_messages_per_call,
        max_forget_ids=settings.max_forget_ids,
        recall_default_limit=settings.recall_default_limit,
        recall_max_limit=settings.recall_max_limit,
        deep_max_results=settings.deep_max_results,
    )
    return MemoryService(
        store=store,
        embedder=embedder,
        registry=registry,
        recall=recall,
        deep=DeepSearch(recall),
        limits=limits,
        default_user_id=settings.default_user_id,
    )
