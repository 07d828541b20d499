"""The HTTP server's tokens, hashed, in a table of a log shared by several servers: a token made or
revoked on one server holds on every one (``storage.tokens`` reads it like its file)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from mnemoplan.storage.log.filters import sql_str
from mnemoplan.storage.log.tables import LogTables

TOKENS_TABLE = "tokens"
_SCHEMA = pa.schema([("id", pa.string()), ("hash", pa.string()), ("user_id", pa.string()), ("admin", pa.bool_()),
                     ("read_only", pa.bool_()), ("created_at", pa.string()), ("note", pa.string())])  # fmt: skip


class TokenTable:
    """Token entries (``storage.tokens``' dicts) in the shared log.

    Args:
        tables: The shared log's database.
    """

    def __init__(self, tables: LogTables) -> None:
        self._table = tables.open_or_create(TOKENS_TABLE, _SCHEMA)

    def version(self) -> int:
        """The table's version: it changes with every token made or revoked, on any server."""
        self._table.checkout_latest()
        return int(self._table.version)

    def entries(self) -> list[dict[str, Any]]:
        """Every token entry, oldest first."""
        rows = self._table.search().limit(None).to_arrow().to_pylist()
        return sorted(rows, key=lambda r: r["created_at"])

    def add(self, entry: dict[str, Any]) -> None:
        """Add one token entry."""
        self._table.add(pa.Table.from_pylist([entry], schema=_SCHEMA))

    def remove(self, token_id: str) -> None:
        """Delete a token entry by id."""
        self._table.delete(f"id = {sql_str(token_id)}")
