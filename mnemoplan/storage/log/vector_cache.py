"""Users' search vectors in memory, for exact nearest-neighbour search without a storage round trip.

A LanceDB query has a fixed cost whatever its size; a matrix product over a user's few
thousand vectors costs a fraction of it. The log keeps this cache exactly in step with
its own writes (appends extend it, deletes and updates drop it), and users too large for
it are searched in LanceDB, through its ANN index.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from mnemoplan.model import RecordHead
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.filters import mask
from mnemoplan.storage.log.partitions import PARTITION_ROWS, Partitions
from mnemoplan.storage.log.schema import EPOCH, MICROSECOND, NO_EVENT, kind_code_array, micros
from mnemoplan.storage.log.user_cache import UserCache

NO_ADDRESS = -1  # UserVectors.addresses: where the row is in the log is not known
NARROW_FILTER = 8  # a filter passing at most 1/8 of a partitioned user's rows: those are scored alone


class _Buffer:
    """Row storage with spare capacity, shared by successive snapshots of one user.

    A snapshot sees rows ``[:n]``; an append writes past every snapshot's end, so none of
    them changes. Only the snapshot holding all the rows written may append in place.
    ``rows`` maps ids to row numbers for every snapshot sharing the buffer (a snapshot
    checks that a row is its own: ``row < n`` and the id there is the one asked for).
    """

    def __init__(self, matrix: np.ndarray, rows: dict[str, int]) -> None:
        self.data = matrix
        self.used = len(matrix)
        self.rows = rows

    def append(self, n: int, more: np.ndarray) -> np.ndarray | None:
        """Rows ``[:n + len(more)]`` with ``more`` written after row ``n``; None if ``n`` is stale."""
        if n != self.used:
            return None
        end = n + len(more)
        if end > len(self.data):  # grow by half again, amortised O(1) per row
            grown = np.empty((max(end, len(self.data) * 3 // 2 + 64), self.data.shape[1]), dtype=np.float32)
            grown[:n] = self.data[:n]
            self.data = grown
        self.data[n:end] = more
        self.used = end
        return self.data[:end]


@dataclass(frozen=True)
class UserVectors:
    """One user's rows: ids, unit vectors, the columns filters need and what ranking reads
    (``head``). Never changed in place: a search holds a consistent snapshot while an append
    or a patch builds the next one."""

    ids: list[str] = field(default_factory=list)
    matrix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    kinds: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))  # KIND_CODES
    projects: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    occurred: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # micros()
    sessions: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    seqs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    prev_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    importance: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    superseded: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))
    asks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # see model.asks_question
    alone: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # see model.stands_alone
    requests: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # see model.requests
    event_start: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # micros(); NO_EVENT
    event_end: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Where each row was in the log when read (``_rowaddr``), NO_ADDRESS for rows written or
    # rewritten since: a read by address is a hint, checked against the ids it returns.
    addresses: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # A large user's rows are grouped by partition (``partitioned``): ``positions`` then keeps
    # each row's place in the order read and written (None: the rows are in that order).
    partitions: Partitions | None = None
    positions: np.ndarray | None = None
    buffer: _Buffer | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def build(
        cls, ids: list[str], matrix: np.ndarray, columns: Mapping[str, Sequence[object] | np.ndarray]
    ) -> UserVectors:
        """Rows from the log's columns: kind, project_id, occurred_at, session_id, seq, prev_id,
        importance and superseded_by, as lists (None for the log's default) or as arrays without
        nulls (``occurred_at`` then in ``micros``); missing ones take the log's defaults. The
        event's ``event_start`` and ``event_end``, as datetimes or None, or as arrays of ``micros``
        with ``NO_EVENT`` for none (missing: no event). And
        ``asks``, ``alone`` and ``requests``, derived from the speaker and text (``model.asks_question``,
        ``model.stands_alone``, ``model.requests``; default False). And ``address``, each row's
        ``_rowaddr`` in the log (missing: ``NO_ADDRESS``)."""
        n = len(ids)

        def col(name: str, default: object, dtype: npt.DTypeLike) -> np.ndarray:
            values = columns.get(name)
            if values is None:
                return np.full(n, default, dtype=dtype)
            if isinstance(values, np.ndarray):
                return values.astype(dtype, copy=False)
            return np.asarray([default if v is None else v for v in values], dtype=dtype)

        def event(name: str) -> np.ndarray:
            values = columns.get(name)
            if isinstance(values, np.ndarray):
                return values.astype(np.int64, copy=False)
            times = values or [None] * n
            return np.asarray([NO_EVENT if t is None else micros(t) for t in times], dtype=np.int64)

        occurred = columns.get("occurred_at")
        if not isinstance(occurred, np.ndarray):
            occurred = [micros(t) for t in (occurred or [EPOCH] * n)]
        matrix = np.asarray(matrix, dtype=np.float32)
        if n:
            matrix = matrix.reshape(n, -1)
        else:  # a user with no rows (yet)
            matrix = np.zeros((0, matrix.shape[-1] if matrix.ndim == 2 else 0), dtype=np.float32)
        return cls(
            ids=list(ids),
            matrix=matrix,
            kinds=kind_code_array(col("kind", "", object)),
            projects=col("project_id", "", object),
            occurred=np.asarray(occurred, dtype=np.int64),
            sessions=col("session_id", "", object),
            seqs=col("seq", 0, np.int64),
            prev_ids=col("prev_id", "", object),
            importance=col("importance", 0.5, np.float32),
            superseded=col("superseded_by", "", object),
            asks=col("asks", False, bool),
            alone=col("alone", False, bool),
            requests=col("requests", False, bool),
            event_start=event("event_start"),
            event_end=event("event_end"),
            addresses=col("address", NO_ADDRESS, np.int64),
            buffer=_Buffer(matrix, {rid: i for i, rid in enumerate(ids)}),
        )

    def extended(self, more: UserVectors) -> UserVectors:
        """These rows and more. The vectors go into spare capacity when there is some (a copy of
        every row per append grew with the user); the small columns are copied."""
        if not self.ids:
            return more
        buffer = self.buffer if self.buffer is not None else _Buffer(self.matrix, self._row_map())
        matrix = buffer.append(len(self.ids), more.matrix)
        if matrix is None:  # another snapshot appended first: start a buffer of our own
            buffer = _Buffer(self.matrix.copy(), dict(buffer.rows))
            matrix = buffer.append(len(self.ids), more.matrix)
            assert matrix is not None
        buffer.rows.update((rid, len(self.ids) + i) for i, rid in enumerate(more.ids))
        return UserVectors(
            ids=self.ids + more.ids,
            matrix=matrix,
            kinds=np.concatenate([self.kinds, more.kinds]),
            projects=np.concatenate([self.projects, more.projects]),
            occurred=np.concatenate([self.occurred, more.occurred]),
            sessions=np.concatenate([self.sessions, more.sessions]),
            seqs=np.concatenate([self.seqs, more.seqs]),
            prev_ids=np.concatenate([self.prev_ids, more.prev_ids]),
            importance=np.concatenate([self.importance, more.importance]),
            superseded=np.concatenate([self.superseded, more.superseded]),
            asks=np.concatenate([self.asks, more.asks]),
            alone=np.concatenate([self.alone, more.alone]),
            requests=np.concatenate([self.requests, more.requests]),
            event_start=np.concatenate([self.event_start, more.event_start]),
            event_end=np.concatenate([self.event_end, more.event_end]),
            addresses=np.concatenate([self.addresses, more.addresses]),
            partitions=self.partitions,
            positions=None if self.positions is None else np.concatenate(
                [self.positions, int(self.positions.max(initial=-1)) + 1 + np.arange(len(more), dtype=np.int64)]),
            buffer=buffer,
        )  # fmt: skip

    def _row_map(self) -> dict[str, int]:
        return self.buffer.rows if self.buffer is not None else {rid: i for i, rid in enumerate(self.ids)}

    def row(self, rid: str) -> int | None:
        """The row number of an id in this snapshot, if it has it."""
        i = self._row_map().get(rid)
        return i if i is not None and i < len(self.ids) and self.ids[i] == rid else None

    def heads(self, ids: list[str]) -> dict[str, RecordHead]:
        """What ranking reads of some records (ids this snapshot lacks are absent)."""
        out: dict[str, RecordHead] = {}
        for rid in ids:
            i = self.row(rid)
            if i is not None:
                out[rid] = RecordHead(
                    id=rid, project_id=self.projects[i], session_id=self.sessions[i], seq=int(self.seqs[i]),
                    prev_id=self.prev_ids[i], occurred_at=EPOCH + int(self.occurred[i]) * MICROSECOND,
                    importance=float(self.importance[i]), superseded_by=self.superseded[i],
                    asks=bool(self.asks[i]), alone=bool(self.alone[i]), requests=bool(self.requests[i]),
                )  # fmt: skip
        return out

    def subset(self, rows: list[int]) -> UserVectors:
        """Some of these rows (ascending), as a snapshot of their own."""
        pick = np.asarray(rows, dtype=np.int64)
        return self._reordered(pick, self.partitions.subset(pick) if self.partitions is not None else None,
                               None if self.positions is None else self.positions[pick])  # fmt: skip

    @property
    def wants_partitions(self) -> bool:
        """True for rows not in partitions yet, ``PARTITION_ROWS`` of them or more."""
        return self.partitions is None and len(self.ids) >= PARTITION_ROWS

    def partitioned(self) -> UserVectors:
        """This snapshot with its rows grouped by partition (``partitions.Partitions``), if it
        ``wants_partitions``; else this one."""
        if not self.wants_partitions:
            return self
        partitions, order = Partitions.train(self.matrix)
        return self._reordered(order, partitions, order if self.positions is None else self.positions[order])

    def _reordered(self, pick: np.ndarray, partitions: Partitions | None, positions: np.ndarray | None) -> UserVectors:
        ids, matrix = [self.ids[i] for i in pick.tolist()], self.matrix[pick]
        return UserVectors(
            ids=ids, matrix=matrix, kinds=self.kinds[pick], projects=self.projects[pick],
            occurred=self.occurred[pick], sessions=self.sessions[pick], seqs=self.seqs[pick],
            prev_ids=self.prev_ids[pick], importance=self.importance[pick], superseded=self.superseded[pick],
            asks=self.asks[pick], alone=self.alone[pick], requests=self.requests[pick],
            event_start=self.event_start[pick], event_end=self.event_end[pick], addresses=self.addresses[pick],
            partitions=partitions, positions=positions, buffer=_Buffer(matrix, {rid: i for i, rid in enumerate(ids)}),
        )  # fmt: skip

    def without(self, gone: set[str]) -> UserVectors:
        """A snapshot without these rows (deleted); this one if it has none of them (a delete
        drops rows before and after it writes the log: the second finds them gone)."""
        if all(self.row(rid) is None for rid in gone):
            return self
        return self.subset([i for i, rid in enumerate(self.ids) if rid not in gone])

    def with_rows(self, changed: Mapping[str, tuple[str, np.ndarray]]) -> UserVectors | None:
        """A snapshot with some rows' previous turn and vector replaced (``{id: (prev_id,
        vector)}``, a turn whose neighbour was deleted); None if this one lacks a row."""
        rows = {rid: self.row(rid) for rid in changed}
        if any(i is None for i in rows.values()):
            return None
        if all(self.prev_ids[i] == changed[rid][0]
               and np.array_equal(self.matrix[i], np.asarray(changed[rid][1], self.matrix.dtype))
               for rid, i in rows.items()):  # fmt: skip
            return self  # patched already (before the log was written)
        matrix, prev_ids, addresses = self.matrix.copy(), self.prev_ids.copy(), self.addresses.copy()
        for rid, i in rows.items():
            prev_ids[i], matrix[i] = changed[rid]
            addresses[i] = NO_ADDRESS  # rewritten: elsewhere in the log now
        return replace(self, matrix=matrix, prev_ids=prev_ids, addresses=addresses,
                       buffer=_Buffer(matrix, dict(self._row_map())))

    def with_superseded(self, rid: str, by_id: str) -> UserVectors | None:
        """A snapshot with one record marked superseded; None if this one lacks it."""
        i = self.row(rid)
        if i is None:
            return None
        superseded, addresses = self.superseded.copy(), self.addresses.copy()
        superseded[i], addresses[i] = by_id, NO_ADDRESS
        return replace(self, superseded=superseded, addresses=addresses)

    def addresses_of(self, ids: list[str]) -> dict[str, int]:
        """Where some rows were in the log when read (``_rowaddr``), for those this snapshot has
        and knows it of."""
        rows = [(rid, self.row(rid)) for rid in ids]
        return {rid: int(self.addresses[i]) for rid, i in rows if i is not None and self.addresses[i] != NO_ADDRESS}

    def with_addresses(self, found: Mapping[str, int], *, every: bool = False) -> UserVectors:
        """A snapshot whose rows are where ``found`` says (``{id: _rowaddr}``, read since). With
        ``every``, ``found`` holds every row there is, and the rows it lacks become ``NO_ADDRESS``;
        else the others keep theirs."""
        addresses = np.full(len(self.ids), NO_ADDRESS, dtype=np.int64) if every else self.addresses.copy()
        for rid, at in found.items():
            if (i := self.row(rid)) is not None:
                addresses[i] = at
        return replace(self, addresses=addresses)

    def mask(self, where: RecordFilter) -> np.ndarray:
        """Which rows pass the filter (``filters.mask``).

        Raises:
            ValueError: The filter has a condition the rows in memory cannot answer.
        """
        return mask(where, kinds=self.kinds, projects=self.projects, occurred=self.occurred,
                    sessions=self.sessions, superseded=self.superseded, ids=self.ids,
                    events=(self.event_start, self.event_end))  # fmt: skip

    def first(self, where: RecordFilter, limit: int) -> list[tuple[str, bool, int]]:
        """The first ``limit`` rows passing the filter, in the order read and written (a read of
        the log with a limit takes its first rows too): (id, whether it has an event time, seq).

        Raises:
            ValueError: The filter has a condition the rows in memory cannot answer.
        """
        rows = np.flatnonzero(self.mask(where))
        if self.positions is not None:  # grouped by partition: back in the order written
            rows = rows[np.argsort(self.positions[rows], kind="stable")]
        rows = rows[:limit].tolist()
        return [(self.ids[i], bool(self.event_start[i] != NO_EVENT), int(self.seqs[i])) for i in rows]

    def events(self, ids: list[str]) -> dict[str, tuple[int, int]] | None:
        """Each record's event (start, end) in ``micros``, ``NO_EVENT`` for none; None if this
        snapshot lacks one of them."""
        rows = [self.row(rid) for rid in ids]
        if any(i is None for i in rows):
            return None
        return {rid: (int(self.event_start[i]), int(self.event_end[i]))  # type: ignore[index]
                for rid, i in zip(ids, rows, strict=True)}  # fmt: skip

    def search(
        self, vector: np.ndarray, k: int, where: RecordFilter | None = None
    ) -> list[tuple[str, float]]:
        """The ``k`` most similar rows passing the filter (if any): (id, cosine), best first.

        Raises:
            ValueError: The filter has a condition the rows in memory cannot answer (``filters.mask``).
        """
        if not self.ids or k <= 0:
            return []
        vector = np.asarray(vector, dtype=np.float32)
        keep = None if where is None else self.mask(where)
        found = self._search_partitions(vector, k, keep) if self.partitions is not None else None
        if found is not None:
            candidates, scores = found
        else:
            candidates = np.arange(len(self.ids)) if keep is None else np.flatnonzero(keep)
            scores = (self.matrix @ vector)[candidates]
        if candidates.size == 0:
            return []
        top = min(k, candidates.size)
        best = np.argpartition(-scores, top - 1)[:top]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(self.ids[candidates[i]], float(scores[i])) for i in best]

    def _search_partitions(
        self, vector: np.ndarray, k: int, keep: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, their scores) of the partitions nearest the vector, those passing ``keep``;
        None where the exact search is asked for instead: a filter so narrow that scoring its
        rows alone is cheaper, or one that leaves fewer than ``k`` rows in the partitions read."""
        assert self.partitions is not None
        passing = len(self.ids) if keep is None else int(np.count_nonzero(keep))
        if passing * NARROW_FILTER <= len(self.ids):
            rows = np.flatnonzero(keep)
            return rows, self.matrix[rows] @ vector
        slices = self.partitions.slices(vector, len(self.ids))
        if not slices:  # the partitions read were emptied by deletes
            return None
        rows = np.concatenate([np.arange(a, b) for a, b in slices])
        scores = np.concatenate([self.matrix[a:b] @ vector for a, b in slices])
        if keep is not None:
            kept = keep[rows]
            rows, scores = rows[kept], scores[kept]
        return (rows, scores) if rows.size >= min(k, passing) else None


