"""Which of a user's records mention each entity, newest first, held in memory with the user's
entity catalog (``catalog.EntityCatalog``): the entity walk's question, answered without the graph.

The graph answers it by seeking each entity's MENTIONS edges and sorting their records by seq;
several entities at once filter a scan of every Entity node in the store. On a store of 1.6M
records (828k entities) that took 70-150 ms a call, whatever the user's size: most of a recall's
time for users of 1k and 10k records (bench/README.md, "The entity walk from memory"). Here it
is the user's own rows: a slice per entity of arrays sorted once when the catalog is read.

The index is read from the same columns as the catalog and changes with it: records written
since are appended (``add``), deleted ones are left out by id (``without``). Never changed in
place except by ``add``, as the catalog itself (a reader takes a snapshot of the appended list).
"""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mnemoplan.model import EntityMention

# What a walk is given of a record: (record id, entity key, role).
Mentioning = tuple[str, str, str]


class _Sorted(Sequence[str]):
    """An Arrow string array in sorted order, as a sequence ``bisect`` can search."""

    def __init__(self, values: pa.Array) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        return self._values[i].as_py()


class MentionIndex:
    """One user's entity mentions by entity, each entity's newest first.

    Built by ``from_table`` from the user's rows in write order (``id``, ``seq``, ``entities``).
    Arrays, not an object per mention: a user of 100k records has ~2.5M mentions.
    """

    __slots__ = ("_ids", "_seqs", "_keys", "_starts", "_rows", "_roles", "_role_names", "_tail", "_gone")

    def __init__(self) -> None:
        self._ids = pa.array([], pa.string())  # each row's record id
        self._seqs = np.zeros(0, dtype=np.int64)  # each row's seq
        self._keys = _Sorted(pa.array([], pa.string()))  # the entity keys, sorted: their codes
        self._starts = np.zeros(1, dtype=np.int64)  # an entity's mentions: [starts[c], starts[c + 1])
        self._rows = np.zeros(0, dtype=np.int32)  # each mention's row, by entity, newest first
        self._roles = np.zeros(0, dtype=np.int8)  # each mention's role, as an index of _role_names
        self._role_names: list[str] = []
        self._tail: list[tuple[int, str, str, str]] = []  # (seq, id, key, role) written since
        self._gone: frozenset[str] = frozenset()  # ids deleted since

    @classmethod
    def from_table(cls, data: pa.Table) -> MentionIndex:
        """The index of a user's rows (``id``, ``seq`` and ``entities`` at least)."""
        out = cls()
        if not data.num_rows:
            return out
        entities = data.column("entities").combine_chunks()
        flat = pc.list_flatten(entities)
        out._ids = data.column("id").combine_chunks()
        out._seqs = pc.fill_null(data.column("seq"), 0).to_numpy().astype(np.int64)
        if not len(flat):
            return out
        parent = pc.list_parent_indices(entities).to_numpy().astype(np.int32)
        keys = pc.fill_null(pc.struct_field(flat, "key"), "").dictionary_encode()
        roles = pc.fill_null(pc.struct_field(flat, "role"), "mention").dictionary_encode()
        # Codes in the keys' sorted order, so a key is found by bisection.
        by_name = pc.sort_indices(keys.dictionary).to_numpy()
        rank = np.empty(len(by_name), dtype=np.int64)
        rank[by_name] = np.arange(len(by_name))
        codes = rank[keys.indices.to_numpy()]
        order = np.lexsort((-out._seqs[parent], codes))
        out._keys = _Sorted(keys.dictionary.take(pa.array(by_name)))
        out._starts = np.searchsorted(codes[order], np.arange(len(by_name) + 1)).astype(np.int64)
        out._rows = parent[order]
        out._roles = roles.indices.to_numpy().astype(np.int8)[order]
        out._role_names = roles.dictionary.to_pylist()
        return out

    def __len__(self) -> int:
        """Mentions held (those of records deleted since included)."""
        return len(self._rows) + len(self._tail)

    def add(self, record_id: str, seq: int, mentions: Iterable[EntityMention]) -> None:
        """A record written since the index was read."""
        self._tail.extend((seq, record_id, m.key, m.role or "mention") for m in mentions)

    def without(self, ids: Iterable[str]) -> MentionIndex:
        """A copy without the mentions of deleted records (the arrays shared, not copied)."""
        out = copy.copy(self)
        out._gone = self._gone | frozenset(ids)
        out._tail = [m for m in self._tail if m[1] not in out._gone]
        return out

    def records(
        self, keys: Sequence[str], limit: int, roles: Sequence[str] | None = None,
        order: Mapping[str, str] | None = None,
    ) -> list[Mentioning]:  # fmt: skip
        """The records mentioning any of ``keys`` (with one of ``roles``; none given or an empty
        list: any role, as the graph has it), newest first, ``limit`` at most: (record id, entity
        key, role). Ties (one record, several keys) in record id, then key order, or the order of
        ``order[key]`` (the graph's: its hashed keys)."""
        roles = roles or None
        wanted = None if roles is None else [i for i, r in enumerate(self._role_names) if r in roles]
        found: list[tuple[int, str, str, str]] = []
        for key in dict.fromkeys(keys):
            code = bisect_left(self._keys, key)
            if code < len(self._keys) and self._keys[code] == key:
                found.extend(self._newest(code, key, limit, wanted))
        tail = self._tail[:]  # a snapshot: ``add`` may append meanwhile
        asked = set(keys)
        found.extend(m for m in tail if m[2] in asked and (roles is None or m[3] in roles))
        rank = order or {}
        found.sort(key=lambda m: (-m[0], m[1], rank.get(m[2], m[2])))
        return [(rid, key, role) for _, rid, key, role in found[:limit]]

    def _newest(
        self, code: int, key: str, limit: int, wanted: list[int] | None
    ) -> list[tuple[int, str, str, str]]:
        """An entity's newest ``limit`` mentions not deleted since (and any tied with the last)."""
        rows = self._rows[self._starts[code] : self._starts[code + 1]]
        roles = self._roles[self._starts[code] : self._starts[code + 1]]
        if wanted is not None:
            keep = np.isin(roles, wanted)
            rows, roles = rows[keep], roles[keep]
        seqs = self._seqs[rows]
        names = self._role_names
        take = limit
        while True:  # wider while deleted records (each with any number of mentions) take places
            end = min(take, len(rows))
            if 0 < end < len(rows):
                end += int(np.count_nonzero(seqs[end:] == seqs[end - 1]))  # seqs fall: the ties follow
            ids = self._ids.take(pa.array(rows[:end])).to_pylist()
            found = [(s, rid, key, names[r]) for s, rid, r in zip(seqs[:end].tolist(), ids, roles[:end].tolist(),
                                                                  strict=True) if rid not in self._gone]  # fmt: skip
            if len(found) >= limit or end >= len(rows):
                return found
            take = end + limit - len(found)
