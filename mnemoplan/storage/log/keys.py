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
            if rows:
                salt = bytes(rows[0]["salt"])
            elif create:
                salt = os.urandom(32)
                keys.add(pa.table({"user_id": [user_id], "salt": [salt]}))
            else:
                return None
            self._salts[user_id] = salt
            return salt

    def drop(self, user_id: str) -> None:
        """Destroy a user's secret: what the graph kept of them can no longer be linked to names."""
        with self._lock, self._maintenance.rewrite_lock:  # the rewrite lock: it guards the noted fragments
            self._salts.pop(user_id, None)
            if self._tables.keys is not None:
                self._maintenance.delete(self._tables.keys, of_user(user_id))
