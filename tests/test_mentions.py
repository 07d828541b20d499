"""The catalog's mention index against the graph's question answered by brute force: records
mentioning any of some entities, newest first, after appends and deletes."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from mnemoplan.model import EntityMention
from mnemoplan.storage.mentions import MentionIndex

ROLES = ["speaker", "mention", "subject", "object"]


def reference(rows: list[tuple[str, int, list[tuple[str, str]]]], gone: set[str], keys: list[str], limit: int,
              roles: list[str] | None) -> list[tuple[str, str, str]]:  # fmt: skip
    found = [(seq, rid, key, role) for rid, seq, mentions in rows if rid not in gone for key, role in mentions
             if key in keys and (not roles or role in roles)]  # fmt: skip
    found.sort(key=lambda m: (-m[0], m[1], m[2]))
    return [(rid, key, role) for _, rid, key, role in found[:limit]]


@pytest.mark.parametrize("seed", range(40))
def test_the_mention_index_answers_as_a_scan_of_every_mention(seed: int) -> None:
    """Keys repeated in one record, ties, role filters (an empty list: any role, as the graph
    has it), records written since the read and deleted ones, limits that cut anywhere."""
    rng = random.Random(seed)
    entities = [f"e{i}" for i in range(6)]

    def record(i: int) -> tuple[str, int, list[tuple[str, str]]]:
        mentions = [(rng.choice(entities), rng.choice(ROLES)) for _ in range(rng.randint(0, 4))]
        return f"r{rng.randrange(10**6):06d}-{i}", i, mentions

    read = [record(i) for i in range(rng.randint(0, 30))]
    table = pa.table({
        "seq": pa.array([seq for _, seq, _ in read], pa.int64()),
        "id": [rid for rid, _, _ in read],
        "entities": pa.array([[{"key": k, "name": k, "type": "", "role": r} for k, r in m] for _, _, m in read],
                             pa.list_(pa.struct([("key", pa.string()), ("name", pa.string()),
                                                 ("type", pa.string()), ("role", pa.string())]))),
    })  # fmt: skip
    index = MentionIndex.from_table(table)
    rows = list(read)
    for i in range(len(read), len(read) + rng.randint(0, 5)):  # written since
        rows.append(record(i))
        index.add(rows[-1][0], i, [EntityMention(key=k, name=k, role=r) for k, r in rows[-1][2]])
    gone = {rid for rid, _, _ in rng.sample(rows, min(len(rows), rng.randint(0, 6)))}
    index = index.without(gone)
    for _ in range(20):
        keys = rng.sample(entities, rng.randint(1, 4))
        limit = rng.randint(1, 12)
        roles = rng.choice([None, [], rng.sample(ROLES, 2)])
        assert index.records(keys, limit, roles) == reference(rows, gone, keys, limit, roles)
