"""Users' heads, for a log several servers share: a token per user that every write to the user's
records changes, so that a server knows its caches of a user (records, vectors, BM25, the graph)
hold what the log holds while the head is the one it last saw.

A write marks the head pending (``PENDING``) before it commits and publishes after: each step swaps
the head it knew (``swap``, a conditional merge on the user's row, so a write of another server between
the two shows up as a failed swap) or, when that fails, sets a new one (``set``: the other server's
write and this one both differ from what anyone knew). A server that reads a head other than its own
rebuilds its caches of that user from the log.
"""

from __future__ import annotations

import uuid

import lance
import pyarrow as pa
from lancedb.table import LanceTable

from mnemoplan.storage.log.filters import of_user, sql_str
from mnemoplan.storage.log.tables import LogTables

HEADS_TABLE = "heads"
PENDING = "~"  # starts the head of a write under way (or of a server that died before publishing)
_SCHEMA = pa.schema([("user_id", pa.string()), ("head", pa.string())])


def new_head() -> str:
    """A head no server has seen."""
    return uuid.uuid4().hex


class UserHeads:
    """The heads table of a shared log.

    Args:
        tables: The log's tables (its database).
    """

    def __init__(self, tables: LogTables) -> None:
        self._tables = tables
        self._table: LanceTable = tables.open_or_create(HEADS_TABLE, _SCHEMA)

    def read(self, user_id: str) -> str:
        """The user's head ("" for a user no write has published yet)."""
        rows = self._newest().to_table(columns=["head"], filter=of_user(user_id), limit=2).to_pylist()
        return rows[0]["head"] if rows else ""

    def _newest(self) -> lance.LanceDataset:
        # Every server's every call reads a head: the fewest listings of object storage
        return self._tables.newest(self._table)

    def swap(self, user_id: str, expected: str, head: str) -> bool:
        """Set the user's head to ``head`` if it is ``expected`` ("" : the user has none); whether it was."""
        row = pa.table({"user_id": [user_id], "head": [head]}, schema=_SCHEMA)
        merge = self._newest().merge_insert("user_id")
        if expected:
            result = merge.when_matched_update_all(f"target.head = {sql_str(expected)}").execute(row)
        else:
            result = merge.when_not_matched_insert_all().execute(row)
        return bool(result["num_updated_rows"] or result["num_inserted_rows"])

    def set(self, user_id: str, head: str) -> None:
        """Set the user's head, whatever it was."""
        row = pa.table({"user_id": [user_id], "head": [head]}, schema=_SCHEMA)
        self._newest().merge_insert("user_id").when_matched_update_all().when_not_matched_insert_all().execute(row)
