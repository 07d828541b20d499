"""Memories' token vectors, compact, and matched against a query's tokens (late interaction).

A sentence embedding is one average, so a question's "exercises" has to survive averaging to
meet a memory's "kickboxing". Matching token by token does not ask that: each query token finds
its best match among a memory's contextual token vectors. This module packs those vectors for
the log and holds each user's in memory for a scan cheap enough for every query.

Packing: only the tokens of words an index keeps (stop words and punctuation go), projected
from the model's width to ``DIM`` by a fixed +-1 matrix (derived from a hash, so it never
changes between versions or machines), stored as int8 with one scale per token: a tenth of
float16's size, for a small loss of R@10 (bench/README.md).

A long message's tokens are its passages' (``extract.passages``): each passage holds its own,
and the message holds only its passages' ids (``pack_parts``). It is scored from them, exactly
as if it held them all (a query token's best match in the message is its best in any passage),
and each token is stored, held and scanned once.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mnemoplan.inference import int8_product
from mnemoplan.inference.token_vectors import DIM, project
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.filters import mask
from mnemoplan.storage.log.schema import KIND_CODES
from mnemoplan.storage.log.user_cache import UserCache

_MAGIC = b"T1"
_PARTS = b"T2"  # a memory scored from other memories' tokens: their ids follow
_HEADER = struct.Struct("<2sHH")  # magic, tokens (or parts), dimensions (or 0)
_MAX_TOKENS = 65_535
# Tokens scored per product: at most CHUNK_TOKENS, and CHUNK_PRODUCTS cosines (~1 MB of them), so
# what a product writes stays in the core's cache; a long question's slices are shorter.
CHUNK_TOKENS = 8_192
CHUNK_PRODUCTS = 8_192 * 24
MIN_CHUNK_TOKENS = 1_024


def pack(vectors: np.ndarray) -> bytes:
    """Token vectors of one memory, projected and quantised, as stored in the log."""
    return pack_many([project(vectors)])[0]


def pack_many(memories: list[np.ndarray]) -> list[bytes]:
    """Many memories' token vectors, already projected (``project``, or ``projection`` applied
    by the model: see ``Ingestor``), quantised; no matrix product here."""
    memories = [m[:_MAX_TOKENS] for m in memories]
    unit = np.concatenate(memories).astype(np.float32, copy=False) if memories else np.zeros((0, DIM), np.float32)
    if unit.shape[1:] != (DIM,):
        raise ValueError(f"pack_many takes {DIM}-d projected token vectors, not {unit.shape[1:]}")
    scale = np.abs(unit).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    codes = np.round(unit / scale[:, None]).astype(np.int8)
    half = scale.astype(np.float16)
    out, start = [], 0
    for m in memories:
        end = start + len(m)
        out.append(_HEADER.pack(_MAGIC, len(m), DIM) + half[start:end].tobytes() + codes[start:end].tobytes())
        start = end
    return out


def pack_parts(ids: list[str]) -> bytes:
    """A memory whose tokens are those of other memories (a long message's, its passages'): their ids."""
    return _HEADER.pack(_PARTS, len(ids), 0) + b"".join(bytes.fromhex(rid) for rid in ids)


def parts_of(blob: bytes) -> list[str] | None:
    """The ids a ``pack_parts`` blob names; None for a blob of tokens."""
    magic, n, _ = _HEADER.unpack_from(blob)
    if magic != _PARTS:
        return None
    return [blob[_HEADER.size + 16 * i : _HEADER.size + 16 * (i + 1)].hex() for i in range(n)]


def unpack(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The int8 codes (n, DIM) and per-token float32 scales (n,) of a packed memory.

    Raises:
        ValueError: not a packing this version reads.
    """
    magic, n, dim = _HEADER.unpack_from(blob)
    if magic != _MAGIC or len(blob) != _HEADER.size + n * 2 + n * dim:
        raise ValueError("not a packed token matrix")
    scale = np.frombuffer(blob, dtype=np.float16, count=n, offset=_HEADER.size).astype(np.float32)
    codes = np.frombuffer(blob, dtype=np.int8, count=n * dim, offset=_HEADER.size + n * 2).reshape(n, dim)
    return codes, scale


