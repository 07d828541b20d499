"""Settings, read from ``MNEMOPLAN_*`` environment variables (and ``ANTHROPIC_API_KEY``).

Only the server's entry points build a ``Settings``; everything below them receives
plain constructor arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from platformdirs import user_cache_dir, user_data_dir
from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """The platform's per-user data directory for mnemoplan.

    On Linux ``$XDG_DATA_HOME/mnemoplan`` or ``~/.local/share/mnemoplan``, as before platformdirs
    chose it; ``~/Library/Application Support/mnemoplan`` on macOS, ``%LOCALAPPDATA%\\mnemoplan``
    on Windows. ``$MNEMOPLAN_DATA_DIR`` overrides it (a Settings field).
    """
    return Path(user_data_dir("mnemoplan", appauthor=False))


def default_model_cache_dir() -> Path:
    """Where the embedding model's ONNX export is kept: the platform's per-user cache directory
    (``~/.cache/mnemoplan/models`` on Linux). It can be deleted at any time: it is made again."""
    return Path(user_cache_dir("mnemoplan", appauthor=False)) / "models"


class Settings(BaseSettings):
    """Effective configuration. Every field can be set as ``MNEMOPLAN_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="MNEMOPLAN_", extra="ignore")

    # Storage and identity
    data_dir: Path = Field(default_factory=default_data_dir, description="Where all stores live (with "
                           "storage_uri: only what can be rebuilt, the indexes and caches of this machine).")
    storage_uri: str | None = Field(
        None, description="Where the log lives when not in data_dir: an object-storage URI (s3://bucket/prefix), "
        "shared by any number of servers (replicas). The log and what must outlive a machine (users' keys, "
        "tokens) go there; each server's data_dir holds its own indexes, rebuilt from the log as needed.",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict, description="LanceDB's storage_options for storage_uri, as JSON: endpoint, region, "
        "allow_http, aws_access_key_id, aws_secret_access_key (the AWS_* variables work too).",
    )
    default_user_id: str = Field("default", description="User for calls that name none.")

    # Limits
    max_text_chars: int = Field(32_000, ge=1, description="Longest text one memory may hold.")
    max_query_chars: int = Field(4_000, ge=1, description="Longest query.")
    max_messages_per_call: int = Field(1_000, ge=1, description="Most messages one remember call may carry.")
    max_forget_ids: int = Field(10_000, ge=1, description="Most ids one forget call may name.")
    recall_default_limit: int = Field(10, ge=1, le=50)
    recall_max_limit: int = Field(50, ge=1, le=200)
    deep_max_results: int = Field(30, ge=1, le=100, description="Cap on deep_memory_search max_results.")

    # Embeddings
    embedding_model: str = Field(
        "all-MiniLM-L6-v2",
        description="'all-MiniLM-L6-v2' (bundled, offline), a local sentence-transformers path, "
        "or 'hash' (a tiny deterministic embedder for plumbing tests).",
    )
    embedding_batch_size: int = Field(
        0, ge=0, le=1024, description="Most texts per forward pass; 0: the runtime's measured best (ONNX Runtime 64, "
        "a pass also capped at 1,024 padded tokens; torch 16: small batches pad less).",
    )
    embedding_threads: int = Field(
        0, ge=0, description="Threads of one forward pass; 0: two where two cores are free (ONNX Runtime), "
        "torch's default under torch.",
    )
    embedding_runtime: Literal["auto", "onnx", "torch"] = Field(
        "auto", description="auto: ONNX Runtime for the bundled model (and any plain mean-pooling model), "
        "exported once from its weights into model_cache_dir; torch for other models or if the export fails.",
    )
    model_cache_dir: Path = Field(
        default_factory=default_model_cache_dir, description="Where the ONNX export of the embedding model is kept.")
    embedding_precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Under torch: bfloat16 where the CPU computes it natively (auto), else fp32."
    )

    remember_in_background: bool = Field(
        True, description="remember answers once the messages are durably accepted; embedding, facts, summaries "
        "and indexing follow on a worker thread (reads wait for them). False: all of it before remember answers.",
    )
    graph_buffer_pool_mb: int = Field(
        1024, ge=64, description="Kùzu's page cache in MB (a limit: memory is taken as the graph is used)."
    )
    vector_cache_rows: int = Field(
        200_000, ge=0, description="Users with up to this many records get exact vector search from memory "
        "(1.5 KB a record; two such users at most); larger ones use LanceDB's ANN index.",
    )
    token_cache_tokens: int = Field(
        2_000_000, ge=0, description="Users with up to this many stored token vectors have them held in memory for "
        "token_match (130 bytes each; two such users at most); deep search reads larger ones from the log, "
        "recall skips them (0: none held).",
    )  # fmt: skip
    # Recall
    recall_token_budget: int = Field(1_200, ge=50, description="Token budget of recall's context string.")
    recall_weights: dict[str, float] = Field(
        default_factory=dict, description="Overrides of the fusion weights, e.g. {\"bm25\": 0.5}."
    )
    recency_half_life_days: float = Field(0.0, ge=0.0, description="0 disables the recency prior in recall.")
    importance_weight: float = Field(0.0, ge=0.0, description="Weight of stored importance in recall (0: off).")
    context_propagation: float = Field(
        0.5, ge=0.0, le=1.0, description="Share of a strong hit's score its neighbouring turns inherit (0: off)."
    )
    session_weight: float = Field(0.2, ge=0.0, description="Weight of the session prior in recall (0: off).")
    reply_share: float = Field(
        0.2, ge=0.0, le=1.0, description="Share of a question turn's score that passes to the reply after it, "
        "in recall and deep search; a speaker named user or human asks an assistant and keeps it (0: off).",
    )  # fmt: skip
    use_weight: float = Field(
        0.0, ge=0.0, description="Weight of past use (access counts, log-scaled, saturating at 100) in recall "
        "(0: off). Above 0, searches count what they return (count_accesses).",
    )  # fmt: skip
    count_accesses: bool = Field(
        False, description="Count how often searches return each memory (shown as access_count), also with the "
        "use weight off. Upkeep writes the counts into the log's rows, which a later forget rewrites.",
    )  # fmt: skip
    reranker_path: Path | None = Field(None, description="Local cross-encoder model directory for reranking.")
    recall_rerank: Literal["off", "llm", "cross_encoder"] = Field(
        "off", description="Rerank recall's results (costs latency): with the LLM, or the local cross-encoder."
    )
    recall_rerank_deadline_s: float = Field(2.0, gt=0, description="Past this, recall keeps its own order.")

    # Deep search
    deep_max_rounds: int = Field(3, ge=1, le=10, description="Plan -> execute -> judge rounds at most.")
    deep_weights: dict[str, float] = Field(
        default_factory=lambda: {"semantic": 0.5, "bm25": 0.5},
        description="Fusion weights of deep search by index (the best measured on LoCoMo: bench/README.md).",
    )
    deep_recency_weight: float = Field(0.10, ge=0.0, description="Weight of the recency prior in deep search.")
    deep_recency_half_life_days: float = Field(90.0, gt=0)
    deep_rerank_deadline_s: float = Field(8.0, gt=0, description="Past this, deep search keeps its own order.")
    deep_deadline_s: float = Field(
        15.0, gt=0, description="Time one deep search may take, LLM calls included: each LLM call waits at "
        "most what is left, and past it the search answers with what it has (no LLM step, no new round).",
    )  # fmt: skip
    deep_token_rerank: float = Field(
        0.35, ge=0.0,
        description="Weight of deep search's token-level re-scoring with the embedding model, used when "
        "neither an LLM nor a cross-encoder reranks and the token_match index could not match every memory "
        "of the user (a log written, wholly or partly, before token vectors; 0: off).",
    )  # fmt: skip

    # LLM (optional)
    anthropic_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("MNEMOPLAN_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY")
    )
    anthropic_base_url: str | None = Field(
        None, validation_alias=AliasChoices("MNEMOPLAN_ANTHROPIC_BASE_URL", "ANTHROPIC_BASE_URL")
    )
    llm_model: str | None = Field(
        None, description="Model for extraction, planning and reranking (default: claude-haiku-4-5 on Anthropic, "
        "gpt-4o-mini on OpenAI; a local server's must be named).",
    )
    llm_timeout_s: float = Field(20.0, gt=0)
    llm_rerank: bool = Field(True, description="Use the LLM to rerank deep search results when configured.")
    llm_expand: bool = Field(
        True, description="Deep search also searches an LLM keyword rewrite and a hypothetical answer (HyDE)."
    )
    llm_extraction_every: int = Field(10, ge=1, description="Extract facts every N turns of a session.")

    # LLM providers, structured output and caps (issue 41) ----------------------------------
    llm_provider: Literal["anthropic", "openai", "none"] | None = Field(
        None, description="anthropic, openai (any OpenAI-compatible server: Ollama, vLLM, llama.cpp, LM Studio, "
        "a gateway) or none; unset: anthropic when ANTHROPIC_API_KEY is set, else none.",
    )
    llm_base_url: str | None = Field(
        None, description="The API's root, e.g. http://localhost:11434/v1 (Ollama); the provider's own if unset."
    )
    llm_api_key: SecretStr | None = Field(
        None, description="The provider's key (Anthropic: ANTHROPIC_API_KEY also works; OpenAI: OPENAI_API_KEY; "
        "a local server needs none).",
    )
    openai_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("OPENAI_API_KEY"))
    llm_extraction_model: str | None = Field(
        None, description="A smaller model for remember's extraction, on the same server (default: llm_model)."
    )
    llm_structured_output: Literal["auto", "json_object", "prompt"] = Field(
        "auto", description="auto: the server's JSON schema mode, else its JSON mode, falling back when it rejects "
        "them; json_object: JSON mode only; prompt: only the schema in the prompt.",
    )
    llm_max_retries: int = Field(1, ge=0, le=5, description="Retries of an LLM request after a 429, a 5xx or a "
                                 "refused connection (within the caller's time budget).")  # fmt: skip
    llm_max_calls_per_remember: int = Field(
        8, ge=0, description="LLM requests one remember's extraction may send (0: no cap); over it the rest waits."
    )
    llm_max_calls_per_search: int = Field(
        20, ge=0, description="LLM requests one deep search (or recall's rerank) may send (0: no cap); over it the "
        "rules answer, with a warning.",
    )
    llm_max_calls_per_day: int = Field(0, ge=0, description="LLM requests a day, UTC (0: no cap).")
    llm_price_per_mtok: tuple[float, float] | None = Field(
        None, description="USD per million (input, output) tokens of a model the built-in table does not know, "
        "for the costs in mnemoplan stats, e.g. [0.15, 0.6].",
    )

    @model_validator(mode="after")
    def _llm_named(self) -> Settings:
        if self.llm_provider == "anthropic" and self.llm_key is None:
            raise ValueError("MNEMOPLAN_LLM_PROVIDER=anthropic needs ANTHROPIC_API_KEY or MNEMOPLAN_LLM_API_KEY")
        if self.llm_provider == "openai" and self.llm_base_url and not self.llm_model:
            raise ValueError("MNEMOPLAN_LLM_PROVIDER=openai with MNEMOPLAN_LLM_BASE_URL needs MNEMOPLAN_LLM_MODEL: "
                             "the name of a model that server serves (e.g. llama3.2:3b for Ollama)")
        return self

    @property
    def llm_in_use(self) -> Literal["anthropic", "openai"] | None:
        """The provider the LLM parts talk to; None without an LLM."""
        if self.llm_provider == "none":
            return None
        if self.llm_provider is not None:
            return self.llm_provider
        return "anthropic" if self.llm_key is not None else None

    @property
    def llm_key(self) -> str | None:
        """The API key of the provider in use (a blank one counts as none)."""
        keys = [self.llm_api_key]
        keys += [self.openai_api_key] if self.llm_provider == "openai" else [self.anthropic_api_key]
        return next((k.get_secret_value().strip() for k in keys if k is not None and k.get_secret_value().strip()),
                    None)  # fmt: skip

    @property
    def llm_model_in_use(self) -> str:
        """The model named, else the provider's default."""
        if self.llm_model:
            return self.llm_model
        return "gpt-4o-mini" if self.llm_in_use == "openai" else "claude-haiku-4-5"

    @property
    def llm_base_url_in_use(self) -> str | None:
        """The base URL named, else (Anthropic) ANTHROPIC_BASE_URL, else the SDK's default."""
        return self.llm_base_url or (self.anthropic_base_url if self.llm_in_use == "anthropic" else None)
    # -----------------------------------------------------------------------------------------

    # Server
    transport: Literal["stdio", "http"] = "stdio"
    http_host: str = "127.0.0.1"
    http_port: int = Field(8765, ge=1, le=65535)
    http_public_url: str | None = Field(
        None, description="The URL hosts reach the HTTP server at, e.g. https://memory.example.com "
        "(default http://host:port); named in the OAuth protected-resource metadata.",
    )
    http_issuer_url: str | None = Field(
        None, description="An external OAuth authorization server, for the protected-resource metadata "
        "(default: the server itself, which issues its own tokens: `mnemoplan token create`).",
    )
    http_allowed_hosts: list[str] = Field(
        default_factory=list, description="Host names the HTTP server may be reached by (the Host/Origin "
        "checks against DNS rebinding); on loopback, 127.0.0.1, localhost and [::1] are allowed anyway.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_file: Path | None = Field(None, description="Log here instead of stderr.")

    def public_dict(self) -> dict[str, object]:
        """The effective configuration with secrets masked, for ``mnemoplan config``."""
        data = self.model_dump(mode="json")
        for key in ("anthropic_api_key", "llm_api_key", "openai_api_key"):
            secret = getattr(self, key)
            data[key] = "set" if secret is not None and secret.get_secret_value().strip() else None
        data["llm_provider_in_use"] = self.llm_in_use
        data["llm_model_in_use"] = self.llm_model_in_use if self.llm_in_use else None
        data["storage_options"] = {k: "set" if "secret" in k or "token" in k or "key" in k else v
                                   for k, v in self.storage_options.items()}  # fmt: skip
        return data

    @property
    def shared_storage(self) -> bool:
        """True when the log is in object storage, which other servers may write too."""
        return bool(self.storage_uri) and "://" in str(self.storage_uri) and not str(self.storage_uri).startswith(
            "file://")

    @property
    def llm_enabled(self) -> bool:
        """True when an LLM is configured (``llm_in_use``)."""
        return self.llm_in_use is not None
