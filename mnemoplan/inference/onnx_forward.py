"""The embedding model's forward pass through ONNX Runtime: the same weights and the same vectors
as the torch pass (cosine >= 0.99999), in about half its time on a CPU, without importing torch.

The ONNX graph is exported once from the model's own weights (``onnx_export``) and cached; this
module only loads it and computes: the fast tokenizer from the model's ``tokenizer.json`` (the
``tokenizers`` package, which the transformers library runs underneath), the session, mean pooling
and token vectors exactly as ``forward.py`` computes them from torch. The token match's integer
product runs here too (``integer_product_session``): this module is where ONNX Runtime is run.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np

from mnemoplan.inference.forward import TOKEN_BATCH, TokenVectors, normalise
from mnemoplan.runtime import usable_cpus

log = logging.getLogger(__name__)


def onnx_threads() -> int:
    """Threads of a forward pass by default: two where the process may use two cores or more
    (measured: bench/README.md), else one."""
    return min(2, usable_cpus())


def session_options(threads: int, spin: bool = False) -> Any:
    """ONNX Runtime settings for one session: ``threads`` intra-op threads that sleep when idle.

    Spinning threads (ONNX Runtime's default) hold a core after every pass; on a two-core machine
    they starved the other work of a recall, and the other session (bench/README.md).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.log_severity_level = 3  # errors only: its warnings go to stderr, which stdio MCP shares
    return options


INTEGER_PRODUCT_OFFSET = 128  # what ``integer_product_session`` takes back from its uint8 codes


@functools.cache
def integer_product_session() -> Any:
    """A session of one product (``int8_product.cosines``): uint8 codes (offset by
    ``INTEGER_PRODUCT_OFFSET``) times a query's two int8 parts, ``high * 128 + low`` added in
    int32 (exact), then scaled per query token by ``scale`` and per code by ``scales``. Built
    once (~5 ms). One thread: a server runs many searches at once, and the product is bound by
    reading the codes, not by arithmetic."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["codes", "high", "offset"], ["highs"]),
         helper.make_node("MatMulInteger", ["codes", "low", "offset"], ["lows"]),
         helper.make_node("Mul", ["highs", "step"], ["shifted"]),
         helper.make_node("Add", ["shifted", "lows"], ["products"]),
         helper.make_node("Cast", ["products"], ["floats"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["floats", "scale"], ["per_query"]),
         helper.make_node("Mul", ["per_query", "scales"], ["cosines"])],
        "int8_product",
        [value("codes", TensorProto.UINT8, [None, None]), value("high", TensorProto.INT8, [None, None]),
         value("low", TensorProto.INT8, [None, None]), value("scale", TensorProto.FLOAT, [None]),
         value("scales", TensorProto.FLOAT, [None, 1])],
        [value("cosines", TensorProto.FLOAT, [None, None])],
        initializer=[helper.make_tensor("offset", TensorProto.UINT8, [], [INTEGER_PRODUCT_OFFSET]),
                     helper.make_tensor("step", TensorProto.INT32, [], [128])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime 1.20 reads
    return ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])


class OnnxForward:
    """Mean-pooled embeddings and token vectors of a plain Transformer -> mean Pooling -> Normalize
    model (MiniLM's), from its ONNX export.

    Args:
        onnx_path: The exported graph (``onnx_export.cached_export``).
        model_dir: The model directory, for its ``tokenizer.json``.
        max_length: The model's maximum sequence length (longer texts are cut, as sentence-transformers does).
        threads: Intra-op threads of each pass.
        batch_size: Texts per pass.

    Raises:
        ImportError: onnxruntime or tokenizers is not installed.
        OSError, RuntimeError: the files cannot be read or the graph loaded.
    """

    name = "onnxruntime"
    has_tokens = True
    token_budget = 1024  # padded tokens per pass (bench/README.md)

    def __init__(self, onnx_path: Path, model_dir: Path, max_length: int, *, threads: int, batch_size: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.no_padding()  # the file pads every text to a fixed length; each batch is padded here
        tokenizer.enable_truncation(max_length)
        self._tokenizer = tokenizer
        self._batch_size = batch_size
        self._session = ort.InferenceSession(str(onnx_path), session_options(threads),
                                             providers=["CPUExecutionProvider"])  # fmt: skip
        self.dim = int(self._session.get_outputs()[0].shape[-1])

    def _passes(self, texts: list[str], batch_size: int | None = None) -> Any:
        """Passes over ``texts`` sorted by length, each of at most ``batch_size`` texts and
        ``self.token_budget`` tokens once padded to its longest: short texts go many to a pass (a
        pass has a cost of its own), long ones few (padding and attention grow with the longest).
        Yields each batch's positions in ``texts``, its encodings, its attention mask and its last
        hidden layer."""
        encoded = self._tokenizer.encode_batch(texts)
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))
        size = batch_size or self._batch_size
        start = 0
        while start < len(order):
            end = start + 1
            while (end < len(order) and end - start < size
                   and (end - start + 1) * len(encoded[order[end]].ids) <= self.token_budget):  # fmt: skip
                end += 1
            idx = order[start:end]
            start = end
            encodings = [encoded[i] for i in idx]
            width = max(len(e.ids) for e in encodings)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, enc in enumerate(encodings):
                ids[row, : len(enc.ids)] = enc.ids
                mask[row, : len(enc.ids)] = 1
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            yield idx, encodings, mask, self._session.run(None, feed)[0]

    @staticmethod
    def _mean_pooled(mask: np.ndarray, hidden: np.ndarray) -> np.ndarray:
        weights = mask[..., None].astype(np.float32)
        return (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1.0)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Each text's mean-pooled embedding (not normalised)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for idx, _, mask, hidden in self._passes(texts):
            out[idx] = self._mean_pooled(mask, hidden)
        return out

    def tokens(self, texts: list[str], project: np.ndarray | None = None, *,
               batched: bool = False) -> tuple[np.ndarray, list[TokenVectors]]:  # fmt: skip
        """Each text's normalised embedding and its token vectors (special tokens dropped, each
        with the span of the word it belongs to), mapped by ``project`` when given and renormalised.
        ``batched``: ingest's large batches; else a rerank's, in small length-sorted batches that pad less."""
        means = np.zeros((len(texts), self.dim), dtype=np.float32)
        out: list[TokenVectors | None] = [None] * len(texts)
        for idx, encodings, mask, hidden in self._passes(texts, None if batched else TOKEN_BATCH):
            means[idx] = self._mean_pooled(mask, hidden)
            for row, (i, enc) in enumerate(zip(idx, encodings, strict=True)):
                words, offsets = enc.word_ids, enc.offsets  # each access builds a new list
                keep = [t for t, w in enumerate(words) if w is not None]
                spans: dict[int, tuple[int, int]] = {}
                for t in keep:
                    a, b = offsets[t]
                    lo, hi = spans.get(words[t], (a, b))
                    spans[words[t]] = (min(lo, a), max(hi, b))
                vectors = hidden[row, keep]
                if project is not None:
                    vectors = vectors @ project
                out[i] = TokenVectors(normalise(vectors), [spans[words[t]] for t in keep])
        return normalise(means), out  # type: ignore[return-value]