@dataclass(frozen=True)
class TokenBlock:
    """Some memories of one user: their tokens end to end (``starts[i]`` is memory i's first),
    and the columns search filters read; then the memories scored from others' tokens (``parts``:
    the ids of each, in order after the memories with tokens). Never changed once built."""

    ids: list[str]
    codes: np.ndarray  # (tokens, DIM) uint8: the stored int8 codes, offset (``int8_product.as_unsigned``)
    scales: np.ndarray  # (tokens,) float32
    starts: np.ndarray  # (memories with tokens,) int64
    kinds: np.ndarray  # KIND_CODES, of every memory (those with tokens, then those with parts)
    projects: np.ndarray
    occurred: np.ndarray  # micros()
    parts: tuple[tuple[str, ...], ...] = ()  # of ids[len(starts):]

    @classmethod
    def build(cls, ids: list[str], blobs: list[bytes], kinds: np.ndarray, projects: np.ndarray,
              occurred: np.ndarray) -> TokenBlock:  # fmt: skip
        """A block from packed memories and their kind codes, projects and times (``micros``);
        memories with no tokens are left out."""
        keep, codes, scales, composed, parts = [], [], [], [], []
        for i, blob in enumerate(blobs):
            named = parts_of(blob)
            if named is not None:
                if named:
                    composed.append(i)
                    parts.append(tuple(named))
                continue
            c, s = unpack(blob)
            if len(c):
                keep.append(i)
                codes.append(c)
                scales.append(s)
        lengths = np.array([len(c) for c in codes], dtype=np.int64)
        every = keep + composed
        return cls(
            ids=[ids[i] for i in every],
            codes=int8_product.as_unsigned(np.concatenate(codes)) if codes else np.zeros((0, DIM), dtype=np.uint8),
            scales=np.concatenate(scales) if scales else np.zeros(0, dtype=np.float32),
            starts=np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(keep) else lengths,
            kinds=np.asarray(kinds, dtype=np.int8)[every],
            projects=np.asarray(projects, dtype=object)[every],
            occurred=np.asarray(occurred, dtype=np.int64)[every],
            parts=tuple(parts),
        )

    def without(self, gone: set[str]) -> TokenBlock | None:
        """The block without these memories (deleted); None if a memory it keeps is scored from
        the tokens of one of them (``parts``)."""
        if gone.isdisjoint(self.ids):
            return self
        n = len(self.starts)
        keep = np.array([rid not in gone for rid in self.ids], dtype=bool)
        parts = tuple(p for p, kept in zip(self.parts, keep[n:], strict=True) if kept)
        if any(rid in gone for p in parts for rid in p):
            return None
        lengths = np.diff(np.append(self.starts, self.tokens))
        on = np.repeat(keep[:n], lengths)
        kept_lengths = lengths[keep[:n]]
        starts = np.concatenate([[0], np.cumsum(kept_lengths)[:-1]]) if len(kept_lengths) else kept_lengths
        return TokenBlock(
            ids=[rid for rid, kept in zip(self.ids, keep, strict=True) if kept], codes=self.codes[on],
            scales=self.scales[on], starts=starts.astype(np.int64), kinds=self.kinds[keep],
            projects=self.projects[keep], occurred=self.occurred[keep], parts=parts,
        )  # fmt: skip

    @property
    def tokens(self) -> int:
        """How many token vectors the block holds."""
        return len(self.codes)

    def best(self, query: np.ndarray) -> np.ndarray:
        """For each memory with tokens, each query token's best cosine with them: (query tokens, memories).

        Computed from the int8 codes as they are (``int8_product``), a slice of whole memories at
        a time (``CHUNK_TOKENS``, fewer for a long question)."""
        n = len(self.starts)
        out = np.zeros((len(query), n), dtype=np.float32)
        if not n:
            return out
        split = int8_product.split_query(query)
        step = max(MIN_CHUNK_TOKENS, min(CHUNK_TOKENS, CHUNK_PRODUCTS // max(1, len(query))))
        ends = np.append(self.starts[1:], self.tokens)
        lo = 0
        while lo < n:
            hi = max(int(np.searchsorted(ends, self.starts[lo] + step, side="right")), lo + 1)
            first, last = int(self.starts[lo]), int(ends[hi - 1])
            sims = int8_product.cosines(self.codes[first:last], self.scales[first:last], split)
            out[:, lo:hi] = np.maximum.reduceat(sims, self.starts[lo:hi] - first, axis=0).T
            lo = hi
        return out

    def match(self, query: np.ndarray, weights: np.ndarray, elsewhere: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """Each memory's weighted mean, over the query's tokens, of its best cosine with them. A
        memory with parts takes, per query token, the best of its parts' (those of this block, and
        those ``elsewhere`` gives: part id -> ``best`` column); one with none found scores 0."""
        best = self.best(query)
        out = np.zeros(len(self.ids), dtype=np.float64)
        n = len(self.starts)
        out[:n] = weights @ best
        if self.parts:
            column = {rid: best[:, i] for i, rid in enumerate(self.ids[:n])}
            for j, parts in enumerate(self.parts):
                found = [v for p in parts if (v := column.get(p, (elsewhere or {}).get(p))) is not None]
                out[n + j] = weights @ np.max(found, axis=0) if found else 0.0
        return out

    def part_columns(self, best: np.ndarray) -> dict[str, np.ndarray]:
        """Of ``best`` (this block's), the columns of the memories that may be another's parts (passages)."""
        rows = np.flatnonzero(self.kinds[: len(self.starts)] == KIND_CODES["passage"])
        return {self.ids[i]: best[:, i] for i in rows}

    def mask(self, where: RecordFilter) -> np.ndarray:
        """Which memories pass the filter (of kinds, project and time: the columns a block holds).

        Raises:
            ValueError: The filter has a condition a block cannot answer (``filters.mask``).
        """
        return mask(where, kinds=self.kinds, projects=self.projects, occurred=self.occurred)


def merge_small(blocks: tuple[TokenBlock, ...], most: int = 8) -> tuple[TokenBlock, ...]:
    """At most ``most`` blocks: the smallest neighbours are joined (appends come in small blocks)."""
    blocks = tuple(b for b in blocks if b.ids)
    while len(blocks) > most:
        i = min(range(len(blocks) - 1), key=lambda k: blocks[k].tokens + blocks[k + 1].tokens)
        blocks = blocks[:i] + (join(blocks[i], blocks[i + 1]),) + blocks[i + 2 :]
    return blocks


def join(a: TokenBlock, b: TokenBlock) -> TokenBlock:
    """One block holding two (the memories with tokens first, then those with parts)."""
    na, nb = len(a.starts), len(b.starts)
    order = lambda x, y: np.concatenate([x[:na], y[:nb], x[na:], y[nb:]])  # noqa: E731
    return TokenBlock(
        ids=a.ids[:na] + b.ids[:nb] + a.ids[na:] + b.ids[nb:], codes=np.concatenate([a.codes, b.codes]),
        scales=np.concatenate([a.scales, b.scales]), starts=np.concatenate([a.starts, b.starts + a.tokens]),
        kinds=order(a.kinds, b.kinds), projects=order(a.projects, b.projects), occurred=order(a.occurred, b.occurred),
        parts=a.parts + b.parts,
    )  # fmt: skip


class TokenCache(UserCache[tuple[TokenBlock, ...]]):
    """Users' token blocks in memory, least recently used out, kept in step by the log as its
    vector cache is: appends add a block, deletes and rewrites drop the user.

    Args:
        max_user_tokens: Users with more token vectors are not held (they are scanned from the log).
        max_total_tokens: Token vectors held across users (130 bytes each).
    """

    def __init__(self, *, max_user_tokens: int = 2_000_000, max_total_tokens: int | None = None) -> None:
        super().__init__(max_total_tokens or 2 * max_user_tokens)
        self.max_user_tokens = max_user_tokens
        # Users found over max_user_tokens. Appends only add tokens, so only a delete or a
        # rewrite (``invalidate``) forgets the verdict; ``_shrinks`` counts those per user.
        self._too_large: set[str] = set()
        self._shrinks: Counter[str] = Counter()

    def size_stamp(self, user_id: str) -> tuple[int, int]:
        """Read before loading a user's tokens; pass it to ``mark_too_large``."""
        with self._lock:
            return self._epoch, self._shrinks[user_id]

    def mark_too_large(self, user_id: str, stamp: tuple[int, int]) -> None:
        """Remember that a user's tokens, read from the log since ``stamp``, did not fit: a search
        that does not scan then skips them without reading the log again. Appends meanwhile
        do not matter (they only add tokens); a delete or rewrite meanwhile voids the verdict."""
        with self._lock:
            if stamp == (self._epoch, self._shrinks[user_id]):
                self._too_large.add(user_id)

    def too_large(self, user_id: str) -> bool:
        """Whether the user was found too large to hold (see ``mark_too_large``)."""
        with self._lock:
            return user_id in self._too_large

    def _invalidate(self, user_id: str | None) -> None:
        super()._invalidate(user_id)
        if user_id is None:
            self._too_large.clear()
        else:
            self._too_large.discard(user_id)
            self._shrinks[user_id] += 1

    @staticmethod
    def size(entry: tuple[TokenBlock, ...]) -> int:
        return sum(b.tokens for b in entry)

    def put(self, user_id: str, blocks: tuple[TokenBlock, ...], generation: tuple[int, int]) -> None:
        """Hold a user's tokens loaded whole, unless they changed since ``generation``."""
        super().put(user_id, merge_small(blocks), generation)

    def drop_rows(self, user_id: str, ids: Sequence[str]) -> None:
        """Take deleted memories out of a held user (cheaper than reading the user again; a user
        some kept memory of which is scored from a deleted one's tokens is dropped). As any
        delete, it refuses a load in flight and voids a too-large verdict."""
        gone = set(ids)

        def without(blocks: tuple[TokenBlock, ...]) -> tuple[TokenBlock, ...] | None:
            kept = [b.without(gone) for b in blocks]
            if any(b is None for b in kept):
                return None
            return merge_small(tuple(b for b in kept if b is not None))

        with self._lock:
            self._shrinks[user_id] += 1
            self._too_large.discard(user_id)
            self._change(user_id, without)

    def extend(self, user_id: str, block: TokenBlock) -> None:
        """Add newly written memories to a held user (one not held loads them later)."""
        with self._lock:
            self._changes[user_id] += 1
            blocks = self._users.get(user_id)
            if blocks is None or not block.ids:
                return
            held = {rid for b in blocks for rid in b.ids}
            raced = any(rid in held for rid in block.ids)  # a load raced the write and holds them
            if raced or self.size(blocks) + block.tokens > self.max_user_tokens:
                del self._users[user_id]  # loaded again on next use
            else:
                self._users[user_id] = merge_small((*blocks, block))
