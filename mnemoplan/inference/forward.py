"""The embedding model's forward pass, run from its transformer directly: pooled embeddings and
contextual token vectors, for the plain Transformer -> mean Pooling -> Normalize pipeline
(MiniLM's). ``embedder`` decides when to use it; this module only computes."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SMALL_BATCH = 8  # texts embedded on one thread (a message's sentences, a query)
# Texts per pass for token vectors. A rerank's passages vary in length, and small batches of
# length-sorted texts pad less, so they run faster than one batch.
TOKEN_BATCH = 16


@dataclass(frozen=True)
class TokenVectors:
    """One text's tokens as the model sees them: unit-length contextual vectors (special
    tokens dropped), and for each token the character span of the word it belongs to."""

    vectors: np.ndarray
    words: list[tuple[int, int]]


def native_bf16(torch: Any) -> bool:
    """True when the CPU has bfloat16 arithmetic (AVX512-BF16 or AMX)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in probes)


_PLAIN_MODULES = [f"sentence_transformers.models.{name}" for name in ("Transformer", "Pooling", "Normalize")]


def plain_mean_pooling(path: str) -> int | None:
    """The maximum sequence length of a sentence-transformers model directory that is a plain
    Transformer -> mean Pooling -> Normalize pipeline (MiniLM's), read from its config files;
    None for any other model, or when the files do not say.

    Such a model runs without sentence-transformers: importing it (scikit-learn, SciPy and
    more) was a large part of the model's load, for code the direct forward pass never calls.
    """
    root = Path(path)
    try:
        modules = json.loads((root / "modules.json").read_text(encoding="utf-8"))
        if [m.get("type") for m in modules] != _PLAIN_MODULES or modules[0].get("path", "") != "":
            return None
        pooling = json.loads((root / modules[1]["path"] / "config.json").read_text(encoding="utf-8"))
        settings = json.loads((root / "sentence_bert_config.json").read_text(encoding="utf-8"))
        transformer = json.loads((root / "config.json").read_text(encoding="utf-8"))
        st_config = root / "config_sentence_transformers.json"
        prompted = st_config.is_file() and json.loads(st_config.read_text(encoding="utf-8")).get("default_prompt_name")
    except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None
    if prompted:
        return None  # encode() would put the default prompt before every text
    if not isinstance(transformer, dict) or transformer.get("is_encoder_decoder"):
        return None  # sentence-transformers runs such a model's encoder alone; AutoModel would not
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode") and v}
    unread = set(settings) - {"max_seq_length", "do_lower_case"}  # e.g. model_args the direct path ignores
    if modes != {"pooling_mode_mean_tokens"} or settings.get("do_lower_case") or unread:
        return None
    length = settings.get("max_seq_length")
    return int(length) if isinstance(length, int) and length > 0 else None


def st_plain_parts(model: Any) -> tuple[Any, Any, int] | None:
    """Tokenizer, transformer and maximum length of a loaded sentence-transformers model that is
    the plain Transformer -> mean Pooling -> Normalize pipeline; None for any other, including one
    with more modules (the direct pass would skip them), a default prompt (``encode`` would add
    it), or a Transformer that lowercases its input (sentence-transformers 5 does that outside
    the tokenizer, where the direct pass would not)."""
    names = [type(module).__name__ for module in model]
    pooling = model[1] if len(names) > 1 else None
    mode = getattr(pooling, "pooling_mode", None) or getattr(pooling, "get_pooling_mode_str", lambda: "")()
    if names != ["Transformer", "Pooling", "Normalize"] or mode != "mean" or getattr(model[0], "do_lower_case", False):
        return None
    if getattr(model, "default_prompt_name", None):
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


def _mean_pooled(enc: Any, hidden: Any) -> np.ndarray:
    """Each text's mean over its real (unpadded) tokens' last hidden states."""
    mask = enc["attention_mask"].unsqueeze(-1).float()
    return ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)).numpy()


def direct_forward(tokenizer: Any, bert: Any, max_length: int, torch: Any, batch_size: int) -> Any:
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
            out[idx] = _mean_pooled(enc, hidden)
        return out

    return forward


