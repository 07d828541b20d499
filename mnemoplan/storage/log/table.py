"""The log: every record, in LanceDB, with its vectors. The only module that imports lancedb.

The ``records`` table is the source of truth; every overlay is rebuilt from it. It also
serves the vector search (``vector`` holds the contextual embedding of each record) and
the scalar look-ups the temporal, fact and working-memory indexes need.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from lancedb.index import BTree, HnswSq

from mnemoplan.runtime import configure_lance
from mnemoplan.storage.log.record_cache import WHOLE_USER_MAX, WHOLE_USER_SHARE, RecordCache
from mnemoplan.storage.log.token_cache import TokenBlock, TokenCache
from mnemoplan.storage.log.vector_cache import UserVectors, VectorCache, kind_code_array
from mnemoplan.model import DocRecord, EntityMention, Record, RecordHead
from mnemoplan.model.records import (
    QUESTION_PATTERN,
    REQUESTING_ROLES,
    STANDALONE_WORDS,
    UNSPACED_PATTERN,
    WORD_PATTERN,
)

log = logging.getLogger(__name__)


TABLE = "records"
OLD_VERSIONS_KEPT = timedelta(minutes=5)  # past this, maintenance deletes superseded versions
KEYS_TABLE = "user_keys"
# Columns other than the vectors; what hydration reads.
META_COLUMNS = [
    "id", "user_id", "project_id", "session_id", "kind", "speaker", "text", "occurred_at",
    "created_at", "source_id", "content_hash", "seq", "prev_id", "derived_from", "metadata",
    "importance", "entities", "event_start", "event_end", "valid_from", "valid_to",
    "superseded_by", "mention_count", "access_count", "last_accessed_at",
]  # fmt: skip
# What the in-memory copy of a user holds beside ids and vectors: search filters and ranking read them.
HEAD_COLUMNS = ["kind", "project_id", "occurred_at", "session_id", "seq", "prev_id", "importance", "superseded_by"]
# Columns added after the first release: a log written before them gains them, empty, on open.
_LATER_COLUMNS = ("access_count", "last_accessed_at", "tokens")
# What a user's token blocks are read from (``tokens``: see token_store.pack; null for a record
# written before the column, or by an embedder without token vectors).
TOKEN_COLUMNS = ["id", "kind", "project_id", "occurred_at", "tokens"]
LACKS_TOKENS = "tokens IS NULL AND kind != 'episode'"  # written before the column; summaries never have them
_TS = pa.timestamp("us", tz="UTC")
_SCALAR_COLUMNS = ("id", "user_id", "session_id", "kind", "occurred_at", "event_start", "event_end")  # B-tree indexed
_MENTION = pa.struct([("key", pa.string()), ("name", pa.string()), ("type", pa.string()), ("role", pa.string())])


def sql_str(value: str) -> str:
    """Quote a string literal for a LanceDB filter."""
    return "'" + value.replace("'", "''") + "'"


def sql_in(column: str, values: list[str]) -> str:
    """``column IN (...)`` with quoted literals (``FALSE`` when empty)."""
    if not values:
        return "FALSE"
    return f"{column} IN ({', '.join(sql_str(v) for v in values)})"


def sql_ts(value: datetime) -> str:
    """A timestamp literal for a LanceDB filter (a year of four digits: strftime gives "1" for 0001)."""
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+02:00 is before the first UTC instant there is
        value = datetime.min if value.year == 1 else datetime.max
    return f"CAST('{value.replace(tzinfo=None).isoformat(timespec='microseconds')}' AS TIMESTAMP)"


@functools.cache
def _schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.string()),
            ("user_id", pa.string()),
            ("project_id", pa.string()),
            ("session_id", pa.string()),
            ("kind", pa.string()),
            ("speaker", pa.string()),
            ("text", pa.string()),
            ("occurred_at", _TS),
            ("created_at", _TS),
            ("source_id", pa.string()),
            ("content_hash", pa.string()),
            ("seq", pa.int64()),
            ("prev_id", pa.string()),
            ("derived_from", pa.list_(pa.string())),
            ("metadata", pa.string()),
            ("importance", pa.float32()),
            ("entities", pa.list_(_MENTION)),
            ("event_start", _TS),
            ("event_end", _TS),
            ("valid_from", _TS),
            ("valid_to", _TS),
            ("superseded_by", pa.string()),
            ("mention_count", pa.int32()),
            ("access_count", pa.int32()),
            ("last_accessed_at", _TS),
            ("embedding", pa.list_(pa.float32(), dim)),
            ("vector", pa.list_(pa.float32(), dim)),
            ("tokens", pa.binary()),
        ]
    )


_DOC_COLUMNS = [f.name for f in fields(DocRecord) if f.name != "alone"]


def _row_to_record(row: dict[str, Any]) -> Record:
    data = {k: row[k] for k in META_COLUMNS if k in row}
    if data.get("access_count") is None:
        data["access_count"] = 0
    data["metadata"] = json.loads(row.get("metadata") or "{}")
    data["entities"] = [EntityMention(**m) for m in (row.get("entities") or [])]
    data["derived_from"] = list(row.get("derived_from") or [])
    for key in ("occurred_at", "created_at", "event_start", "event_end", "valid_from", "valid_to", "last_accessed_at"):
        value = data.get(key)
        if isinstance(value, datetime) and value.tzinfo is None:
            data[key] = value.replace(tzinfo=UTC)
    return Record.model_validate(data)

def _matrix(column: pa.ChunkedArray) -> np.ndarray:
    """A fixed-size-list vector column as one float32 matrix, copied once."""
    if not len(column):  # a user with no records: still one column per dimension
        return np.zeros((0, column.type.list_size), dtype=np.float32)
    parts = [chunk.flatten().to_numpy(zero_copy_only=False) for chunk in column.chunks]
    return np.concatenate(parts).reshape(len(column), -1)


def _head_arrays(data: pa.Table, names: list[str] = HEAD_COLUMNS) -> dict[str, np.ndarray]:
    """Head columns (all by default) as arrays without nulls, occurred_at in microseconds since the epoch
    (a 100k-row user loaded in about half the time of going through Python lists)."""
    defaults: dict[str, Any] = {"importance": 0.5, "seq": 0, "occurred_at": 0}
    out: dict[str, np.ndarray] = {}
    for name in names:
        column = data.column(name)
        if name == "occurred_at":
            column = column.cast(pa.int64())
        out[name] = pc.fill_null(column, defaults.get(name, "")).to_numpy()
    return out


def _asks(data: pa.Table) -> np.ndarray:
    """``Record.asks`` of each row (``model.asks_question``), computed by pyarrow: a user's
    speakers and texts are read once, when the user is loaded into memory."""
    speaker = pc.utf8_lower(pc.fill_null(data.column("speaker"), ""))
    requesting = pc.is_in(speaker, value_set=pa.array(REQUESTING_ROLES))
    asked = pc.match_substring_regex(pc.fill_null(data.column("text"), ""), QUESTION_PATTERN)
    asks = pc.and_(pc.and_(pc.equal(data.column("kind"), "message"), pc.invert(requesting)), asked)
    return pc.fill_null(asks, False).to_numpy(zero_copy_only=False).astype(bool)


def _alone(data: pa.Table) -> np.ndarray:
    """``Record.alone`` of each row (``model.stands_alone``), computed by pyarrow like ``_asks``.

    Words are counted only in texts long enough to hold that many (0.27 -> 0.13 s for 105k
    rows): a word and the space after it take two ASCII characters, and no text has more
    words than characters plus one (kana and han count once each and once more in the run
    they are part of: "猫" is two)."""
    text = pc.fill_null(data.column("text"), "")
    length = pc.utf8_length(text)
    long_enough = pc.or_(
        pc.greater(length, 2 * STANDALONE_WORDS),
        pc.and_(pc.greater_equal(length, STANDALONE_WORDS), pc.invert(pc.string_is_ascii(text))),
    )
    rows = pc.indices_nonzero(pc.and_(pc.equal(data.column("kind"), "message"), long_enough))
    alone = np.zeros(len(text), dtype=bool)
    if len(rows):
        some = pc.take(text, rows)
        words = pc.add(pc.count_substring_regex(some, WORD_PATTERN), pc.count_substring_regex(some, UNSPACED_PATTERN))
        alone[rows.to_numpy()] = pc.greater(words, STANDALONE_WORDS).to_numpy(zero_copy_only=False)
    return alone


class LanceLog:
    """The record log in one LanceDB database.

    Args:
        path: Directory of the LanceDB database.
        ann_min_rows: Build an approximate vector index once the table has this many rows.
        cache_records: Records kept in memory for hydration (0 disables the cache).
        cache_vectors_per_user: Users with at most this many records are searched in memory.
        cache_tokens_per_user: Users with at most this many token vectors have them held in memory.
        read_only: Open the log without writing to it (a data directory that cannot be written):
            the schema is taken as it is, and a log that lacks a table reads as empty.
    """

    def __init__(
        self, path: Path, *, ann_min_rows: int = 50_000, cache_records: int = 20_000,
        cache_vectors_per_user: int = 200_000, cache_tokens_per_user: int = 2_000_000,
        read_only: bool = False,
    ) -> None:
        self.cache = RecordCache(cache_records)
        # Compaction rewrites fragments; an update or delete committed meanwhile makes it fail
        # ("Rewrite preempted by Update"). Appends commute with it and never take this lock.
        # Reentrant: a purge holds it and rewrites fragments, each batch of which takes it.
        self._rewrite_lock = threading.RLock()
        self.vector_cache = VectorCache(max_user_rows=cache_vectors_per_user)
        self.token_cache = TokenCache(max_user_tokens=cache_tokens_per_user)
        if not read_only:
            path.mkdir(parents=True, exist_ok=True)
        self._maintained = path / "maintenance.json"  # small fragments the last maintenance left
        self._rewrites = path / "purge.json"  # per table, the fragments holding rows deleted since the last purge
        try:
            saved = json.loads(self._rewrites.read_text(encoding="utf-8"))
            self._to_rewrite: dict[str, set[int]] = {name: set(frags) for name, frags in saved.items()}
        except (OSError, ValueError, AttributeError, TypeError):
            self._to_rewrite = {}
        configure_lance()  # before Lance's first use sizes its pool
        self._db = lancedb.connect(str(path))
        self._ann_min_rows = ann_min_rows
        self._scalar_min_rows = max(1, ann_min_rows // 10)
        self._table: Any = None
        self._dim: int | None = None
        self._lock = threading.Lock()
        names = self._db.table_names()
        if TABLE in names:
            self._table = self._db.open_table(TABLE)
            if not read_only:
                self._add_later_columns()
        self._keys: Any = None  # read-only, and never written to
        if KEYS_TABLE in names:
            self._keys = self._db.open_table(KEYS_TABLE)
        elif not read_only:
            schema = pa.schema([("user_id", pa.string()), ("salt", pa.binary())])
            self._keys = self._db.create_table(KEYS_TABLE, schema=schema)
        self._salts: dict[str, bytes] = {}
        self._seq = self._load_max_seq()

    # -- schema and writes -------------------------------------------------------------

    @property
    def dim(self) -> int | None:
        """Vector dimension, or None before the first write."""
        if self._table is None:
            return None
        if self._dim is None:  # reading a LanceDB schema costs ~2 ms; the vector width never changes
            self._dim = int(self._table.schema.field("vector").type.list_size)
        return self._dim

    def _ensure_table(self, dim: int) -> Any:
        if self._table is None:
            self._table = self._db.create_table(TABLE, schema=_schema(dim))
        elif self.dim != dim:
            raise ValueError(
                f"the log holds {self.dim}-dimensional vectors but the embedder makes {dim}; "
                "use the model the data was written with, or start a new data directory"
            )
        return self._table

    def _add_later_columns(self) -> None:
        missing = [name for name in _LATER_COLUMNS if name not in self._table.schema.names]
        if missing:
            full = _schema(self.dim or 1)
            self._table.add_columns([full.field(name) for name in missing])

    def _load_max_seq(self) -> int:
        if self._table is None or self._table.count_rows() == 0:
            return 0
        seqs = self._table.search().select(["seq"]).limit(None).to_arrow().column("seq")
        return int(pc.max(seqs).as_py() or 0)

    def next_seqs(self, n: int) -> list[int]:
        """Reserve ``n`` consecutive sequence numbers (write order across the whole log)."""
        with self._lock:
            start = self._seq + 1
            self._seq += n
        return list(range(start, start + n))

    def add(
        self, records: list[Record], embeddings: np.ndarray, vectors: np.ndarray,
        tokens: list[bytes | None] | None = None,
    ) -> None:  # fmt: skip
        """Append records with their raw embeddings, their search vectors and, when given,
        their packed token vectors (``token_store.pack``; None for a record without)."""
        if not records:
            return
        dim = int(vectors.shape[1])
        table = self._ensure_table(dim)
        columns: dict[str, list[Any]] = {name: [] for name in META_COLUMNS}
        for rec in records:
            data = rec.model_dump()
            for name in META_COLUMNS:
                columns[name].append(data[name])
        columns["metadata"] = [json.dumps(m, ensure_ascii=False, default=str) for m in columns["metadata"]]
        arrays = [pa.array(columns[name], type=_schema(dim).field(name).type) for name in META_COLUMNS]
        flat_e = pa.array(np.ascontiguousarray(embeddings, dtype=np.float32).ravel())
        flat_v = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
        arrays.append(pa.FixedSizeListArray.from_arrays(flat_e, dim))
        arrays.append(pa.FixedSizeListArray.from_arrays(flat_v, dim))
        tokens = tokens if tokens is not None else [None] * len(records)
        arrays.append(pa.array(tokens, type=pa.binary()))
        written = pa.Table.from_arrays(arrays, schema=_schema(dim))
        table.add(written)
        if any(self.cache.holds_whole(u) for u in {r.user_id for r in records}):  # read back as a read would
            self.cache.put_new([_row_to_record(row) for row in written.select(META_COLUMNS).to_pylist()])
        for user_id in {r.user_id for r in records}:
            rows = [i for i, r in enumerate(records) if r.user_id == user_id]
            mine = [records[i] for i in rows]
            more = UserVectors.build(
                [r.id for r in mine], vectors[rows], {name: [getattr(r, name) for r in mine] for name in HEAD_COLUMNS}
                | {"asks": [r.asks for r in mine], "alone": [r.alone for r in mine]},
            )
            self.vector_cache.extend(user_id, more)
            packed = [j for j, i in enumerate(rows) if tokens[i] is not None]  # the filter columns: the snapshot's
            self.token_cache.extend(user_id, TokenBlock.build(
                [more.ids[j] for j in packed], [tokens[rows[j]] for j in packed],  # type: ignore[misc]
                more.kinds[packed], more.projects[packed], more.occurred[packed]))  # fmt: skip

    @contextmanager
    def _changing(self, ids: list[str] | None, *, vectors: bool = False, user_id: str | None = None) -> Iterator[None]:
        """Rewrite rows under the rewrite lock, dropping their cached copies before and after:
        a read between the two could otherwise cache the old rows again. With ``vectors``,
        the in-memory vectors go too: ``user_id``'s alone when the rewrite is confined to
        that user's rows, else every user's."""
        with self._rewrite_lock:
            self._drop_cached(ids, vectors, user_id)
            try:
                yield
            finally:
                self._drop_cached(ids, vectors, user_id)

    def _drop_cached(self, ids: list[str] | None, vectors: bool, user_id: str | None) -> None:
        self.cache.evict(ids, user_id if ids is None else None)  # no ids: all of that user's, or everyone's
        if vectors:
            self.vector_cache.invalidate(user_id)
            self.token_cache.invalidate(user_id)

    @staticmethod
    def _of_user(where: str, user_id: str | None) -> str:
        """``where``, confined to one user's rows when a user is named."""
        return where if user_id is None else f"user_id = {sql_str(user_id)} AND ({where})"

    def update_vectors(self, ids_to_vectors: dict[str, tuple[str, np.ndarray]], user_id: str | None = None) -> None:
        """Set ``prev_id`` and the search vector of some records (after a neighbour was forgotten).
        Naming their user confines the update to that user's rows, and keeps other users'
        vectors in memory."""
        with self._changing(list(ids_to_vectors), vectors=True, user_id=user_id):
            if self._table is None:
                return
            # An update leaves the old copy where it was: note those fragments, in one read.
            self._note_fragments(self._table, self._of_user(sql_in("id", list(ids_to_vectors)), user_id))
            for rid, (prev_id, vector) in ids_to_vectors.items():
                where = self._of_user(f"id = {sql_str(rid)}", user_id)
                self._table.update(where=where, values={"prev_id": prev_id, "vector": [float(x) for x in vector]})

    def set_superseded(self, rid: str, by_id: str, valid_to: datetime | None, user_id: str | None = None) -> None:
        """Close a record's validity: ``valid_to`` and the id of the fact that replaced it (or
        reopen it: "" and None)."""
        with self._changing([rid]):
            if self._table is not None:
                self._note_fragments(self._table, f"id = {sql_str(rid)}")
                self._table.update(where=f"id = {sql_str(rid)}", values={"superseded_by": by_id, "valid_to": valid_to})
                self.vector_cache.mark_superseded(rid, by_id, user_id)

    def set_tokens(self, user_id: str, tokens: dict[str, bytes]) -> None:
        """Store packed token vectors for some of a user's records (a backfill of records
        written before the column)."""
        with self._changing(list(tokens), vectors=True, user_id=user_id):
            if self._table is None or not tokens:
                return
            self._set_columns({"id": list(tokens), "tokens": list(tokens.values())})

    def set_vectors(self, user_id: str, vectors: dict[str, np.ndarray]) -> None:
        """Set the search vectors of some of a user's records, in one merge."""
        with self._changing(list(vectors), vectors=True, user_id=user_id):
            if self._table is None or not vectors:
                return
            values = [np.asarray(v, np.float32) for v in vectors.values()]
            self._set_columns({"id": list(vectors), "vector": values})

    def set_mention_counts(self, counts: dict[str, int]) -> None:
        """Set mention counts (facts said again)."""
        with self._changing(list(counts)):
            if self._table is None or not counts:
                return
            self._set_columns({"id": list(counts), "mention_count": list(counts.values())})

    def add_accesses(self, counts: dict[str, int], when: datetime) -> None:
        """Add ``counts[id]`` retrievals to each record and stamp ``when`` as its last access."""
        with self._changing(list(counts)):
            if self._table is None or not counts:
                return
            ids = list(counts)
            current = {row["id"]: row["access_count"] or 0
                       for start in range(0, len(ids), 500)
                       for rows in self.scan(sql_in("id", ids[start : start + 500]), ["id", "access_count"])
                       for row in rows}  # fmt: skip
            found = list(current)
            self._set_columns({"id": found, "access_count": [current[rid] + counts[rid] for rid in found],
                               "last_accessed_at": [when] * len(found)})  # fmt: skip

    def _set_columns(self, columns: dict[str, list[Any]]) -> None:
        """Set some columns of the rows with these ids, in one merge: an update per distinct value
        rewrote the table once per value (715 distinct access counts on a well-used LoCoMo store:
        a flush that ran for minutes, against ~0.2 s merged). Ids no longer in the log are skipped."""
        schema = _schema(self.dim or 1)
        source = pa.table({name: pa.array(values, type=schema.field(name).type) for name, values in columns.items()})
        self._table.merge_insert("id").when_matched_update_all().execute(source)

    def delete(self, ids: list[str], user_id: str | None = None) -> int:
        """Delete records by id; returns how many existed. Naming their user confines the
        delete to that user's rows, and keeps other users' vectors in memory."""
        with self._changing(ids, vectors=True, user_id=user_id):
            if self._table is None or not ids:
                return 0
            deleted = 0
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                where = self._of_user(sql_in("id", chunk), user_id)
                deleted += self._table.count_rows(where)
                self._delete(self._table, where)
            return deleted

    def delete_where(self, where: str, user_id: str | None = None) -> None:
        """Delete every record matching a filter (of ``user_id``'s rows only, when named)."""
        with self._changing(None, vectors=True, user_id=user_id):
            if self._table is not None:
                self._delete(self._table, self._of_user(where, user_id))

    def _delete(self, table: Any, where: str) -> None:
        """Delete rows, first noting the fragments that hold them."""
        self._note_fragments(table, where)
        table.delete(where)

    def _note_fragments(self, table: Any, where: str) -> None:
        """Note the fragments holding these rows, before a delete or an update leaves a marked
        copy of them there (kept on disk until ``purge`` has rewritten those fragments, so a
        crash in between does not lose them)."""
        rows = table.search().where(where).with_row_id(True).select([]).limit(None).to_arrow()
        fragments = {int(r) >> 32 for r in rows.column("_rowid").to_pylist()}
        noted = self._to_rewrite.setdefault(table.name, set())
        if not fragments <= noted:
            noted |= fragments
            self._save_to_rewrite()

    def _save_to_rewrite(self) -> None:
        scratch = self._rewrites.with_suffix(".tmp")
        scratch.write_text(json.dumps({k: sorted(v) for k, v in self._to_rewrite.items()}), encoding="utf-8")
        os.replace(scratch, self._rewrites)

    def rewrite_deleted(self) -> None:
        """Rewrite the fragments that hold rows deleted so far, beside appends; the old
        versions that still refer to their files go at ``drop_unreferenced``, which ends a purge.

        A delete only marks rows. Compaction rewrites a fragment for its deletions alone once
        a tenth of its rows are gone, and never merges fragments under different deltas of the
        vector index: one message forgotten out of forty, or out of a 100k-record log, stayed
        in its file. So each such fragment's remaining rows are written again, unchanged (a
        merge on the key, in batches: every batch is one commit, no reader misses a row), and
        a fragment left with no rows leaves the table: ~3 s for a 100k-record fragment.
        Updates and deletes wait for one batch at a time (~0.4-1 s there), or for the closing
        compaction (1-2 s), not for the whole. Fragments noted meanwhile wait for the next
        purge: what they hold was not yet deleted when this one began.

        Old versions are dropped as maintenance drops them, not all: dropping the version an
        append began from, before it commits, loses the append (Lance issue #3718).
        ``drop_unreferenced`` drops the rest, with no append running.
        """
        with self._rewrite_lock:
            noted = {name: sorted(fragments) for name, fragments in self._to_rewrite.items()}
        for table, key in self._keyed_tables():
            fragments = noted.get(table.name, [])
            for fragment in fragments:
                self._rewrite_fragment(table, key, fragment)
            with self._rewrite_lock, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if table is self._table and fragments:
                    self._drop_index_copies()
                table.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                self._to_rewrite[table.name] = self._to_rewrite.get(table.name, set()) - set(fragments)
                self._save_to_rewrite()

    def drop_unreferenced(self) -> None:
        """Drop every old version (the rewritten fragments' files go with them) and every
        file no version refers to: a failed commit's (a compaction an update preempted could
        have copied a row deleted since). Must not run beside an append: it could drop the
        version the append began from, and its files look unreferenced until it commits."""
        with self._rewrite_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for table, _ in self._keyed_tables():
                table.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)

    def purge(self) -> None:
        """Take every deleted row's bytes off the disk (``rewrite_deleted``, then
        ``drop_unreferenced``); must not run beside an append."""
        with self._rewrite_lock:
            self.rewrite_deleted()
            self.drop_unreferenced()

    def _keyed_tables(self) -> list[tuple[Any, str]]:
        """The tables a purge rewrites, with the column that keys their rows."""
        return [(table, key) for table, key in ((self._table, "id"), (self._keys, "user_id")) if table is not None]

    def _drop_index_copies(self) -> None:
        """Indexes keep their own copies of what they index: the ids and session ids of deleted
        rows stayed in the B-tree pages, their vectors in the vector index. The B-trees are
        rebuilt (0.13 s for seven of them at 100k rows); the vector index (55 s to build there)
        is dropped, for the next ``maintain`` (after more writes, or at start) to build again.
        Meanwhile vector search scans exactly; it only serves users too large to hold in memory."""
        names = {idx.name for idx in self._table.list_indices()}
        for column in _SCALAR_COLUMNS:
            if f"{column}_idx" in names:
                self._table.create_index(column, config=BTree(), name=f"{column}_idx", replace=True)
        if "vector_idx" in names:
            self._table.drop_index("vector_idx")

    def _rewrite_fragment(self, table: Any, key: str, fragment: int, batch: int = 20_000) -> None:
        """Write a fragment's rows again: the old copies are marked, the fragment goes when
        all are. Row ids here are row addresses: the fragment in the high 32 bits. Each batch
        is read and written under the rewrite lock; an update between two moves its row out
        of the fragment, and the next batch does not see it."""
        base = fragment << 32
        here = f"_rowid >= {base} AND _rowid < {base + (1 << 32)}"
        offsets = table.search().where(here).with_row_id(True).select([]).limit(None).to_arrow()
        if offsets.num_rows == 0:
            return
        end = int(pc.max(offsets.column("_rowid")).as_py()) + 1
        for start in range(base, end, batch):
            with self._rewrite_lock:
                rows = table.search().where(f"_rowid >= {start} AND _rowid < {min(start + batch, end)}").limit(None)
                rows = rows.to_arrow()
                if rows.num_rows:
                    table.merge_insert(key).when_matched_update_all().execute(rows)

    # -- per-user secrets ----------------------------------------------------------------

    def user_salt(self, user_id: str, *, create: bool = True) -> bytes | None:
        """The random secret that keys this user's hashed names in the graph."""
        salt = self._salts.get(user_id)
        if salt is not None:
            return salt
        if self._keys is None:  # a log opened read-only that never had a user
            return None
        with self._lock:
            rows = self._keys.search().where(f"user_id = {sql_str(user_id)}").select(["salt"]).to_list()
            if rows:
                salt = bytes(rows[0]["salt"])
            elif create:
                salt = os.urandom(32)
                self._keys.add(pa.table({"user_id": [user_id], "salt": [salt]}))
            else:
                return None
            self._salts[user_id] = salt
            return salt

    def drop_user_salt(self, user_id: str) -> None:
        """Destroy a user's secret: what the graph kept of them can no longer be linked to names."""
        with self._lock, self._rewrite_lock:  # the rewrite lock: it guards the noted fragments
            self._salts.pop(user_id, None)
            self._delete(self._keys, f"user_id = {sql_str(user_id)}")

    def maintain(self) -> None:
        """Compact the fragments many small writes leave, and index what has grown big enough.

        Scalar (B-tree) indexes on the filtered columns past ``scalar_min_rows``, the
        approximate vector index past ``ann_min_rows``; new rows are folded into existing
        indexes. Versions older than ``OLD_VERSIONS_KEPT`` go: at LanceDB's default week,
        each compaction's superseded files stayed, and a store grew fifteen times its size
        in an hour of ingest (``purge`` drops them all at once).
        """
        if self._table is None:
            return
        rows = self._table.count_rows()
        names = {idx.name for idx in self._table.list_indices()}
        if rows >= self._scalar_min_rows:
            for column in _SCALAR_COLUMNS:
                if f"{column}_idx" not in names:
                    self._table.create_index(column, config=BTree(), name=f"{column}_idx")
        if rows >= self._ann_min_rows and "vector_idx" not in names:
            self._table.create_index("vector", config=HnswSq(distance_type="cosine"), name="vector_idx")
        with self._rewrite_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for attempt in range(3):
                try:
                    self._table.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                    break
                except RuntimeError as exc:  # a commit conflict is retryable; anything else is not
                    if "conflict" not in str(exc).lower() or attempt == 2:
                        raise
        left = {"small_fragments_left": self.small_fragments()}
        scratch = self._maintained.with_suffix(".tmp")
        scratch.write_text(json.dumps(left), encoding="utf-8")
        scratch.replace(self._maintained)

    def needs_vector_index(self) -> bool:
        """Whether the log is past ``ann_min_rows`` without its vector index (``maintain`` builds it)."""
        if self._table is None or self._table.count_rows() < self._ann_min_rows:
            return False
        return "vector_idx" not in {idx.name for idx in self._table.list_indices()}

    def small_fragments(self) -> int:
        """How many small fragments the log holds (each small append or update leaves one)."""
        if self._table is None:
            return 0
        return int(self._table.stats()["fragment_stats"]["num_small_fragments"])

    def fragments_to_compact(self) -> int:
        """Small fragments beyond those the last maintenance left.

        Compaction does not merge fragments covered by different deltas of the vector index
        (a 100k-record log kept 56 through every compaction): without this, each start of
        such a store ran a compaction that changed nothing.
        """
        try:
            left = int(json.loads(self._maintained.read_text(encoding="utf-8"))["small_fragments_left"])
        except (OSError, ValueError, KeyError, TypeError):
            left = 0
        return max(0, self.small_fragments() - left)

    # -- reads -------------------------------------------------------------------------

    def count(self, where: str | None = None) -> int:
        """Rows matching ``where`` (all rows when None)."""
        if self._table is None:
            return 0
        return int(self._table.count_rows(where))

    def select(
        self, where: str, columns: list[str] | None = None, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Rows matching a filter, as dicts of the given columns."""
        if self._table is None:
            return []
        query = self._table.search().where(where).select(columns or META_COLUMNS).limit(limit)
        return query.to_arrow().to_pylist()

    def columns(self, where: str, columns: list[str]) -> dict[str, list[Any]]:
        """Rows matching a filter, column by column (a list per column, rows in the same order):
        no dict per row, for reads of a large user's every row."""
        if self._table is None:
            return {c: [] for c in columns}
        return self._table.search().where(where).select(columns).limit(None).to_arrow().to_pydict()

    def mention_counts(self, user_id: str) -> tuple[list[tuple[str, str, str, str, int]], int]:
        """How often each distinct (key, name, type, role) occurs among a user's entity mentions,
        in the order each first occurs in the log; and the last seq of the user's records read.

        Counted in Arrow: turning 415k mentions of a 100k-record user into Python objects
        one by one took ~1.1 s of the first recall, counting them ~0.15 s.
        """
        if self._table is None:
            return [], 0
        query = self._table.search().where(f"user_id = {sql_str(user_id)}").select(["seq", "entities"]).limit(None)
        data = query.to_arrow().sort_by("seq")  # write order, whatever a purge's rewrite did to the file order
        upto = int(data.column("seq")[-1].as_py()) if data.num_rows else 0
        flat = pc.list_flatten(data.column("entities"))
        if len(flat) == 0:
            return [], upto
        flat = pa.concat_arrays(flat.chunks) if isinstance(flat, pa.ChunkedArray) else flat
        fields = ["key", "name", "type", "role"]
        table = pa.table({**{f: pc.struct_field(flat, f) for f in fields}, "at": np.arange(len(flat))})
        counted = table.group_by(fields, use_threads=False).aggregate([("at", "min"), ("at", "count")])
        counted = counted.sort_by("at_min")
        columns = [counted.column(f).to_pylist() for f in fields] + [counted.column("at_count").to_pylist()]
        return [(k or "", n or "", t or "", r or "", c) for k, n, t, r, c in zip(*columns, strict=True)], upto

    def records(self, where: str, limit: int | None = None) -> list[Record]:
        """Records matching a filter."""
        return [_row_to_record(row) for row in self.select(where, META_COLUMNS, limit)]

    def iter_records(self, where: str | None) -> Iterator[Record]:
        """Stream every record matching a filter (unordered)."""
        for rows in self.scan(where, META_COLUMNS):
            for row in rows:
                yield _row_to_record(row)

    def doc_records(self, where: str) -> list[DocRecord]:
        """What the BM25 documents of the records matching a filter read, in write order (with
        ``alone`` computed by pyarrow, as when a user is loaded into memory)."""
        if self._table is None:
            return []
        data = self._table.search().where(where).select(_DOC_COLUMNS).limit(None).to_arrow().sort_by("seq")
        return [DocRecord(**{k: v if v is not None else "" for k, v in row.items()}, alone=bool(alone))
                for row, alone in zip(data.to_pylist(), _alone(data), strict=True)]  # fmt: skip

    def get(self, user_id: str, ids: list[str]) -> dict[str, Record]:
        """Records of one user by id; unknown ids are absent from the result."""
        if not ids:
            return {}
        found, missing = self.cache.get_many(user_id, ids)
        if not missing:
            return found
        epoch = self.cache.epoch()
        if self._load_whole(user_id):
            # One scan of the whole user costs about what reading these ids does (the filter,
            # not the rows, is the cost), and every later query is then served from memory:
            # a fresh server's first LoCoMo recalls went from 88 to 23 ms (p50).
            read = self.records(f"user_id = {sql_str(user_id)}")
            self.cache.put(read, epoch, whole_user=user_id)
            wanted = set(missing)
            found.update({rec.id: rec for rec in read if rec.id in wanted})
            return found
        read = self.records(f"user_id = {sql_str(user_id)} AND {sql_in('id', missing)}")
        self.cache.put(read, epoch)
        found.update({rec.id: rec for rec in read})
        return found

    def _load_whole(self, user_id: str) -> bool:
        """Whether to read a user's records whole into the cache: a user of known size (the vector
        cache holds them) small enough to leave room for others, and not already there."""
        if self.cache.holds_whole(user_id):
            return False
        vectors = self.vector_cache.get(user_id)
        limit = min(WHOLE_USER_MAX, self.cache.capacity // WHOLE_USER_SHARE)
        return vectors is not None and 0 < len(vectors) <= limit

    def vectors(self, user_id: str, ids: list[str], column: str = "embedding") -> dict[str, np.ndarray]:
        """Stored vectors of some records."""
        if self._table is None or not ids:
            return {}
        rows = self.select(f"user_id = {sql_str(user_id)} AND {sql_in('id', ids)}", ["id", column])
        return {row["id"]: np.asarray(row[column], dtype=np.float32) for row in rows}

    def _user_vectors(self, user_id: str) -> UserVectors | None:
        """The user's vectors in memory, loaded on first use; None for a user too large to cache."""
        entry = self.vector_cache.get(user_id)
        if entry is not None or self._table is None:
            return entry
        generation = self.vector_cache.generation(user_id)
        where = f"user_id = {sql_str(user_id)}"
        if self._table.count_rows(where) > self.vector_cache.max_user_rows:
            return None
        table = self._table.search().where(where).select(["id", *HEAD_COLUMNS, "speaker", "text", "vector"])
        data = table.limit(None).to_arrow()
        columns = _head_arrays(data)
        columns["asks"] = _asks(data)
        columns["alone"] = _alone(data)
        entry = UserVectors.build(data.column("id").to_pylist(), _matrix(data.column("vector")), columns)
        self.vector_cache.put(user_id, entry, generation)
        return entry

    def token_blocks(self, user_id: str, *, scan: bool = False, most: int = 0) -> Iterator[TokenBlock]:
        """A user's packed token vectors, in blocks: from memory, else read from the log and held
        when they fit the token cache. A user too large to hold is read a batch at a time when
        ``scan`` is set (a full read of the user per call, never all in memory at once), and
        yields nothing otherwise; nor does a user with more than ``most`` records, when ``most``
        is set (checked before anything is read)."""
        if self._table is None or (not scan and self.token_cache.too_large(user_id)):  # not read again
            return
        if most and self._records_of(user_id) > most:
            return
        held = self.token_cache.get(user_id)
        if held is not None:
            yield from held
            return
        generation, stamp = self.token_cache.generation(user_id), self.token_cache.size_stamp(user_id)
        query = self._table.search().where(f"user_id = {sql_str(user_id)} AND tokens IS NOT NULL")
        loaded: list[TokenBlock] = []
        total = 0
        for batch in query.select(TOKEN_COLUMNS).limit(None).to_batches(5_000):
            heads = _head_arrays(pa.Table.from_batches([batch]), ["kind", "project_id", "occurred_at"])
            block = TokenBlock.build(batch.column("id").to_pylist(), batch.column("tokens").to_pylist(),
                                     kind_code_array(heads["kind"]), heads["project_id"], heads["occurred_at"])  # fmt: skip
            total += block.tokens
            if total <= self.token_cache.max_user_tokens:
                loaded.append(block)
                continue
            if not scan:
                self.token_cache.mark_too_large(user_id, stamp)
                return
            yield from loaded  # too large to hold: what was read so far, then each batch as it comes
            loaded = []
            yield block
        if total <= self.token_cache.max_user_tokens:
            self.token_cache.put(user_id, tuple(loaded), generation)
            yield from self.token_cache.get(user_id) or tuple(loaded)
        else:
            self.token_cache.mark_too_large(user_id, stamp)

    def _records_of(self, user_id: str) -> int:
        """How many records a user has: from memory when their vectors are held."""
        entry = self.vector_cache.get(user_id)
        return len(entry) if entry is not None else self.count(f"user_id = {sql_str(user_id)}")

    def heads(self, user_id: str, ids: list[str]) -> dict[str, RecordHead] | None:
        """What ranking reads of some records, from memory; None if the user is not held there
        (then read the records). Unknown ids are absent."""
        entry = self.vector_cache.get(user_id)
        return None if entry is None else entry.heads(ids)

    def user_view(self, user_id: str) -> UserVectors | None:
        """A user's rows in memory (ids, vectors, kinds, sessions, order), if small enough to hold."""
        return self._user_vectors(user_id)

    def vector_search(
        self,
        user_id: str,
        vector: np.ndarray | Callable[[], np.ndarray],
        k: int,
        *,
        kinds: list[str] | None = None,
        project_id: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> list[tuple[str, float]]:
        """Nearest records of one user by cosine similarity: (id, similarity), best first.

        Exact, from memory, for users the vector cache holds; LanceDB (ANN past
        ``ann_min_rows``) for the others. ``vector`` may be a function that computes it: it is
        called after the user's vectors are loaded, so on a first search the load overlaps
        the embedding model's (0.5 s for 100k records, while the model takes seconds at start).
        """
        if self._table is None:
            return []
        entry = self._user_vectors(user_id)
        vector = vector() if callable(vector) else vector
        if entry is not None:
            return entry.search(vector, k, kinds=kinds, project_id=project_id, after=after, before=before)
        parts = [f"user_id = {sql_str(user_id)}"]
        if kinds:
            parts.append(sql_in("kind", kinds))
        if project_id:
            parts.append(f"project_id = {sql_str(project_id)}")
        if after is not None:
            parts.append(f"occurred_at >= {sql_ts(after)}")
        if before is not None:
            parts.append(f"occurred_at < {sql_ts(before)}")
        flt = " AND ".join(parts)
        query = (
            self._table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector")
            .distance_type("cosine")
            .where(flt, prefilter=True)
            .select(["id", "_distance"])
            .limit(k)
        )
        rows = query.to_arrow().to_pylist()
        return [(row["id"], 1.0 - float(row["_distance"])) for row in rows]

    def scan(self, where: str | None, columns: list[str], batch_rows: int = 5_000) -> Iterator[list[dict[str, Any]]]:
        """Stream rows matching a filter in batches (for rebuilds)."""
        if self._table is None:
            return
        query = self._table.search().select(columns).limit(None)
        if where:
            query = query.where(where)
        for batch in query.to_batches(batch_rows):
            yield batch.to_pylist()

    def user_ids(self) -> list[str]:
        """Every user with at least one record."""
        if self._table is None:
            return []
        col = self._table.search().select(["user_id"]).limit(None).to_arrow().column("user_id")
        return sorted(set(col.to_pylist()))
