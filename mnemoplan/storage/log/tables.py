"""The log's LanceDB database and its two tables: the records, and the users' keys."""

from __future__ import annotations

import os
from pathlib import Path

import lancedb
import pyarrow as pa
from lancedb.table import LanceTable

from mnemoplan.storage.log.schema import KEYS_TABLE, LATER_COLUMNS, TABLE, table_schema


def usable_cpus() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text(encoding="utf-8").split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def size_lance_pool() -> None:
    """Give Lance two CPU threads on a machine of up to three cores (before its first use).

    Lance does its CPU work (encoding an append, building an index, compacting) on a pool of
    max(1, cores - 2) threads, sized once, at its first use. On a machine of up to three cores
    that is one thread: building the vector index (~45 s at 100k rows) held it, and every append
    to any table waited for the whole build (a `remember` blocked ~10 s at 100k records). A second
    thread lets appends through (at most 65-80 ms during a build, which took as long). Larger
    machines keep Lance's own size, and a value set by the user stands.
    """
    if usable_cpus() <= 3:
        os.environ.setdefault("LANCE_CPU_THREADS", "2")


class LogTables:
    """The records table (None until the first write creates it) and the users' keys table.

    Args:
        path: Directory of the LanceDB database.
        read_only: Take the schema as it is, and create no table (a log that lacks one reads as empty).
    """

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        size_lance_pool()
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
        if self._dim is None:  # reading a LanceDB schema costs ~2 ms; the vector width never changes
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
