"""The composition root: Settings in, a ready MemoryService out."""

from __future__ import annotations

import logging
import threading
from functools import partial
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import MappingProxyType

from mnemoplan.config import Settings
from mnemoplan.extract.summary import SentenceCache
from mnemoplan.extract.times import warm_up as warm_up_dates
from mnemoplan.storage.bm25 import BM25Index
from mnemoplan.inference.embedder import EmbeddingModel, TokenEncoder, embedding_model
from mnemoplan.search.entity_graph import EntityGraphIndex
from mnemoplan.search.graph_traversal import GraphTraversalIndex
from mnemoplan.search.fact_store import FactStoreIndex
from mnemoplan.search.hierarchical import HierarchicalIndex
from mnemoplan.search.bm25 import BM25SearchIndex
from mnemoplan.search.registry import IndexRegistry
from mnemoplan.service.search_log import SearchLog
from mnemoplan.search.semantic import SemanticIndex
from mnemoplan.storage.store import MemoryStore
from mnemoplan.search.temporal import TemporalIndex
from mnemoplan.search.token_match import TokenMatchIndex
from mnemoplan.search.working_memory import WorkingMemoryIndex
from mnemoplan.planner.analyzer import QueryAnalyzer
from mnemoplan.planner.confidence import CALIBRATED_MODELS, ConfidenceScorer
from mnemoplan.planner.deep import DeepConfig, DeepSearch, LLMParts
from mnemoplan.planner.llm.expander import LLMExpander
from mnemoplan.planner.executor import PlanExecutor
from mnemoplan.inference.llm import LLMClient
from mnemoplan.inference.llm_calls import DailyCap, MemoryRecorder
from mnemoplan.service.llm_log import LLMCallLog
from mnemoplan.planner.llm.evaluator import LLMEvaluator
from mnemoplan.ingest.llm_extractor import LLMFactExtractor
from mnemoplan.planner.llm.planner import LLMPlanner, LLMReplanner
from mnemoplan.planner.ranking import RankingConfig
from mnemoplan.planner.recall import RecallConfig, RecallPipeline
from mnemoplan.planner.rerank.base import Reranker
from mnemoplan.planner.rerank.cross_encoder import CrossEncoderReranker
from mnemoplan.planner.rerank.late_interaction import LateInteractionReranker
from mnemoplan.planner.rerank.llm import LLMReranker
from mnemoplan.ingest.background import BackgroundExtraction
from mnemoplan.ingest.deferred import DeferredIngest, WithWaiting
from mnemoplan.ingest.pipeline import Ingestor
from mnemoplan.storage.inbox import Inbox
from mnemoplan.storage.log.tables import LogTables
from mnemoplan.storage.log.token_table import TokenTable
from mnemoplan.storage.tokens import TokenStore
from mnemoplan.service.limits import Limits
from mnemoplan.service.service import MemoryService

log = logging.getLogger(__name__)


def build_registry(
    store: MemoryStore, tokens: TokenEncoder | None = None, deferred: DeferredIngest | None = None
) -> IndexRegistry:
    """Every searchable index over one store (``token_match`` when the embedding model gives a
    query's token vectors; BM25 also over what ``deferred`` holds, accepted and not stored yet)."""
    keys = lambda u: store.keys(u, create=False)  # noqa: E731
    registry = IndexRegistry()
    registry.register(SemanticIndex(store.log))
    registry.register(BM25SearchIndex(store.bm25, deferred.unindexed if deferred is not None else None))
    registry.register(EntityGraphIndex(store.graph, keys, store.catalog))
    registry.register(GraphTraversalIndex(store.graph, keys, store.catalog, store.log))
    registry.register(TemporalIndex(store.log))
    registry.register(FactStoreIndex(store.log))
    registry.register(WorkingMemoryIndex(store.log))
    registry.register(HierarchicalIndex(store.log, store.bm25))
    if tokens is not None:
        registry.register(TokenMatchIndex(store.log, tokens.query_tokens, store.bm25.word_idf))
    return registry


def recall_config(settings: Settings) -> RecallConfig:
    """Recall's knobs from Settings."""
    return RecallConfig(
        ranking=RankingConfig(
            recency_half_life_days=settings.recency_half_life_days,
            importance_weight=settings.importance_weight,
            use_weight=settings.use_weight,
            context_propagation=settings.context_propagation,
            session_weight=settings.session_weight,
            reply_share=settings.reply_share,
        ),
        weights=MappingProxyType(dict(settings.recall_weights)),
        token_budget=settings.recall_token_budget,
    )