class VectorCache(UserCache[UserVectors]):
    """Per-user vectors, least recently used first out.

    Args:
        max_user_rows: Users with more rows are not cached (LanceDB's ANN index serves them).
        max_total_rows: Rows kept across users.
    """

    def __init__(self, *, max_user_rows: int = 200_000, max_total_rows: int | None = None) -> None:
        super().__init__(max_total_rows or 2 * max_user_rows)
        self.max_user_rows = max_user_rows
        self._appends: Counter[str] = Counter()  # the changes that only appended rows (``extend``)

    def revision(self, user_id: str) -> tuple[int, int]:
        """Like ``generation``, but blind to appends: read before rearranging a held user's rows
        (``replace``)."""
        with self._lock:
            return self._epoch, self._changes[user_id] - self._appends[user_id]

    @staticmethod
    def size(entry: UserVectors) -> int:
        return len(entry)

    def extend(self, user_id: str, more: UserVectors) -> None:
        """Append new rows to a cached user (an uncached user loads them later)."""
        with self._lock:
            self._changes[user_id] += 1
            self._appends[user_id] += 1
            entry = self._users.get(user_id)
            if entry is None:
                return
            if len(entry) + len(more) > self.max_user_rows:
                del self._users[user_id]
                return
            # A load that read the log after these rows were written, and was cached before
            # this call, holds them already.
            fresh = [i for i, rid in enumerate(more.ids) if entry.row(rid) is None]
            if len(fresh) < len(more):
                more = more.subset(fresh)
            if len(more):
                self._users[user_id] = entry.extended(more)

    def drop_rows(self, user_id: str, ids: Sequence[str]) -> None:
        """Take deleted rows out of a held user (cheaper than reading the user again); a load
        in flight is refused, as for any change."""
        gone = set(ids)
        with self._lock:
            self._change(user_id, lambda entry: entry.without(gone))

    def patch_rows(self, user_id: str, changed: Mapping[str, tuple[str, np.ndarray]]) -> None:
        """Give rows of a held user a new previous turn and vector (``UserVectors.with_rows``);
        a user held without one of them is dropped."""
        with self._lock:
            self._change(user_id, lambda entry: entry.with_rows(changed))

    def replace(self, user_id: str, old: UserVectors, new: UserVectors, revision: tuple[int, int]) -> bool:
        """Hold ``new`` for a user instead of ``old`` (the same rows, otherwise arranged), with the
        rows appended since; unless the user's rows changed otherwise since ``revision`` was read
        (a write's append does not count), or ``old`` and what grew from it are no longer held.
        True if held."""
        current = self.get(user_id)
        if current is None or (current is not old and (len(current) < len(old) or current.ids[: len(old)] != old.ids)):
            return False
        grown = new if current is old else new.extended(current.subset(list(range(len(old), len(current)))))
        with self._lock:
            if revision != (self._epoch, self._changes[user_id] - self._appends[user_id]):
                return False
            if self._users.get(user_id) is not current:  # appended again meanwhile: the next search asks again
                return False
            self._users[user_id] = grown
            return True

    def place(self, user_id: str, found: Mapping[str, int], *, every: bool = False) -> None:
        """Note where a held user's rows are in the log now (``{id: _rowaddr}``, just read;
        ``UserVectors.with_addresses``). Not a change to the rows: a load in flight still counts."""
        entry = self.get(user_id)
        if entry is None:
            return
        placed = entry.with_addresses(found, every=every)
        with self._lock:
            if self._users.get(user_id) is entry:  # else changed meanwhile: the next miss reads again
                self._users[user_id] = placed

    def mark_superseded(self, rid: str, by_id: str, user_id: str | None = None) -> None:
        """Note in the cached copy that a record was superseded (the log was just updated).
        A load in flight may have read the old value: it is refused, for this user when the
        caller names them, else for every user."""
        with self._lock:
            if user_id is None:
                self._epoch += 1
            else:
                self._changes[user_id] += 1
            for owner in [user_id] if user_id is not None else list(self._users):
                entry = self._users.get(owner)
                patched = entry.with_superseded(rid, by_id) if entry is not None else None
                if patched is not None:
                    self._users[owner] = patched
                    return
