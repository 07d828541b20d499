"""The log's LanceDB database and its tables: the records, the users' keys and, when the log is shared
by several servers, the users' heads (``heads.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import lance
import lancedb
import pyarrow as pa
from lancedb.table import LanceTable

from mnemoplan.runtime import configure_lance
from mnemoplan.storage.log.schema import KEYS_TABLE, LATER_COLUMNS, TABLE, table_schema


SESSION_INDEX_BYTES = 256 << 20  # pylance's cache of index pages (the user_id B-tree's, mostly)
SESSION_METADATA_BYTES = 128 << 20  # and of manifests and file footers
DROPPED_FILE_READS = 3  # reads of a scan whose files a purge dropped under it


T = TypeVar("T")


def read_again_if_dropped(read: Callable[[], T]) -> T:
    """``read()``, done again if a purge dropped a file of the version it began on
    (``drop_unreferenced``, which runs beside reads): the newest version no longer needs it."""
    for attempt in range(DROPPED_FILE_READS):
        try:
            return read()
        except (RuntimeError, OSError, pa.ArrowException) as exc:  # LanceDB's errors; pylance's scan's
            if attempt + 1 == DROPPED_FILE_READS or "Not found" not in str(exc):
                raise
    raise AssertionError("unreachable")


def is_shared(location: Path | str) -> bool:
    """Whether a log location is object storage (``s3://``, ``gs://``, ...), which other servers may
    write too, rather than a local directory."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


class LogTables:
    """The records table (None until the first write creates it) and the users' keys table.

    Args:
        location: Directory of the LanceDB database, or an object-storage URI (``s3://bucket/prefix``).
        storage_options: LanceDB's options for an object-storage URI (endpoint, region, credentials).
        read_only: Take the schema as it is, and create no table (a log that lacks one reads as empty).
    """

    def __init__(self, location: Path | str, *, storage_options: dict[str, str] | None = None,
                 read_only: bool = False) -> None:  # fmt: skip
        configure_lance()  # for a process that opens a log without an entry point (a script, a child)
        self.shared = is_shared(location)
        # Shared: every read sees the latest version another server committed, not the one this
        # process opened (a lookup of the table's version per read: what freshness costs).
        self._db = lancedb.connect(str(location), storage_options=storage_options or None,
                                   read_consistency_interval=timedelta(0) if self.shared else None)  # fmt: skip
        self._storage_options = storage_options or None
        # What pylance reads of a table's versions (manifests, file footers, index pages): never
        # stale, as none changes once written; shared by every ``newest`` open, and bounded (a
        # version per write: a long-running server would otherwise keep every manifest it read).
        self._session = lance.Session(index_cache_size_bytes=SESSION_INDEX_BYTES,
                                      metadata_cache_size_bytes=SESSION_METADATA_BYTES)  # fmt: skip
        self._uris: dict[str, str] = {}  # table name -> where pylance finds it
        self._dim: int | None = None
        names = self._db.table_names()
        self._records: LanceTable | None = None
        if TABLE in names:
            self._records = self._db.open_table(TABLE)
            if not read_only:
                self._add_later_columns(self._records)
        # Tables beside the records that small writes grow a version at a time (users' keys, a
        # shared log's heads and tokens): maintenance compacts them and drops their old versions.
        self.side: list[LanceTable] = []
        self.keys: LanceTable | None = None  # None: opened read-only, and never written to
        if KEYS_TABLE in names:
            self.keys = self._db.open_table(KEYS_TABLE)
        elif not read_only:
            schema = pa.schema([("user_id", pa.string()), ("salt", pa.binary())])
            self.keys = self._db.create_table(KEYS_TABLE, schema=schema)
        if self.keys is not None:
            self.side.append(self.keys)  # a version per new user

    @property
    def records(self) -> LanceTable | None:
        """The records table; None until a first write creates it (on a shared log, any server's)."""
        if self._records is None and self.shared and TABLE in self._db.table_names():
            self._records = self._db.open_table(TABLE)
        return self._records

    def open_or_create(self, name: str, schema: pa.Schema) -> LanceTable:
        """A side table of the database, created empty with ``schema`` if it does not exist yet (by
        another server of a shared log meanwhile: then theirs). Maintenance compacts it with the others."""
        table = self._open_or_create(name, schema)
        self.side.append(table)
        return table

    def _open_or_create(self, name: str, schema: pa.Schema) -> LanceTable:
        if name in self._db.table_names():
            return self._db.open_table(name)
        try:
            return self._db.create_table(name, schema=schema)
        except (OSError, ValueError, RuntimeError):  # created meanwhile
            return self._db.open_table(name)

    def newest(self, table: LanceTable) -> lance.LanceDataset:
        """A table's newest version, read by pylance: on object storage one listing of its
        versions (LanceDB's query builder, told to read the newest version, lists them five times
        for one query, and a merge six: bench/README.md), then the manifest from the shared
        session's cache unless another server committed since."""
        uri = self._uris.get(table.name)
        if uri is None:  # LanceDB answers it through its event loop: asked once
            uri = self._uris[table.name] = table.uri
        return lance.dataset(uri, storage_options=self._storage_options, session=self._session)

    def read(
        self, table: LanceTable, where: str | None, columns: list[str], limit: int | None = None,
        *, row_addresses: bool = False,
    ) -> pa.Table:
        """Rows of a table's newest version matching a filter (every row when ``where`` is None):
        pylance's scan, not LanceDB's query builder, which runs each call on one event-loop
        thread of its own that needs the GIL at each step (a 20-row read by id beside one busy
        Python thread: 254 ms through it, 63 ms through pylance; quiet, 7.4-8.9 against 4.6-6.2).
        Read again, from the version newest then, if a purge dropped a file under it. With
        ``row_addresses``, each row's ``_rowaddr`` comes too."""
        return read_again_if_dropped(
            lambda: self.newest(table).to_table(columns=columns, filter=where or None, limit=limit,
                                                with_row_address=row_addresses)  # fmt: skip
        )

    def batches(self, table: LanceTable, where: str | None, columns: list[str], rows: int) -> Iterator[pa.RecordBatch]:
        """``read`` a batch of at most ``rows`` rows at a time."""
        return iter(self.newest(table).to_batches(columns=columns, filter=where or None, batch_size=rows))

    def count(self, table: LanceTable, where: str | None = None) -> int:
        """Rows of a table's newest version matching a filter (all rows when None); counted again
        if a purge dropped a file under it."""
        return read_again_if_dropped(lambda: int(self.newest(table).count_rows(where or None)))

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
            self._records = self._open_or_create(TABLE, table_schema(dim))  # not a side table
        if self.dim != dim:
            raise ValueError(
                f"the log holds {self.dim}-dimensional vectors but the embedder makes {dim}; "
                "use the model the data was written with, or start a new data directory"
            )
        assert self._records is not None
        return self._records

    def _add_later_columns(self, table: LanceTable) -> None:
        missing = [name for name in LATER_COLUMNS if name not in table.schema.names]
        if missing:
            full = table_schema(self.dim or 1)
            table.add_columns([full.field(name) for name in missing])
