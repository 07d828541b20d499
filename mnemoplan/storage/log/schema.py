"""The log's table: its columns, and rows turned into records and into arrays.

Kinds are held in memory as small codes and times as microseconds since the epoch, so that
the caches of a user's rows filter them with numpy (``filters.mask``).
"""

from __future__ import annotations

import functools
import json
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from collections.abc import Iterable
from typing import Any, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mnemoplan.model import DocRecord, EntityMention, Record, as_utc
from mnemoplan.model.records import StoredKind
from mnemoplan.model.records import (
    QUESTION_PATTERN,
    REQUESTING_ROLES,
    STANDALONE_WORDS,
    UNSPACED_PATTERN,
)

TABLE = "records"
KEYS_TABLE = "user_keys"
# Columns other than the vectors; what hydration reads.
META_COLUMNS = [
    "id", "user_id", "project_id", "session_id", "kind", "speaker", "text", "occurred_at",
    "created_at", "source_id", "content_hash", "seq", "prev_id", "derived_from", "metadata",
    "importance", "entities", "event_start", "event_end", "valid_from", "valid_to",
    "superseded_by", "mention_count", "access_count", "last_accessed_at",
]  # fmt: skip
# What the in-memory copy of a user holds beside ids and vectors: search filters and ranking read them.
HEAD_COLUMNS = [
    "kind", "project_id", "occurred_at", "session_id", "seq", "prev_id", "importance", "superseded_by",
]  # fmt: skip
# Columns added after the first release: a log written before them gains them, empty, on open.
LATER_COLUMNS = ("access_count", "last_accessed_at", "tokens")
# What a user's token blocks are read from (``tokens``: see token_cache.pack; null for a record
# written before the column, or by an embedder without token vectors).
TOKEN_COLUMNS = ["id", "kind", "project_id", "occurred_at", "tokens"]
_TS = pa.timestamp("us", tz="UTC")
# B-tree indexed: every read of the log names a user or ids (or rows' addresses), and merges join
# on ``id``. Each B-tree costs every purge's commit a remap of the whole index, and every
# compaction a fold (~0.1 s for ``user_id`` at 1.6M rows, ~0.2 s for ``id``); the session, kind and
# time columns' B-trees (an earlier version's: ``UNUSED_SCALAR_INDEXES``) narrowed nothing the
# user's B-tree had not already narrowed to a user's rows.
SCALAR_COLUMNS = ("id", "user_id")
UNUSED_SCALAR_INDEXES = ("session_id_idx", "kind_idx", "occurred_at_idx", "event_start_idx", "event_end_idx")
_TIME_COLUMNS = (
    "occurred_at", "created_at", "event_start", "event_end", "valid_from", "valid_to", "last_accessed_at",
)  # fmt: skip
_MENTION = pa.struct([(name, pa.string()) for name in ("key", "name", "type", "role")])


KIND_CODES = {kind: code for code, kind in enumerate(get_args(StoredKind))}  # small ints: isin on strings is slow
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


NO_EVENT = np.iinfo(np.int64).min  # a record without an event time, among ``micros``
EVENT_COLUMNS = ["event_start", "event_end"]


