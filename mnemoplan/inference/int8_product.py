"""Query tokens against stored int8 token codes, without widening the codes to float.

numpy has no integer matrix product that uses the CPU's integer dot-product instructions, so the
token match widened a user's int8 codes to float32 on every query (a copy four times their size).
ONNX Runtime's ``MatMulInteger`` multiplies the codes as they are (as uint8: offset by
``INTEGER_PRODUCT_OFFSET``, which its zero point takes back).

The query stays exact to about 1e-4 of a cosine: each query token is split into two int8 parts
on one scale, ``q = s * (high + low / 128)``, each multiplied, and the two added in int32. One
part alone (plain int8) would add as much error as storing the codes in int8 did. (Adding them
by a float product with a (2q, q) matrix cost q² per stored token: a 200-token question took
more there than in the products.) Figures: bench/README.md, "Paused by the collector, and the
integer product".
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mnemoplan.inference.onnx_forward import integer_product_session


class Query(NamedTuple):
    """A query as the product takes it (``split_query``)."""

    high: np.ndarray  # (d, q) int8
    low: np.ndarray  # (d, q) int8
    scale: np.ndarray  # (q,) float32


def as_unsigned(codes: np.ndarray) -> np.ndarray:
    """int8 codes as the product takes them: uint8, offset by 128 (a copy; the sign bit flipped)."""
    return codes.view(np.uint8) ^ np.uint8(0x80)


def split_query(query: np.ndarray) -> Query:
    """A float query (q, d) as the product takes it: two int8 parts, (d, q) each, on one scale
    per query token: ``query = scale / 128 * (high * 128 + low)``."""
    query = np.asarray(query, dtype=np.float32)
    scale = np.abs(query).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    scaled = query / scale[:, None]
    high = np.round(scaled)
    low = np.round((scaled - high) * 128)  # |scaled - high| <= 0.5: within +-64
    return Query(np.ascontiguousarray(high.T.astype(np.int8)), np.ascontiguousarray(low.T.astype(np.int8)),
                 (scale / 128).astype(np.float32))  # fmt: skip


def cosines(codes: np.ndarray, scales: np.ndarray, query: Query) -> np.ndarray:
    """Each stored token's cosine with each query token, (tokens, q) float32.

    Args:
        codes: (tokens, d) uint8 codes (``as_unsigned``), C-contiguous.
        scales: (tokens,) float32 scale of each stored token.
        query: The query (``split_query``).
    """
    feed = {"codes": codes, "high": query.high, "low": query.low, "scale": query.scale,
            "scales": scales.reshape(-1, 1)}  # fmt: skip
    return integer_product_session().run(None, feed)[0]
