"""The log's LanceDB database and its two tables: the records, and the users' keys."""

from __future__ import annotations

import os
from pathlib import Path

import lancedb
import pyarrow as pa
from lancedb.table import LanceTable

from mnemoplan.runtime import configure_lance
from mnemoplan.storage.log.schema import KEYS_TABLE, LATER_COLUMNS, TABLE, table_schema


class LogTables:
    """The records table (None until the first write creates it) and the users' keys table.

    Args:
        path: Directory of the LanceDB database.
        read_only: Take the schema as it is, and create no table (a log that lacks one reads as empty).
    """

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        configure_lance()  # for a process that opens a log without an entry point (a script, a child)
        self._db = lancedb.connect(str(path))
        self._dim: int | None = None
        names = self._db.table_names()
        self.records: LanceTable | None = None
        if TABLE in names:
            self.records = self._db.open_table(TABLE)
            if not read_only:
                self._add_later_columns(self.records)
        self.keys: LanceTable | None = None  # None: opened read-only, and never written to
        if KEYS_TABLE in names:
            self.keys = self._db.open_table(KEYS_TABLE)
        elif not read_only:
            schema = pa.schema([("user_id", pa.string()), ("salt", pa.binary())])
            self.keys = self._db.create_table(KEYS_TABLE, schema=schema)

    @property
    def dim(self) -> int | None:
        """Vector dimension, or None before the first write."""
        if self.records is None:
            return None
        if self._dim is None:  # reading a LanceDB schema is a round trip; the vector width never changes
            self._dim = int(self.records.schema.field("vector").type.list_size)
        return self._dim

    def ensure(self, dim: int) -> LanceTable:
        """The records table, created for vectors of ``dim`` dimensions if there is none yet.

        Raises:
            ValueError: The table holds vectors of another dimension.
        """
        if self.records is None:
            self.records = self._db.create_table(TABLE, schema=table_schema(dim))
        elif self.dim != dim:
            raise ValueError(
                f"the log holds {self.dim}-dimensional vectors but the embedder makes {dim}; "
                "use the model the data was written with, or start a new data directory"
            )
        return self.records

    def _add_later_columns(self, table: LanceTable) -> None:
        missing = [name for name in LATER_COLUMNS if name not in table.schema.names]
        if missing:
            full = table_schema(self.dim or 1)
            table.add_columns([full.field(name) for name in missing])
