"""What ingest embeds of each record: its vector (the mean of its sentences', or of its passages'
for a long message) and its packed token vectors, from one forward pass of the model."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from mnemoplan.errors import Unavailable
from mnemoplan.extract.sentences import split_sentences
from mnemoplan.inference.embedder import TokenVectors
from mnemoplan.inference.token_vectors import projection
from mnemoplan.model import Record
from mnemoplan.storage.log.token_cache import pack_many, pack_parts

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]  # (done, total)
# sentences embedded between two progress reports: often enough to show progress, rarely enough
# to cost nothing
PROGRESS_SLICE = 256


class RecordEmbedder:
    """Embeds records as ingest stores them.

    Args:
        embed: Embeds a batch of texts.
        embed_with_tokens: Embeds a batch of texts and gives their token vectors from the same
            pass, projected by ``token_vectors.projection`` (``SentenceEmbedder.embed_with_tokens``);
            with it, each record's tokens are stored for the ``token_match`` index.
        terms: The BM25 index terms of a word (none for a word the index ignores).
    """

    def __init__(self, embed: Callable[[list[str]], np.ndarray],
                 embed_with_tokens: Callable[..., tuple[np.ndarray, list[TokenVectors]]] | None,
                 terms: Callable[[str], list[str]]) -> None:  # fmt: skip
        self.embed = embed
        self.embed_with_tokens = embed_with_tokens
        self._terms = terms

    @property
    def gives_tokens(self) -> bool:
        """Whether records get token vectors (the model gives them)."""
        return self.embed_with_tokens is not None

    def embed_records(
        self, records: list[Record], progress: Progress | None = None
    ) -> tuple[np.ndarray, list[bytes | None]]:
        """One vector per record, the normalised mean of its sentences' embeddings, and the
        record's packed token vectors (None when the model gives none): its sentences' tokens end
        to end, without those of words BM25 ignores (stop words, punctuation).

        With ``progress``, the sentences are embedded a slice at a time and each slice is
        reported (done, total); without, in one call.
        """
        texts: list[str] = []
        owner: list[int] = []
        part_of: list[int] = []  # the passage record a text is, or -1
        parts = {rec.derived_from[0]: [] for rec in records if rec.kind == "passage"}
        for j, rec in enumerate(records):
            if rec.kind == "passage":
                parts[rec.derived_from[0]].append(j)
        for i, rec in enumerate(records):
            prefix = f"{rec.speaker}: " if rec.speaker else ""
            if rec.kind == "passage":
                continue  # embedded with its message, whose vector is the mean of its passages'
            # A long message is embedded passage by passage: each whole (the model reads ~250
            # words) and none lost to a sentence split that found no sentence ends in a list.
            for j in parts.get(rec.id, ()):
                texts.append(prefix + records[j].text)
                owner.append(i)
                part_of.append(j)
            if rec.id in parts:
                continue
            for sentence in split_sentences(rec.text, min_words=4):
                texts.append(prefix + sentence)
                owner.append(i)
                part_of.append(-1)
        step = len(texts) if progress is None or len(texts) <= PROGRESS_SLICE else PROGRESS_SLICE
        parts, tokens = [], []
        for start in range(0, len(texts), max(step, 1)):
            chunk = texts[start : start + step]
            passed = self._embed_chunk(chunk)
            parts.append(passed[0])
            tokens.extend(passed[1])
            if progress is not None and step < len(texts):
                progress(min(start + step, len(texts)), len(texts))
        vectors = np.concatenate(parts) if parts else self.embed([])
        sums = np.zeros((len(records), vectors.shape[1]), dtype=np.float32)
        np.add.at(sums, np.asarray(owner, dtype=np.int64), vectors)
        passages = np.asarray(part_of, dtype=np.int64)
        if (passages >= 0).any():
            np.add.at(sums, passages[passages >= 0], vectors[passages >= 0])
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return sums / norms, self._pack(records, texts, owner, tokens, part_of)

    def _embed_chunk(self, texts: list[str]) -> tuple[np.ndarray, list[TokenVectors]]:
        if self.embed_with_tokens is None:
            return self.embed(texts), []
        try:
            return self.embed_with_tokens(texts, projection)
        except Unavailable:
            vectors = self.embed(texts)  # raises the model's own trouble (still loading, broken)
        try:  # the model is up now: was it only loading when tokens were asked for?
            return self.embed_with_tokens(texts, projection)
        except Unavailable:
            log.warning("the embedding model gives no token vectors: memories are stored without them")
            self.embed_with_tokens = None
            return vectors, []

    def _pack(self, records: list[Record], texts: list[str], owner: list[int],
              tokens: list[TokenVectors], part_of: list[int]) -> list[bytes | None]:  # fmt: skip
        """Each record's content tokens, packed (all its tokens when none is content); a passage
        has its own, and its message names its passages (``pack_parts``): each token is stored once."""
        if not tokens:
            return [None] * len(records)
        content: dict[str, bool] = {}
        kept: list[list[np.ndarray]] = [[] for _ in records]
        every: list[list[np.ndarray]] = [[] for _ in records]
        parts: dict[int, list[str]] = {}
        for text, i, j, tv in zip(texts, owner, part_of, tokens, strict=True):
            words = [text[a:b] for a, b in tv.words]
            for word in set(words) - content.keys():
                content[word] = bool(self._terms(word))
            keep = np.array([content[w] for w in words], dtype=bool)
            if j >= 0:
                parts.setdefault(i, []).append(records[j].id)
            kept[j if j >= 0 else i].append(tv.vectors[keep])
            every[j if j >= 0 else i].append(tv.vectors)
        chosen = [np.concatenate(k if any(len(m) for m in k) else e) if e else None
                  for k, e in zip(kept, every, strict=True)]  # fmt: skip
        packed = iter(pack_many([m for m in chosen if m is not None]))
        return [pack_parts(parts[n]) if n in parts else None if m is None else next(packed)
                for n, m in enumerate(chosen)]  # fmt: skip

