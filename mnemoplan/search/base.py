"""What every searchable index is to the planner: a descriptor and a ``search`` method."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from mnemoplan.model import IndexDescriptor, ParamSpec, QueryAnalysis
from mnemoplan.model.records import KINDS

# The most records one step may ask for: a larger list costs its index memory and time
# (Tantivy reserves room for the whole list up front) and no ranking looks that deep.
TOP_K_MAX = 1000


def widened(top_k: Any, factor: int) -> int:
    """A step's ``top_k`` multiplied by ``factor``, never past TOP_K_MAX."""
    return min(TOP_K_MAX, int(top_k) * factor)


def top_k_param(default: int, description: str = "How many records to return.") -> ParamSpec:
    """The ``top_k`` parameter every index takes, bounded to 1..TOP_K_MAX."""
    return ParamSpec(name="top_k", type="integer", default=default, description=description,
                     minimum=1, maximum=TOP_K_MAX)  # fmt: skip


def query_param(what: str) -> ParamSpec:
    """The optional ``query`` parameter: ``what`` the index does with it, else the plan's query."""
    return ParamSpec(name="query", type="string", description=f"{what}; defaults to the plan's query.")


def kinds_param(kinds: str = "") -> ParamSpec:
    """The optional ``kinds`` filter (``kinds``: those the index holds, e.g. "message, fact";
    by default every kind)."""
    held = [k.strip() for k in kinds.split(",") if k.strip()] or list(KINDS)
    return ParamSpec(name="kinds", type="string_list", description=f"Only these kinds{f' ({kinds})' if kinds else ''}.",
                     choices=held)  # fmt: skip


@dataclass(frozen=True)
class Hit:
    """One record an index found, with its raw score and, where it has one, a reason."""

    id: str
    score: float
    index: str = ""
    detail: str = ""


class LazyVector:
    """The query's embedding, computed once, on first use, by whichever step needs it first."""

    def __init__(self, embed: Callable[[str], np.ndarray]) -> None:
        self._embed = embed
        self._cache: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def __call__(self, text: str) -> np.ndarray:
        with self._lock:
            vector = self._cache.get(text)
            if vector is None:
                vector = self._cache[text] = self._embed(text)
            return vector


@dataclass
class SearchRequest:
    """Everything one plan step gives its index."""

    user_id: str
    query: str
    params: dict[str, Any]
    vector: LazyVector
    analysis: QueryAnalysis | None = None
    project_id: str = ""
    after: datetime | None = None
    before: datetime | None = None
    upstream: list[Hit] = field(default_factory=list)


class SearchIndex(ABC):
    """An index the planner can query. Subclasses set ``descriptor`` and implement ``search``."""

    descriptor: IndexDescriptor

    @property
    def name(self) -> str:
        """The index's registered name."""
        return self.descriptor.name

    def available(self, user_id: str) -> bool:
        """False when the index has nothing for this user."""
        return True

    def describe(self, user_id: str) -> IndexDescriptor:
        """The descriptor, with ``available`` for this user."""
        return self.descriptor.model_copy(update={"available": self.available(user_id)})

    def param(self, req: SearchRequest, name: str) -> Any:
        """A parameter's value: from the step, else the descriptor's default."""
        if name in req.params:
            return req.params[name]
        for spec in self.descriptor.query_params:
            if spec.name == name:
                return spec.default
        raise KeyError(name)

    @abstractmethod
    def search(self, req: SearchRequest) -> list[Hit]:
        """Run one query; hits best first."""
