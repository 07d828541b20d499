"""Per-user entity catalog: names, aliases and types, derived from the log.

Entities live in the records that mention them (``Record.entities``), so the
catalog holds no data of its own: it is rebuilt from the log on first use and kept
current as records are added and deleted. With it, which records mention each entity
(``mentions.MentionIndex``), read from the same columns.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa

from mnemoplan.model import EntityMention
from mnemoplan.storage.log.schema import mention_counts
from mnemoplan.storage.mentions import MentionIndex


@dataclass(frozen=True, slots=True)
class EntityInfo:
    """What a user's memory knows of one entity (a view of ``EntityCatalog``, made when asked for)."""

    key: str
    surfaces: dict[str, int]  # how often each way of writing it
    types: dict[str, int]  # how often each type given to it
    mentions: int
    spoke: int

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


class _Entities(Mapping[str, EntityInfo]):
    """A catalog's entities by key, each ``EntityInfo`` made when asked for."""

    def __init__(self, catalog: EntityCatalog) -> None:
        self._catalog = catalog

    def __getitem__(self, key: str) -> EntityInfo:
        c = self._catalog
        return EntityInfo(key, c._surfaces[key], c._types.get(key, {}), c._mentions[key], c._spoke.get(key, 0))

    def __contains__(self, key: object) -> bool:
        return key in self._catalog._mentions

    def __iter__(self) -> Iterator[str]:
        return iter(self._catalog._mentions)

    def __len__(self) -> int:
        return len(self._catalog._mentions)


