"""A large user's vectors in partitions (an inverted file, in memory): a search scores the
partitions' centroids and reads the rows of the nearest few, not every row.

Exact search over a user's vectors in memory reads every row: 13-17 ms a query for a user of
150k records (232 MB of float32, read at the memory's speed), most of a recall's time for them.
Past ``PARTITION_ROWS`` records, a user read into memory has their rows grouped by the nearest of
about one centroid per ``ROWS_PER_PARTITION`` (spherical k-means over a sample, seeded, so a
user's partitions are the same at every load), and a search reads the ``PROBES`` partitions
nearest the query, plus the rows written since (in none). On the million store's 150k-record
user, 150 questions: 99.2 % of the exact top 50 (counted by score, its texts repeat) from 16 of
252 partitions, 3.4 ms a search against 16.8 exact; partitioning it at load took 0.7 s
(bench/README.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PARTITION_ROWS = 50_000  # users with fewer rows are searched exactly
ROWS_PER_PARTITION = 600
MOST_PARTITIONS = 1_024
PROBES = 16  # partitions read per search
TRAIN_ROWS = 10_000  # the sample k-means runs on
TRAIN_ROUNDS = 4
ASSIGN_ROWS = 20_000  # rows assigned to their partition at a time (a block of scores in memory)


@dataclass(frozen=True)
class Partitions:
    """Rows ``[starts[p], starts[p + 1])`` of a user's matrix belong to partition ``p`` (the rows
    past ``starts[-1]`` were written since, and belong to none).

    Args:
        centroids: One unit vector per partition (k × d).
        starts: Where each partition's rows begin, and where the last ends (k + 1).
    """

    centroids: np.ndarray
    starts: np.ndarray

    @property
    def covered(self) -> int:
        """Rows in some partition (the first ones)."""
        return int(self.starts[-1])

    @classmethod
    def train(cls, matrix: np.ndarray, *, seed: int = 0) -> tuple[Partitions, np.ndarray]:
        """Partitions of these rows, and the order that groups the rows by partition (stable:
        a partition's rows keep their order).

        Raises:
            ValueError: Fewer rows than partitions asked (``PARTITION_ROWS`` is far above it).
        """
        n = len(matrix)
        k = min(MOST_PARTITIONS, n // ROWS_PER_PARTITION)
        if k < 2:
            raise ValueError(f"{n} rows are too few to partition")
        rng = np.random.default_rng(seed)
        sample = matrix[np.sort(rng.choice(n, min(n, TRAIN_ROWS), replace=False))]
        centroids = sample[rng.choice(len(sample), k, replace=False)].copy()
        for _ in range(TRAIN_ROUNDS):
            nearest = np.argmax(sample @ centroids.T, axis=1)
            grouped = np.argsort(nearest, kind="stable")
            filled = np.flatnonzero(np.bincount(nearest, minlength=k))  # an empty partition keeps its centroid
            sums = np.add.reduceat(sample[grouped], np.searchsorted(nearest[grouped], filled))
            centroids[filled] = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
        nearest = np.concatenate(
            [np.argmax(matrix[at : at + ASSIGN_ROWS] @ centroids.T, axis=1) for at in range(0, n, ASSIGN_ROWS)]
        )
        order = np.argsort(nearest, kind="stable")
        starts = np.zeros(k + 1, dtype=np.int64)
        starts[1:] = np.cumsum(np.bincount(nearest, minlength=k))
        return cls(centroids=centroids, starts=starts), order

    def slices(self, vector: np.ndarray, rows: int) -> list[tuple[int, int]]:
        """The row ranges a search for ``vector`` reads: the ``PROBES`` partitions whose
        centroids are nearest, in row order, then the rows past the partitions (of ``rows``)."""
        k = len(self.centroids)
        probes = min(PROBES, k)
        near = np.argpartition(-(self.centroids @ vector), probes - 1)[:probes] if probes < k else np.arange(k)
        out = [(int(self.starts[p]), int(self.starts[p + 1])) for p in np.sort(near)]
        if rows > self.covered:
            out.append((self.covered, rows))
        return [(a, b) for a, b in out if b > a]

    def subset(self, rows: np.ndarray) -> Partitions:
        """These partitions over some of the rows (row numbers ascending, as ``UserVectors.subset``
        keeps them): each kept row stays in its partition, the rows past them stay past."""
        k = len(self.centroids)
        of_row = np.repeat(np.arange(k), np.diff(self.starts))
        kept = of_row[rows[rows < self.covered]]
        starts = np.zeros(k + 1, dtype=np.int64)
        starts[1:] = np.cumsum(np.bincount(kept, minlength=k))
        return Partitions(centroids=self.centroids, starts=starts)
