"""A local cross-encoder that scores (query, passage) pairs, for reranking.

No package ships cross-encoder weights and hub downloads are off, so the model is a
directory the user points to. It loads on first use, not at construction: importing
sentence-transformers takes seconds, and a server that never reranks should not pay for it.
Every torch call runs on one dedicated thread, as the embedder's do (torch called from many
threads gives each its own OpenMP team, and they slow each other down).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from mnemoplan.errors import Unavailable

log = logging.getLogger(__name__)

_HINT = (
    "Point the reranker setting at a local sentence-transformers cross-encoder directory "
    "(config.json, tokenizer and weights); models are never downloaded."
)


class CrossEncoderScorer:
    """Raw relevance logits of a sentence-transformers ``CrossEncoder``, loaded lazily.

    Args:
        path: The model directory.
        batch_size: Pairs per forward pass.
    """

    def __init__(self, path: Path, *, batch_size: int = 32) -> None:
        self.path = Path(path).expanduser()
        self._batch_size = batch_size
        self._model: Any = None
        self._error = ""
        # One thread for loading and scoring: loads never race, torch never multiplies its teams.
        self._torch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemoplan-cross-encoder")

    def ready(self) -> bool:
        """True once the model is loaded."""
        return self._model is not None

    def submit(self, pairs: list[tuple[str, str]]) -> Future[list[float]]:
        """Queue pairs for scoring (loading the model first if needed).

        Args:
            pairs: (query, passage) pairs.

        Returns:
            A future of one logit per pair, in order (higher is more relevant). Its
            ``result()`` raises ``Unavailable`` if the model cannot be loaded.

        Raises:
            Unavailable: The model directory does not exist, or loading it already failed.
        """
        self._check()
        return self._torch.submit(self._score, list(pairs))

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Score pairs, waiting for the model to load on first use.

        Args:
            pairs: (query, passage) pairs.

        Returns:
            One logit per pair, in order (higher is more relevant).

        Raises:
            Unavailable: The model directory does not exist or the model cannot be loaded.
        """
        return self.submit(pairs).result()

    def close(self) -> None:
        """Stop the scoring thread; queued work is cancelled."""
        self._torch.shutdown(wait=False, cancel_futures=True)

    def _check(self) -> None:
        # Checked before any import, so a wrong path fails in microseconds, not after torch loads.
        if not self.path.is_dir():
            raise Unavailable(f"The cross-encoder model directory {self.path} does not exist.", hint=_HINT)
        if self._error:
            raise self._load_failure()

    def _load_failure(self) -> Unavailable:
        # A failed load is remembered: retrying would cost seconds per call and fail the same way.
        return Unavailable(f"The cross-encoder model could not be loaded: {self._error}", hint=_HINT)

    def _load(self) -> Any:
        # Never reach for the hub: local_files_only covers the model, the offline flags the entry
        # point set (runtime.py) anything else the libraries might fetch.
        try:
            from sentence_transformers import CrossEncoder

            model = CrossEncoder(str(self.path), device="cpu", local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure means the same thing to the caller
            self._error = f"{type(exc).__name__}: {str(exc)[:200]}"
            log.error("could not load the cross-encoder %s: %s", self.path, self._error)
            raise self._load_failure() from None
        log.info("cross-encoder %s loaded", self.path)
        self._model = model
        return model

    def _score(self, pairs: list[tuple[str, str]]) -> list[float]:
        self._check()
        model = self._model if self._model is not None else self._load()
        if not pairs:
            return []
        import torch

        # Identity: raw logits, whatever activation the model's config names; the caller maps
        # them to its own scale.
        out = model.predict(
            pairs, batch_size=self._batch_size, show_progress_bar=False,
            activation_fn=torch.nn.Identity(), convert_to_numpy=True,
        )  # fmt: skip
        scores = np.asarray(out, dtype=np.float64)
        if scores.ndim == 2:
            scores = scores[:, -1]  # a multi-label head: the last label is the "relevant" one
        return [float(x) for x in scores]
