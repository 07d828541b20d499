"""What the graph keeps of a record, as the store hands it over: ids and opaque keys only."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GraphMention:
    """A record's link to an entity (opaque entity key)."""

    entity: str
    etype: str = ""
    role: str = "mention"


@dataclass(frozen=True)
class GraphRelation:
    """A fact-backed edge between two entities."""

    source: str
    target: str
    fact: str
    strength: float = 1.0
    negated: bool = False


@dataclass(frozen=True)
class GraphRecord:
    """What the graph keeps of one record: ids and opaque keys only."""

    id: str
    user: str
    kind: str
    seq: int
    ts: int
    session: str = ""
    prev_id: str = ""
    derived_from: tuple[str, ...] = ()
    mentions: tuple[GraphMention, ...] = ()
    relations: tuple[GraphRelation, ...] = field(default_factory=tuple)
