"""Pure functions over token vectors: the fixed projection they are stored and matched in, and
the weight of each of a query's tokens.

Projection: from the model's width to ``DIM`` by a fixed +-1 matrix, derived from a hash, so it
never changes between versions or machines (every stored memory depends on it; the log packs
the projected vectors, see ``storage.log.token_cache``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import numpy as np

DIM = 128


@functools.cache
def projection(width: int, dim: int = DIM) -> np.ndarray:
    """The fixed ``width`` x ``dim`` projection: signs read from SHAKE-256 of a constant, over sqrt(dim)."""
    digest = hashlib.shake_256(b"mnemoplan token projection v1").digest(width * dim // 8 + 1)
    bits = np.unpackbits(np.frombuffer(digest, dtype=np.uint8))[: width * dim]
    return ((bits.astype(np.float32) * 2.0 - 1.0) / np.float32(np.sqrt(dim))).reshape(width, dim)


def project(vectors: np.ndarray) -> np.ndarray:
    """Token vectors (n, width) projected to unit vectors (n, DIM), float32."""
    if len(vectors) == 0:
        return np.zeros((0, DIM), dtype=np.float32)
    out = np.asarray(vectors, dtype=np.float32) @ projection(vectors.shape[1])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (out / norms).astype(np.float32, copy=False)


def token_weights(
    text: str, words: list[tuple[int, int]], idf: Callable[[list[str]], list[float]]
) -> np.ndarray:
    """Weights summing to 1 for a query's tokens: each by its word's rarity in the user's memory
    (``idf`` of the words; 0 for a stop word), so the words that carry the question decide;
    all alike when every word is a stop word."""
    spans = sorted(set(words))
    weight = dict(zip(spans, idf([text[a:b] for a, b in spans]), strict=True))
    out = np.array([weight[span] for span in words], dtype=np.float64)
    if out.sum() <= 0:
        out = np.ones(len(words), dtype=np.float64)
    return out / max(float(out.sum()), 1e-12)
