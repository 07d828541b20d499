"""Per-user entity catalog: names, aliases and types, derived from the log.

Entities live in the records that mention them (``Record.entities``), so the
catalog holds no data of its own: it is rebuilt from the log on first use and kept
current as records are added. Forgetting invalidates it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cachetools import LRUCache

from mnemoplan.model import EntityMention


@dataclass(slots=True)
class EntityInfo:
    """What a user's memory knows of one entity.

    Held for every entity of up to a thousand users (``CatalogCache``), so kept to one object the
    garbage collector tracks: slots, and plain dicts of strings to counts, which it stops
    tracking. With a ``Counter`` each and an instance dict, a thousand users' entities were
    millions of tracked objects, and each full collection paused every call for their scan."""

    key: str
    surfaces: dict[str, int] = field(default_factory=dict)  # how often each way of writing it
    types: dict[str, int] = field(default_factory=dict)  # how often each type given to it
    mentions: int = 0
    spoke: int = 0

    @property
    def name(self) -> str:
        """The most frequent way the entity is written (the first written, of equals)."""
        return max(self.surfaces, key=self.surfaces.__getitem__) if self.surfaces else self.key

    @property
    def type(self) -> str:
        """The most frequent type given to the entity (the first given, of equals)."""
        return max(self.types, key=self.types.__getitem__) if self.types else ""

    @property
    def aliases(self) -> list[str]:
        """Every way the entity has been written."""
        return list(self.surfaces)


class EntityCatalog:
    """Entities of one user, by key."""

    def __init__(self) -> None:
        self.entities: dict[str, EntityInfo] = {}
        self.version = 0
        self.upto = 0  # the last record (by seq) counted

    def _count(self, key: str, name: str, type_: str, role: str, n: int) -> None:
        info = self.entities.get(key)
        if info is None:
            info = self.entities[key] = EntityInfo(key)
        info.surfaces[name] = info.surfaces.get(name, 0) + n
        if type_:
            info.types[type_] = info.types.get(type_, 0) + n
        info.mentions += n
        if role == "speaker":
            info.spoke += n

    def add(self, mentions: Iterable[EntityMention]) -> None:
        """Count the mentions of one record."""
        for m in mentions:
            self._count(m.key, m.name, m.type, m.role, 1)
        self.version += 1

    @classmethod
    def from_counts(cls, counts: Iterable[tuple[str, str, str, str, int]], upto: int = 0) -> EntityCatalog:
        """A catalog from how often each (key, name, type, role) was mentioned, in order of
        first mention (the order decides ties between an entity's names), in the records up to
        seq ``upto``."""
        catalog = cls()
        for key, name, type_, role, n in counts:
            catalog._count(key, name, type_, role, n)
        catalog.version += 1
        catalog.upto = upto
        return catalog


class CatalogCache:
    """Lazily built catalogs of every user, with a loader that reads the log.

    A record added while a user's catalog is being read from the log may be missed by the
    read (and, the catalog not being cached yet, by ``add``): such a read is done again. One
    the read did count is not counted again by its ``add`` (the catalog knows the last seq it
    read).
    """

    def __init__(self, loader: Callable[[str], EntityCatalog], users: int = 1_024) -> None:
        self._loader = loader
        self._catalogs: LRUCache[str, EntityCatalog] = LRUCache(users)  # the least recently used go
        self._lock = threading.Lock()  # one load at a time
        self._state = threading.Lock()  # a leaf lock over _catalogs and _changes
        self._changes: Counter[str] = Counter()  # writes and invalidations per user

    def get(self, user_id: str) -> EntityCatalog:
        """The user's catalog, built from the log the first time (and again after it was dropped
        for users used more recently)."""
        with self._state:
            catalog = self._catalogs.get(user_id)
        if catalog is not None:
            return catalog
        with self._lock:
            with self._state:
                catalog = self._catalogs.get(user_id)
            if catalog is not None:
                return catalog
            for _ in range(3):
                with self._state:
                    seen = self._changes[user_id]
                catalog = self._loader(user_id)
                with self._state:
                    if self._changes[user_id] == seen:
                        self._catalogs[user_id] = catalog
                        return catalog
            return catalog  # still changing: this read serves the call, the next use reads again

    def add(self, user_id: str, mentions: list[EntityMention], seq: int) -> None:
        """Update a loaded catalog with a new record's mentions (unloaded ones load later), unless
        the catalog was read from the log after the record reached it."""
        with self._state:
            self._changes[user_id] += 1
            catalog = self._catalogs.get(user_id)
            if catalog is not None and seq > catalog.upto:
                catalog.upto = seq
                if mentions:
                    catalog.add(mentions)

    def invalidate(self, user_id: str) -> None:
        """Drop a user's catalog; the next use rebuilds it from the log."""
        with self._state:
            self._changes[user_id] += 1
            self._catalogs.pop(user_id, None)