def token_forward(tokenizer: Any, bert: Any, max_length: int, torch: Any, batch_size: int) -> Any:
    """The last hidden layer per token, with each token's word span, and each text's mean-pooled
    embedding from the same pass; needs a fast tokenizer (it alone reports offsets). Padded to a
    multiple of 16 tokens as ``direct_forward`` is: every new tensor shape keeps its own compiled
    kernels (one shape per length made the process grow search after search)."""

    def forward(texts: list[str], project: np.ndarray | None = None) -> tuple[np.ndarray, list[TokenVectors]]:
        """``project``, a (hidden size, d) matrix, maps the token vectors to d dimensions here, in
        torch, on the model's thread: done in numpy afterwards, OpenBLAS's worker threads spun on
        and slowed the next pass (bulk ingest markedly: bench/README.md)."""
        means = np.zeros((len(texts), bert.config.hidden_size), dtype=np.float32)
        out: list[TokenVectors | None] = [None] * len(texts)
        projection = torch.from_numpy(np.ascontiguousarray(project, dtype=np.float32)) if project is not None else None
        passes = _passes(tokenizer, bert, max_length, torch, batch_size, texts, offsets=True, pad_single=True)
        for idx, enc, offsets, hidden in passes:
            means[idx] = _mean_pooled(enc, hidden)
            if projection is not None:
                with torch.autocast("cpu", enabled=False):  # float32: bfloat16 would add its rounding to int8's
                    hidden = hidden @ projection
            spans_of = offsets.tolist()  # one conversion: indexing the tensor per token cost more than the pass's tail
            for row, i in enumerate(idx):
                words = enc.word_ids(row)
                keep = [t for t, w in enumerate(words) if w is not None]
                spans: dict[int, tuple[int, int]] = {}
                for t in keep:
                    a, b = spans_of[row][t]
                    lo, hi = spans.get(words[t], (a, b))
                    spans[words[t]] = (min(lo, a), max(hi, b))
                out[i] = TokenVectors(normalise(hidden[row, keep].numpy()), [spans[words[t]] for t in keep])
        return normalise(means), out

    return forward


def normalise(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


class TorchForward:
    """The model run by torch: from its transformer directly when it is the plain mean-pooling
    pipeline (``plain_mean_pooling``), else through sentence-transformers' ``encode``.

    Every call must come from one thread (``SentenceEmbedder`` runs them on its own): called from
    many threads, torch gives each its own OpenMP team, and their spinning workers slow all of them
    down on a 2-core machine (bench/README.md).

    Args:
        path: The model directory.
        threads: Torch intra-op threads (0 keeps torch's default).
        precision: ``fp32``, ``bf16``, or ``auto`` (bf16 where the CPU computes it natively).
        batch_size: Texts per forward pass.
    """

    name = "torch"

    def __init__(self, path: str, *, threads: int, precision: str, batch_size: int) -> None:
        import torch
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # a "Loading weights" bar on stderr, every start
        if threads:
            torch.set_num_threads(threads)
        self._torch = torch
        self._batch_threads = torch.get_num_threads()
        self._batch_size = batch_size
        self._autocast: Any = None
        if precision == "bf16" or (precision == "auto" and native_bf16(torch)):
            self._autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
        self._direct: Any = None
        self._tokens: Any = None
        self._tokens_batched: Any = None
        self.dim = 384
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
            self.dim = int(model.get_embedding_dimension() or self.dim)
            parts = st_plain_parts(model)
        if parts is not None:
            self._direct = direct_forward(*parts, torch, batch_size)
            if getattr(parts[0], "is_fast", False):
                self._tokens = token_forward(*parts, torch, min(batch_size, TOKEN_BATCH))
                self._tokens_batched = token_forward(*parts, torch, batch_size)
        self._model = model

    @property
    def has_tokens(self) -> bool:
        """Whether this model gives token vectors (a plain pipeline with a fast tokenizer)."""
        return self._tokens is not None

    @contextlib.contextmanager
    def _settings(self, n_texts: int) -> Any:
        """Threads and precision for a pass over ``n_texts`` texts.

        A query or a single message runs on one core: other signals of the same recall run on
        the other one, and a two-thread forward pass stalls whenever a core is taken. Small
        batches stay on one thread too: switching torch's thread count between calls is what
        costs, in the slowest calls most (bench/README.md).
        """
        want = 1 if n_texts <= SMALL_BATCH else self._batch_threads
        if self._torch.get_num_threads() != want:
            self._torch.set_num_threads(want)
        with self._autocast() if self._autocast else contextlib.nullcontext():
            yield

    def embed(self, texts: list[str]) -> np.ndarray:
        """Each text's embedding."""
        with self._settings(len(texts)):
            if self._direct is not None:
                return self._direct(texts)
            return self._model.encode(texts, batch_size=self._batch_size, normalize_embeddings=True,
                                      convert_to_numpy=True, show_progress_bar=False)  # fmt: skip

    def tokens(self, texts: list[str], project: np.ndarray | None = None, *,
               batched: bool = False) -> tuple[np.ndarray, list[TokenVectors]]:  # fmt: skip
        """Each text's normalised embedding and token vectors (``has_tokens`` must hold);
        ``batched``: ingest's large batches, else a query's or a rerank's small ones."""
        with self._settings(len(texts)):
            return (self._tokens_batched if batched else self._tokens)(texts, project)
