"""Building ``bench-scale``'s store: many users, each a conversation replicated to a size, through
``remember``, with every distinct text embedded once.

Users, by size: ``u0000``, ``u0001``, ... of ``per_user`` messages; ``mid0``, ``mid1``, ... of ten
times as many; ``big`` of ``big_user``. A user of ``per_user`` replays one conversation of the
sources (LoCoMo's and RealMem's, in turn), the larger ones every conversation; each replay (a
round) shifts its times by ``ROUND_SHIFT_DAYS`` and gives its messages their own session and
source ids, so every message is a distinct memory. The store is written through the method the
``remember`` tool calls, one call per session, so it holds what remember derives (facts,
summaries, passages, token vectors); a text the model has embedded once (a sentence, a passage)
is not embedded again (``OnceEmbedder``). A store built earlier is resumed where it stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from mnemoplan.bench.datasets import Dataset, Turn
from mnemoplan.bench.progress import Progress
from mnemoplan.inference.embedder import EmbeddingModel, TokenVectors
from mnemoplan.model import MessageIn

if TYPE_CHECKING:
    from mnemoplan.service.service import MemoryService

ROUND_SHIFT_DAYS = 400
MID_USERS = 2  # users ten times the size of the others, between them and the big one


@dataclass(frozen=True)
class Conversation:
    """One source conversation: its sessions' turns in order."""

    conv_id: str
    sessions: list[tuple[int, list[Turn]]]

    @property
    def size(self) -> int:
        return sum(len(turns) for _, turns in self.sessions)


@dataclass(frozen=True)
class UserPlan:
    """A user of the store: its id, how many messages it holds, and which conversations it replays."""

    user_id: str
    size: int
    sources: tuple[int, ...]


def conversations(datasets: list[Dataset]) -> list[Conversation]:
    """Every conversation of the datasets, each with its sessions in order (empty turns left out)."""
    out = []
    for dataset in datasets:
        for conv_id, turns in dataset.turns.items():
            by_session: dict[int, list[Turn]] = {}
            for t in turns:
                if t.text.strip():
                    by_session.setdefault(t.session, []).append(t)
            out.append(Conversation(f"{dataset.name}:{conv_id}", sorted(by_session.items())))
    if not out:
        raise ValueError("the datasets hold no conversation")
    return out


def plan_users(users: int, per_user: int, big_user: int, n_sources: int) -> list[UserPlan]:
    """The users of a store: ``users`` of ``per_user`` messages, ``MID_USERS`` of ten times that
    (when it is below ``big_user``), and one of ``big_user`` (0: none)."""
    every = tuple(range(n_sources))
    plans = [UserPlan(f"u{i:04d}", per_user, (i % n_sources,)) for i in range(users)]
    mid = 10 * per_user
    if big_user and mid < big_user:
        plans += [UserPlan(f"mid{i}", mid, every) for i in range(MID_USERS)]
    if big_user:
        plans.append(UserPlan("big", big_user, every))
    return plans


def calls_of(plan: UserPlan, sources: list[Conversation]) -> Iterator[tuple[int, str, list[MessageIn]]]:
    """The user's remember calls, in order: (messages before the call, session id, messages), until
    ``plan.size`` messages; the same sequence every time, so a build resumes where it stopped."""
    position, r = 0, 0
    while True:
        for k in plan.sources:
            conv = sources[k]
            for session, turns in conv.sessions:
                take = turns[: plan.size - position]
                if not take:
                    return
                shift = timedelta(days=ROUND_SHIFT_DAYS * r)
                messages = [MessageIn(content=t.text, speaker=t.speaker or None,
                                      occurred_at=t.timestamp + shift if t.timestamp else None,
                                      source_id=f"r{r}:{k}:{t.dia_id}") for t in take]  # fmt: skip
                yield position, f"r{r}-{k}-session_{session}", messages
                position += len(take)
        r += 1


class OnceEmbedder:
    """The embedding model, with every text it embedded remembered: a store replicating texts
    embeds each once. Queries go to the model as they come.

    Args:
        model: The model to wrap.
    """

    def __init__(self, model: EmbeddingModel) -> None:
        self._model = model
        self.dim = model.embedder.dim
        self.name = model.embedder.name
        self._vectors: dict[str, np.ndarray] = {}
        self._tokens: dict[str, TokenVectors] = {}
        self._lock = threading.Lock()
        self.embedded = 0  # texts the model embedded (the rest came from memory)

    def ready(self) -> bool:
        return self._model.embedder.ready()

    def embed_query(self, text: str) -> np.ndarray:
        return self._model.embedder.embed_query(text)

    def query_tokens(self, text: str) -> TokenVectors:
        assert self._model.tokens is not None
        return self._model.tokens.query_tokens(text)

    def token_vectors(self, texts: list[str]) -> list[TokenVectors]:
        assert self._model.tokens is not None
        return self._model.tokens.token_vectors(texts)

    def embed(self, texts: list[str]) -> np.ndarray:
        new = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        if new:
            vectors = self._model.embedder.embed(new)
            with self._lock:
                self._vectors.update(zip(new, vectors, strict=True))
                self.embedded += len(new)
        return np.stack([self._vectors[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def embed_with_tokens(
        self, texts: list[str], project: Callable[[int], np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[TokenVectors]]:
        """As the model's, every text once (``project`` is the same for every call of ingest)."""
        new = [t for t in dict.fromkeys(texts) if t not in self._tokens]
        if new:
            assert self._model.tokens is not None
            vectors, tokens = self._model.tokens.embed_with_tokens(new, project)
            with self._lock:
                self._vectors.update(zip(new, vectors, strict=True))
                self._tokens.update(zip(new, tokens, strict=True))
                self.embedded += len(new)
        vectors = np.stack([self._vectors[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)
        return vectors, [self._tokens[t] for t in texts]

    def as_model(self) -> EmbeddingModel:
        """This embedder as the service takes its model."""
        return EmbeddingModel(self, self if self._model.tokens is not None else None)  # type: ignore[arg-type]


def build_users(service: MemoryService, plans: list[UserPlan], sources: list[Conversation],
                have: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    """Bring every planned user to its size through remember, one call per session, resuming after
    the ``have`` messages each holds already (a session cut short is sent again whole: remember
    skips its repeats). Waits for everything accepted to be stored."""
    todo = sum(max(0, p.size - have.get(p.user_id, 0)) for p in plans)
    progress = Progress("build", todo, unit="msg")
    stored = calls = 0
    started = time.perf_counter()
    for plan in plans:
        done = have.get(plan.user_id, 0)
        if done >= plan.size:
            continue
        for position, session_id, messages in calls_of(plan, sources):
            if position + len(messages) <= done:
                continue
            result = service.remember(messages=messages, user_id=plan.user_id, session_id=session_id)
            stored += result.stored
            calls += 1
            progress.advance(position + len(messages) - max(position, done))
            if calls % 200 == 0:
                service.settle()  # what waits stays bounded (the worker's queue holds the texts)
    service.settle()
    seconds = time.perf_counter() - started
    progress.close()
    return {"stored": stored, "remember_calls": calls, "seconds": round(seconds, 1),
            "messages_per_s": round(stored / seconds, 1) if stored and seconds else 0.0}  # fmt: skip