def event_micros(data: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """``event_start`` and ``event_end`` of each row in ``micros``, ``NO_EVENT`` where null."""
    start, end = (pc.fill_null(data.column(c).cast(pa.int64()), NO_EVENT).to_numpy() for c in EVENT_COLUMNS)
    return start, end


def micros(when: datetime) -> int:
    """Microseconds since the epoch, exactly (``timestamp() * 1e6`` can be a microsecond off)."""
    return (as_utc(when) - EPOCH) // MICROSECOND


def kind_code_array(kinds: Iterable[str]) -> np.ndarray:
    """The code of each record's kind (-1 for an unknown one), as int8."""
    return np.asarray([KIND_CODES.get(k, -1) for k in kinds], dtype=np.int8)


def kind_codes(kinds: list[str]) -> list[int]:
    """The codes of some kinds (unknown kinds match nothing)."""
    return [KIND_CODES[k] for k in kinds if k in KIND_CODES]


@functools.cache
def table_schema(dim: int) -> pa.Schema:
    """The records table's schema, with vectors of ``dim`` dimensions."""
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


DOC_COLUMNS = [f.name for f in fields(DocRecord) if f.name != "alone"]
# What a user's graph entries are rebuilt from (``storage.documents.graph_records``, ``graph_tables``).
GRAPH_COLUMNS = ["id", "kind", "seq", "session_id", "prev_id", "occurred_at", "derived_from", "metadata", "entities"]
# And their BM25 documents too (``doc_records``), and their entity catalog (``mention_counts``).
OVERLAY_COLUMNS = list(dict.fromkeys([*DOC_COLUMNS, *GRAPH_COLUMNS]))


def mention_counts(data: pa.Table) -> tuple[list[tuple[str, str, str, str, int]], int]:
    """How often each distinct (key, name, type, role) occurs among the entity mentions of rows
    in write order (``seq``, ``entities``), in the order each first occurs; and their last seq
    (``LanceLog.mention_counts``). Counted in Arrow: turning a large user's mentions into Python
    objects one by one was most of the first recall's time."""
    upto = int(data.column("seq")[-1].as_py()) if data.num_rows else 0
    flat = pc.list_flatten(data.column("entities"))
    if len(flat) == 0:
        return [], upto
    flat = pa.concat_arrays(flat.chunks) if isinstance(flat, pa.ChunkedArray) else flat
    names = ["key", "name", "type", "role"]
    mentions = pa.table({**{f: pc.struct_field(flat, f) for f in names}, "at": np.arange(len(flat))})
    counted = mentions.group_by(names, use_threads=False).aggregate([("at", "min"), ("at", "count")])
    counted = counted.sort_by("at_min")
    columns = [counted.column(f).to_pylist() for f in names] + [counted.column("at_count").to_pylist()]
    return [(k or "", n or "", t or "", r or "", c) for k, n, t, r, c in zip(*columns, strict=True)], upto


def doc_records(data: pa.Table) -> list[DocRecord]:
    """The ``DocRecord`` of each row of a table of the log (``DOC_COLUMNS`` at least), column by
    column (a dict per row took longer than the read), strings with no value ""; ``alone``
    computed by pyarrow, as when a user is loaded into memory."""
    # ``DOC_COLUMNS`` are DocRecord's fields in order, ``alone`` the last (a test checks it).
    columns = [(data.column(c) if c == "seq" else pc.fill_null(data.column(c), "")).to_pylist()
               for c in DOC_COLUMNS]  # fmt: skip
    return [DocRecord(*row) for row in zip(*columns, alone(data).tolist(), strict=True)]


def row_to_record(row: dict[str, Any]) -> Record:
    """A row of the table (any of ``META_COLUMNS``) as a record; times without a zone are UTC."""
    data = {k: row[k] for k in META_COLUMNS if k in row}
    if data.get("access_count") is None:
        data["access_count"] = 0
    data["metadata"] = json.loads(row.get("metadata") or "{}")
    data["entities"] = [EntityMention(**m) for m in (row.get("entities") or [])]
    data["derived_from"] = list(row.get("derived_from") or [])
    for key in _TIME_COLUMNS:
        value = data.get(key)
        if isinstance(value, datetime) and value.tzinfo is None:
            data[key] = value.replace(tzinfo=UTC)
    return Record.model_validate(data)


def matrix(column: pa.ChunkedArray) -> np.ndarray:
    """A fixed-size-list vector column as one float32 matrix, copied once."""
    if not len(column):  # a user with no records: still one column per dimension
        return np.zeros((0, column.type.list_size), dtype=np.float32)
    parts = [chunk.flatten().to_numpy(zero_copy_only=False) for chunk in column.chunks]
    return np.concatenate(parts).reshape(len(column), -1)


def head_arrays(data: pa.Table, names: list[str] = HEAD_COLUMNS) -> dict[str, np.ndarray]:
    """Head columns (all by default) as arrays without nulls, occurred_at in microseconds since the epoch
    (faster than going through Python lists)."""
    defaults: dict[str, Any] = {"importance": 0.5, "seq": 0, "occurred_at": 0}
    out: dict[str, np.ndarray] = {}
    for name in names:
        column = data.column(name)
        if name == "occurred_at":
            column = column.cast(pa.int64())
        out[name] = pc.fill_null(column, defaults.get(name, "")).to_numpy()
    return out


def asks(data: pa.Table) -> np.ndarray:
    """``Record.asks`` of each row (``model.asks_question``), computed by pyarrow: a user's
    speakers and texts are read once, when the user is loaded into memory."""
    speaker = pc.utf8_lower(pc.fill_null(data.column("speaker"), ""))
    requesting = pc.is_in(speaker, value_set=pa.array(REQUESTING_ROLES))
    asked = pc.match_substring_regex(pc.fill_null(data.column("text"), ""), QUESTION_PATTERN)
    out = pc.and_(pc.and_(pc.equal(data.column("kind"), "message"), pc.invert(requesting)), asked)
    return pc.fill_null(out, False).to_numpy(zero_copy_only=False).astype(bool)


def requests(data: pa.Table) -> np.ndarray:
    """``Record.requests`` of each row (``model.requests``), computed by pyarrow like ``asks``."""
    speaker = pc.utf8_lower(pc.fill_null(data.column("speaker"), ""))
    requesting = pc.is_in(speaker, value_set=pa.array(REQUESTING_ROLES))
    out = pc.and_(pc.equal(data.column("kind"), "message"), requesting)
    return pc.fill_null(out, False).to_numpy(zero_copy_only=False).astype(bool)


def alone(data: pa.Table) -> np.ndarray:
    """``Record.alone`` of each row (``model.stands_alone``), computed over the text column's
    bytes as they are: the whitespace-separated words (``WORD_PATTERN``: a run of bytes other
    than ASCII whitespace, as every byte of a non-ASCII character is) counted by numpy, kana and
    han (``UNSPACED_PATTERN``) by pyarrow in the texts that are not ASCII. Counting words with a
    regular expression took ~20 ms for a user of 2,000 records (their load into memory, every
    purge's BM25 rebuild); this takes ~3."""
    text = pc.fill_null(data.column("text"), "")
    message = pc.fill_null(pc.equal(data.column("kind"), "message"), False).to_numpy(zero_copy_only=False)
    words = word_counts(text)
    other = np.flatnonzero(message & ~pc.string_is_ascii(text).to_numpy(zero_copy_only=False))
    if len(other):
        words[other] += pc.count_substring_regex(pc.take(text, pa.array(other)), UNSPACED_PATTERN).to_numpy()
    return message & (words > STANDALONE_WORDS)


def word_counts(strings: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """How many ``WORD_PATTERN`` words each string holds (no nulls), from its UTF-8 bytes: a word
    begins at each byte that is not ASCII whitespace and follows one that is, or begins a string."""
    # One layout to read: int64 offsets, then the bytes (each chunk widened before they are joined).
    chunks = strings.chunks if isinstance(strings, pa.ChunkedArray) else [strings]
    array = pa.chunked_array([c.cast(pa.large_string()) for c in chunks], pa.large_string()).combine_chunks()
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64, count=len(array) + 1, offset=array.offset * 8)
    first, last = int(offsets[0]), int(offsets[-1])
    if last == first:
        return np.zeros(len(array), dtype=np.int64)
    raw = np.frombuffer(array.buffers()[2], dtype=np.uint8)[first:last]
    word = (raw != 32) & ((raw - np.uint8(9)) > 4)  # not a space, nor \t \n \v \f \r (9-13)
    begins = np.empty_like(word)
    begins[0] = word[0]
    np.greater(word[1:], word[:-1], out=begins[1:])
    bounds = offsets - first
    heads = bounds[:-1][bounds[:-1] < bounds[1:]]  # the first byte of each string that has one
    begins[heads] = word[heads]
    return np.diff(np.searchsorted(np.flatnonzero(begins), bounds))