class EntityCatalog:
    """Entities of one user, by key.

    Held for up to a thousand users (``CatalogCache``), so held in plain dicts of strings and
    counts, which the garbage collector stops tracking: an object per entity (and two Counters)
    made a thousand users' catalogs millions of tracked objects, and every full collection
    paused each call of a busy server for their scan."""

    def __init__(self) -> None:
        self._surfaces: dict[str, dict[str, int]] = {}
        self._types: dict[str, dict[str, int]] = {}
        self._mentions: dict[str, int] = {}
        self._spoke: dict[str, int] = {}
        self.version = 0
        self.upto = 0  # the last record (by seq) counted
        self.mentions: MentionIndex | None = None  # None: not read (a catalog built from counts alone)

    @property
    def entities(self) -> Mapping[str, EntityInfo]:
        """Known entities by key (a view: made per use, so a catalog is in no reference cycle and
        goes as soon as the store lets go of it)."""
        return _Entities(self)

    def _count(self, key: str, name: str, type_: str, role: str, n: int) -> None:
        surfaces = self._surfaces.setdefault(key, {})
        surfaces[name] = surfaces.get(name, 0) + n
        if type_:
            types = self._types.setdefault(key, {})
            types[type_] = types.get(type_, 0) + n
        self._mentions[key] = self._mentions.get(key, 0) + n
        if role == "speaker":
            self._spoke[key] = self._spoke.get(key, 0) + n

    def add(self, mentions: Iterable[EntityMention], record_id: str = "", seq: int = 0) -> None:
        """Count the mentions of one record (and index them, given the record's id and seq)."""
        mentions = list(mentions)
        for m in mentions:
            self._count(m.key, m.name, m.type, m.role, 1)
        if self.mentions is not None:
            if record_id:
                self.mentions.add(record_id, seq, mentions)
            elif mentions:  # an index that misses a record would answer wrong: none, rather
                self.mentions = None
        self.version += 1

    def without(self, mentions: Iterable[EntityMention], ids: Iterable[str]) -> EntityCatalog:
        """A copy with the mentions of deleted records uncounted; an entity, name or type left
        with none goes. A copy, since recalls read a catalog without a lock. An entity's
        names keep the order they were first written in, deleted mentions included (a catalog
        read again orders them by the first mention left): only a tie between two names'
        counts can tell the two apart. ``ids``, the deleted records', take them out of the
        ``MentionIndex`` too."""
        mentions = list(mentions)
        touched = {m.key for m in mentions}
        out = EntityCatalog()
        out._surfaces, out._types = dict(self._surfaces), dict(self._types)
        out._mentions, out._spoke = dict(self._mentions), dict(self._spoke)
        for key in touched:  # the inner counts the uncounting changes, copied too
            for counts in (out._surfaces, out._types):
                if key in counts:
                    counts[key] = dict(counts[key])
        for m in mentions:
            out._count(m.key, m.name, m.type, m.role, -1)
        for key in touched:
            if out._mentions.get(key, 0) <= 0:
                for counts in (out._surfaces, out._types, out._mentions, out._spoke):
                    counts.pop(key, None)
                continue
            for inner in (out._surfaces.get(key, {}), out._types.get(key, {})):
                for gone in [k for k, n in inner.items() if n <= 0]:
                    del inner[gone]
            if out._spoke.get(key, 1) <= 0:
                del out._spoke[key]
        out.version, out.upto = self.version + 1, self.upto
        out.mentions = None if self.mentions is None else self.mentions.without(ids)
        return out

    @classmethod
    def from_rows(cls, data: pa.Table) -> EntityCatalog:
        """The catalog of a user's rows in write order (``seq``, ``id``, ``entities``), with
        its ``MentionIndex``."""
        catalog = cls.from_counts(*mention_counts(data))
        catalog.mentions = MentionIndex.from_table(data)
        return catalog

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
    """Lazily built catalogs of users, with a loader that reads the log, bounded by the entities
    they hold.

    A record added while a user's catalog is being read from the log may be missed by the
    read (and, the catalog not being cached yet, by ``add``): such a read is done again. One
    the read did count is not counted again by its ``add`` (the catalog knows the last seq it
    read).
    """

    def __init__(self, loader: Callable[[str], EntityCatalog], entities: int = 262_144) -> None:
        self._loader = loader
        # Least recently used first; they go once the catalogs held weigh more than ``entities``
        # (``weight``, counted again as a catalog grows: cachetools' sizes are fixed when set).
        self._catalogs: OrderedDict[str, EntityCatalog] = OrderedDict()
        self._weights: dict[str, int] = {}
        self._bound, self._held = entities, 0
        self._lock = threading.Lock()  # one load at a time
        self._state = threading.Lock()  # a leaf lock over _catalogs, _weights and _changes
        self._changes: Counter[str] = Counter()  # writes and invalidations per user

    def get(self, user_id: str) -> EntityCatalog:
        """The user's catalog, built from the log the first time (and again after it was dropped
        for users used more recently)."""
        with self._state:
            catalog = self._held_catalog(user_id)
        if catalog is not None:
            return catalog
        with self._lock:
            with self._state:
                catalog = self._held_catalog(user_id)
            if catalog is not None:
                return catalog
            for _ in range(3):
                with self._state:
                    seen = self._changes[user_id]
                catalog = self._loader(user_id)
                with self._state:
                    if self._changes[user_id] == seen:
                        self._hold(user_id, catalog)
                        return catalog
            return catalog  # still changing: this read serves the call, the next use reads again

    def changes(self, user_id: str) -> int:
        """A count of the user's writes and invalidations, for ``offer``."""
        with self._state:
            return self._changes[user_id]

    def offer(self, user_id: str, catalog: EntityCatalog, seen: int) -> None:
        """Hold a catalog counted from the user's rows read elsewhere (a rebuild's), unless the
        user's records changed since ``changes`` gave ``seen``, before they were read."""
        with self._state:
            if self._changes[user_id] == seen:
                self._hold(user_id, catalog)

    def add(self, user_id: str, mentions: list[EntityMention], seq: int, record_id: str = "") -> None:
        """Update a loaded catalog with a new record's mentions (unloaded ones load later), unless
        the catalog was read from the log after the record reached it."""
        with self._state:
            self._changes[user_id] += 1
            catalog = self._held_catalog(user_id)
            if catalog is not None and seq > catalog.upto:
                catalog.upto = seq
                if mentions:
                    catalog.add(mentions, record_id, seq)
                    self._hold(user_id, catalog)  # weighed again

    def peek(self, user_id: str) -> EntityCatalog | None:
        """The user's catalog if it is loaded (none is loaded)."""
        with self._state:
            return self._held_catalog(user_id)

    def remove(self, user_id: str, mentions: list[EntityMention], before: EntityCatalog | None,
               ids: Iterable[str]) -> None:  # fmt: skip
        """Uncount deleted records' mentions (``EntityCatalog.without``) in the catalog that was
        loaded before the delete (``peek``); any other (one read from the log meanwhile, which
        may or may not have held them) is dropped, and so is a load in flight."""
        with self._state:
            self._changes[user_id] += 1
            catalog = self._held_catalog(user_id)
            if catalog is not None and catalog is before:
                self._hold(user_id, catalog.without(mentions, ids))
            else:
                self._drop(user_id)

    @staticmethod
    def weight(catalog: EntityCatalog) -> int:
        """What a catalog counts against the bound: its entities, and a mention held in its
        ``MentionIndex`` an eighth of one (~30 bytes against ~230); one at least."""
        mentions = len(catalog.mentions) if catalog.mentions is not None else 0
        return max(1, len(catalog.entities) + mentions // 8)

    def _held_catalog(self, user_id: str) -> EntityCatalog | None:
        """Under ``_state``: the user's catalog if held, now the most recently used."""
        catalog = self._catalogs.get(user_id)
        if catalog is not None:
            self._catalogs.move_to_end(user_id)
        return catalog

    def _hold(self, user_id: str, catalog: EntityCatalog) -> None:
        """Under ``_state``: hold (or weigh again) a user's catalog, then drop the least recently
        used others past the bound (one alone past it stays)."""
        self._catalogs[user_id] = catalog
        self._catalogs.move_to_end(user_id)
        weight = self.weight(catalog)
        self._held += weight - self._weights.get(user_id, 0)
        self._weights[user_id] = weight
        while self._held > self._bound and len(self._catalogs) > 1:
            self._drop(next(iter(self._catalogs)))

    def _drop(self, user_id: str) -> None:
        """Under ``_state``: let go of a user's catalog."""
        self._catalogs.pop(user_id, None)
        self._held -= self._weights.pop(user_id, 0)

    def invalidate(self, user_id: str) -> None:
        """Drop a user's catalog; the next use rebuilds it from the log."""
        with self._state:
            self._changes[user_id] += 1
            self._drop(user_id)
