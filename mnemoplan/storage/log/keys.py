"""Per-user secrets: the random salt that keys a user's hashed names in the graph."""

from __future__ import annotations

import os
import threading

import pyarrow as pa

from mnemoplan.storage.log.filters import of_user
from mnemoplan.storage.log.maintenance import Maintenance
from mnemoplan.storage.log.tables import LogTables


class UserKeys:
    """Users' salts, in the log's keys table, held in memory once read.

    Args:
        tables: The log's tables (the keys table is None in a log opened read-only that never had a user).
        maintenance: Notes the fragments a deleted salt leaves, for the purge.
    """

    def __init__(self, tables: LogTables, maintenance: Maintenance) -> None:
        self._tables = tables
        self._maintenance = maintenance
        self._salts: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def salt(self, user_id: str, *, create: bool = True) -> bytes | None:
        """The random secret that keys this user's hashed names in the graph (made now if the user
        has none and ``create`` is set; else None)."""
        salt = self._salts.get(user_id)
        if salt is not None:
            return salt
        keys = self._tables.keys
        if keys is None:  # a log opened read-only that never had a user
            return None
        with self._lock:
            rows = keys.search().where(of_user(user_id)).select(["salt"]).to_list()
            if not rows and create:
                # Inserted only if no server of a shared log made one meanwhile: then the salt is theirs.
                row = pa.table({"user_id": [user_id], "salt": [os.urandom(32)]})
                keys.merge_insert("user_id").when_not_matched_insert_all().execute(row)
                rows = keys.search().where(of_user(user_id)).select(["salt"]).to_list()
            if not rows:
                return None
            salt = self._salts[user_id] = bytes(rows[0]["salt"])
            return salt

    def cached(self, user_id: str) -> bytes | None:
        """The user's salt if held in memory (what the graph's entries of the user were keyed with)."""
        return self._salts.get(user_id)

    def forget_cached(self, user_id: str) -> None:
        """Read the user's salt from the log again at next use (another server may have dropped it)."""
        with self._lock:
            self._salts.pop(user_id, None)

    def drop(self, user_id: str) -> None:
        """Destroy a user's secret: what the graph kept of them can no longer be linked to names."""
        with self._lock, self._maintenance.rewrite_lock:  # as every delete (see Maintenance.rewrite_lock)
            self._salts.pop(user_id, None)
            if self._tables.keys is not None:
                self._tables.keys.delete(of_user(user_id))