def build_service(settings: Settings, *, embedding: EmbeddingModel | None = None) -> MemoryService:
    """Open the stores under ``settings.data_dir``, repair interrupted writes, wire everything.

    A data directory that cannot be written is opened to read only: no repair, no maintenance,
    no search log and no LLM extraction (they all write); every write raises ``ReadOnlyData``.

    Args:
        settings: The configuration.
        embedding: An embedding model already loaded (a service opened anew reuses it); by
            default, the one Settings name.

    Raises:
        DataDirLocked: another process owns the data directory.
        ReadOnlyData: it cannot be written, and holds no memories to read.
    """
    embedding = embedding or settings_embedding(settings)
    embedder, tokens = embedding.embedder, embedding.tokens
    sentences = SentenceCache()  # the write path's; every delete empties it
    store = MemoryStore(
        settings.data_dir, graph_buffer_pool_mb=settings.graph_buffer_pool_mb,
        vector_cache_rows=settings.vector_cache_rows, token_cache_tokens=settings.token_cache_tokens,
        forgotten=[sentences.forget], storage_uri=settings.storage_uri, storage_options=settings.storage_options,
        count_accesses=settings.count_accesses or settings.use_weight > 0,
    )  # fmt: skip
    if store.read_only:
        log.warning("the data directory %s cannot be written to: serving reads only until it can",
                    settings.data_dir)  # fmt: skip
    else:
        try:
            repaired = store.repair()
        except BaseException:  # the graph's process and the data directory's lock go with the store
            store.close()
            raise
        if repaired:
            log.warning("repaired %d interrupted write(s)", repaired)
        store.maintain_if_fragmented()
    ingestor = Ingestor(
        store, embedder.embed, embed_with_tokens=tokens.embed_with_tokens if tokens is not None else None,
        sentences=sentences,
    )
    llm_setup = build_llm(settings, writable=not store.read_only)
    client = llm_setup.client if llm_setup is not None else None
    extraction = None
    if llm_setup is not None and not store.read_only:
        extraction = BackgroundExtraction(
            ingestor, store.log.get, LLMFactExtractor(llm_setup.extraction).extract,
            settings.data_dir / "extraction.json", every=settings.llm_extraction_every,
            max_calls=settings.llm_max_calls_per_remember,
        )  # fmt: skip
    deferred = None
    # On a shared log a write is acknowledged once in the log, not in this server's inbox (a machine
    # that dies would take the inbox with it): remember stores before it answers.
    if settings.remember_in_background and not store.read_only and not store.log.shared:
        listener = (lambda user, session, stored: extraction.note(  # type: ignore[union-attr]
            user, session, [r.id for r in stored if r.kind == "message"])) if extraction is not None else None
        deferred = DeferredIngest(store, ingestor, Inbox(settings.data_dir / "inbox"), stored=listener)
    registry = build_registry(store, tokens, deferred)
    llm = llm_parts(settings, client)
    recall_reranker: Reranker | None = None
    if settings.recall_rerank != "off":
        recall_reranker = llm.reranker if settings.recall_rerank == "llm" else cross_encoder(settings)
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mnemoplan-step")
    recall = RecallPipeline(
        registry=registry,
        analyzer=QueryAnalyzer(store.catalog),
        executor=PlanExecutor(registry, pool),
        records=WithWaiting(store.log, deferred) if deferred is not None else store.log,
        embed_query=embedder.embed_query,
        config=recall_config(settings),
        reranker=recall_reranker,
        rerank_deadline_s=settings.recall_rerank_deadline_s,
        model_ready=embedder.ready,
        # The search vectors, which its model was fitted on (a held user's, from memory).
        confidence=ConfidenceScorer(embedder.embed_query, partial(store.log.vectors, column="vector"),
                                    ready=embedder.ready,
                                    cosine_calibrated=settings.embedding_model in CALIBRATED_MODELS),
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
    if llm.reranker is None:  # deep search's default only: recall's choice was made above
        llm = replace(llm, reranker=token_reranker(settings, tokens, store.bm25, registry))
    deep = DeepSearch(recall, deep_config(settings), llm)
    # At start-up, not in the first query or message that names a date; but once the service is
    # built, not within the build: dateparser's warm-up (compiling its time-zone patterns) was most
    # of the build, and a first call need not wait for it.
    threading.Thread(target=warm_up_dates, name="mnemoplan-dates", daemon=True).start()
    service = MemoryService(
        deferred=deferred,
        store=store,
        embedder=embedder,
        registry=registry,
        recall=recall,
        deep=deep,
        limits=limits,
        default_user_id=settings.default_user_id,
        ingestor=ingestor,
        search_log=None if store.read_only else SearchLog(settings.data_dir / "searches"),
        extraction=extraction,
    )
    if llm_setup is not None:  # extraction first: a run under way must not find its client closed
        service.on_close.append(lambda: (extraction.close() if extraction is not None else None, llm_setup.close()))
    return service


def open_tokens(settings: Settings) -> TokenStore:
    """The HTTP server's tokens: in the data directory, or in the shared log when there is one."""
    if not settings.shared_storage:
        return TokenStore(settings.data_dir)
    assert settings.storage_uri is not None
    tables = LogTables(settings.storage_uri, storage_options=settings.storage_options)
    return TokenStore(settings.data_dir, TokenTable(tables))


def settings_embedding(settings: Settings) -> EmbeddingModel:
    """The embedding model Settings name (it loads in the background)."""
    return embedding_model(
        settings.embedding_model,
        batch_size=settings.embedding_batch_size,
        threads=settings.embedding_threads,
        precision=settings.embedding_precision,
        runtime=settings.embedding_runtime,
        cache_dir=settings.model_cache_dir,
    )


# --- the LLM (issue 41): providers, the call log, caps -----------------------------------------


@dataclass
class LLMSetup:
    """The LLM clients of a service and the log of their requests.

    Attributes:
        client: Planning, judging, expanding and reranking.
        extraction: remember's extraction: ``client``, or one for the smaller model named.
        calls: Where every request is recorded.
    """

    client: LLMClient
    extraction: LLMClient
    calls: LLMCallLog | MemoryRecorder

    def close(self) -> None:
        """Close the clients' connection pools."""
        self.client.close()
        if self.extraction is not self.client:
            self.extraction.close()


def build_llm(settings: Settings, *, writable: bool = True) -> LLMSetup | None:
    """The LLM clients Settings configure (None without an LLM): one provider, its model, and a
    second model for extraction when one is named; every request recorded under
    ``<data_dir>/llm_calls`` (in memory only when the directory cannot be written) and counted
    against one daily cap."""
    provider = settings.llm_in_use
    if provider is None:
        return None
    calls: LLMCallLog | MemoryRecorder = LLMCallLog(settings.data_dir / "llm_calls") if writable else MemoryRecorder()
    daily = DailyCap(settings.llm_max_calls_per_day, calls.sent_today() if isinstance(calls, LLMCallLog) else 0)
    client = LLMClient(
        provider=provider, api_key=settings.llm_key, model=settings.llm_model_in_use,
        base_url=settings.llm_base_url_in_use, timeout_s=settings.llm_timeout_s, max_retries=settings.llm_max_retries,
        price_per_mtok=settings.llm_price_per_mtok, structured=settings.llm_structured_output, recorder=calls,
        daily_cap=daily,
    )  # fmt: skip
    named = settings.llm_extraction_model
    extraction = client.with_model(named) if named and named != client.model else client
    return LLMSetup(client=client, extraction=extraction, calls=calls)


def llm_client(settings: Settings) -> LLMClient | None:
    """The one LLM client the planning parts share, when an LLM is configured (its requests kept
    in memory only: ``build_llm`` is what a service uses)."""
    setup = build_llm(settings, writable=False)
    return setup.client if setup is not None else None


# -----------------------------------------------------------------------------------------------


def deep_config(settings: Settings) -> DeepConfig:
    """Deep search's knobs from Settings."""
    return DeepConfig(
        max_rounds=settings.deep_max_rounds,
        weights=MappingProxyType(dict(settings.deep_weights)),
        recency_weight=settings.deep_recency_weight,
        recency_half_life_days=settings.deep_recency_half_life_days,
        rerank_deadline_s=settings.deep_rerank_deadline_s,
        deadline_s=settings.deep_deadline_s,
        max_llm_calls=settings.llm_max_calls_per_search,
    )


def cross_encoder(settings: Settings) -> CrossEncoderReranker | None:
    """The local cross-encoder reranker, when a model path is configured."""
    return CrossEncoderReranker(settings.reranker_path) if settings.reranker_path else None


def token_reranker(
    settings: Settings, tokens: TokenEncoder | None, bm25: BM25Index, registry: IndexRegistry
) -> LateInteractionReranker | None:
    """Deep search's reranker without an LLM or a cross-encoder: token-level matching with the
    embedding model, when it is switched on and the model can give token vectors. Where the
    ``token_match`` index already matched every memory of the user, deep search skips it."""
    if settings.deep_token_rerank <= 0 or tokens is None:
        return None
    index = registry.get("token_match") if "token_match" in registry.names else None
    complete = index.complete if isinstance(index, TokenMatchIndex) else None
    return LateInteractionReranker(tokens.token_vectors, bm25.word_idf, weight=settings.deep_token_rerank,
                                   complete=complete)  # fmt: skip


def llm_parts(settings: Settings, client: LLMClient | None) -> LLMParts:
    """The LLM-backed planner, evaluator, replanner, reranker and query expander, when an API key is configured.

    Without a key every part is None and deep search runs on its rules; a configured local
    cross-encoder still reranks.
    """
    if client is None:
        return LLMParts(reranker=cross_encoder(settings))
    reranker = LLMReranker(client, max_calls=settings.llm_max_calls_per_search) if settings.llm_rerank \
        else cross_encoder(settings)  # fmt: skip
    return LLMParts(planner=LLMPlanner(client), evaluator=LLMEvaluator(client), replanner=LLMReplanner(client),
                    reranker=reranker, expander=LLMExpander(client) if settings.llm_expand else None)  # fmt: skip
