"""``remember`` off the caller's path: accept durably, answer, then embed, derive and store.

The caller's part is cheap: validate, tell repeats (against the store and what waits), build
the records with their ids, and write them to the inbox (one synced file). The rest (facts,
session summaries, embeddings, the log append and the overlays) runs on one worker thread,
a user's waiting calls together, so a burst of single messages is embedded and appended in
batches. Reads of a user first wait for that user's accepted calls (read-your-writes): what
``remember`` acknowledged is findable by the next recall. A crash before the worker stores a
call leaves its file in the inbox; the next start stores it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from mnemoplan.ingest.pipeline import IngestResult, Ingestor, NewMemory
from mnemoplan.model import Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.inbox import Accepted, Inbox
from mnemoplan.storage.store import MemoryStore

log = logging.getLogger(__name__)

MAX_BATCH = 64  # records stored in one go: bounds how long one user's batch holds the worker


@dataclass
class _UserQueue:
    waiting: list[Accepted] = field(default_factory=list)
    busy: bool = False  # the worker holds a batch of this user


class DeferredIngest:
    """Accepted calls per user, stored in order by one worker thread.

    Args:
        store: The memory store (its per-user write lock orders the worker against forgets).
        ingestor: Derives, embeds and stores.
        inbox: Where accepted calls wait, durably.
        stored: Told (user, session, stored records) after each stored batch (LLM extraction).
    """

    def __init__(
        self,
        store: MemoryStore,
        ingestor: Ingestor,
        inbox: Inbox,
        stored: Callable[[str, str, list[Record]], None] | None = None,
    ) -> None:
        self.store, self.ingestor, self.inbox = store, ingestor, inbox
        self._stored = stored
        self._cond = threading.Condition()
        self._users: dict[str, _UserQueue] = {}
        self._closed = False
        self.failures: list[str] = []
        self._worker = threading.Thread(target=self._run, name="mnemoplan-ingest", daemon=True)
        for accepted in inbox.left_over():  # acknowledged by an earlier run, never stored
            self._users.setdefault(accepted.user_id, _UserQueue()).waiting.append(accepted)
        self._worker.start()

    # -- the caller's side -----------------------------------------------------------------

    def accept(
        self, user_id: str, memories: list[NewMemory], session_id: str, project_id: str
    ) -> tuple[list[str], int]:
        """Accept one call durably; its ids and how many of its memories were repeats.

        Raises:
            OSError: The inbox could not be written (nothing was accepted).
        """
        with self._cond:
            if self._closed:
                raise RuntimeError("the ingest queue is closed")
            ids, fresh, duplicates = self.ingestor.prepare(user_id, memories, session_id, project_id, self)
            if fresh:
                accepted = self.inbox.put(user_id, session_id, fresh)
                self._users.setdefault(user_id, _UserQueue()).waiting.append(accepted)
                self._cond.notify_all()
        return ids, duplicates

    def existing(self, user_id: str, session_id: str, hashes: list[str], sources: list[str]) -> dict[str, str]:
        """Ids waiting (or being stored), by content hash and by ``src:<source id>`` in the session."""
        wanted, srcs = set(hashes), set(sources)
        out: dict[str, str] = {}
        for rec in self._waiting_records(user_id):
            if rec.content_hash in wanted:
                out.setdefault(rec.content_hash, rec.id)
            if rec.source_id in srcs and rec.session_id == session_id:
                out.setdefault(f"src:{rec.source_id}", rec.id)
        return out

    def tail(self, user_id: str, session_id: str) -> list[tuple[str, str]]:
        """(content hash, id) of the session's waiting messages, oldest first."""
        return [(r.content_hash, r.id) for r in self._waiting_records(user_id)
                if r.session_id == session_id and r.kind == "message"]  # fmt: skip

    def _waiting_records(self, user_id: str) -> list[Record]:
        queue = self._users.get(user_id)
        return [r for a in queue.waiting for r in a.records] if queue else []

    def wait(self, user_id: str | None = None) -> None:
        """Block until the user's (or everyone's) accepted calls are stored (or failed)."""
        with self._cond:
            self._cond.wait_for(lambda: self._idle(user_id))

    def pending(self, user_id: str | None = None) -> int:
        """Records accepted and not yet stored."""
        with self._cond:
            users = [user_id] if user_id is not None else list(self._users)
            return sum(len(a.records) for u in users if u in self._users for a in self._users[u].waiting)

    def _idle(self, user_id: str | None) -> bool:
        users = [user_id] if user_id is not None else list(self._users)
        return all(u not in self._users for u in users)

    def drop(self, user_id: str) -> None:
        """A forget of the whole user: waiting calls of theirs are not stored (caller waits first
        for any batch under way, see ``wait``)."""
        with self._cond:
            queue = self._users.get(user_id)
            if queue is not None and not queue.busy:
                del self._users[user_id]
                self._cond.notify_all()
        self.inbox.drop(user_id)

    # -- the worker ------------------------------------------------------------------------

    def _next(self) -> tuple[str, list[Accepted]] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._closed or any(q.waiting and not q.busy for q in self._users.values()))
            for user_id, queue in self._users.items():
                if queue.waiting and not queue.busy:
                    batch, size = [], 0
                    for accepted in queue.waiting:
                        if batch and (size + len(accepted.records) > MAX_BATCH
                                      or accepted.session_id != batch[0].session_id):  # fmt: skip
                            break
                        batch.append(accepted)
                        size += len(accepted.records)
                    queue.busy = True
                    return user_id, batch
            return None  # closed, nothing left

    def _run(self) -> None:
        while True:
            picked = self._next()
            if picked is None:
                return
            user_id, batch = picked
            result: IngestResult | None = None
            try:
                result = self._store(user_id, batch)
            except Exception as exc:  # the files stay: the next start stores them
                log.exception("storing %d accepted message(s) failed; they are stored at the next start",
                              sum(len(a.records) for a in batch))  # fmt: skip
                self.failures.append(f"storing accepted messages failed ({type(exc).__name__}); retried at restart")
            if result is not None:  # before waiters hear of it: a forget of the user finds no file
                for accepted in batch:
                    self.inbox.done(accepted)
            with self._cond:
                queue = self._users[user_id]
                queue.waiting = queue.waiting[len(batch):]
                queue.busy = False
                if not queue.waiting:
                    del self._users[user_id]
                self._cond.notify_all()
            if result is not None:
                if self._stored is not None and result.stored:
                    try:
                        self._stored(user_id, batch[0].session_id, result.stored)
                    except Exception:
                        log.exception("a listener of stored messages failed")

    def _store(self, user_id: str, batch: list[Accepted]) -> IngestResult:
        records = [r for a in batch for r in a.records]
        with self.store.writing(user_id):
            known = set(self.store.log.ids(RecordFilter(user_id, ids=tuple(r.id for r in records))))
            fresh = [r for r in records if r.id not in known]  # a crash after the append stored them
            return self.ingestor.store_prepared(user_id, fresh, batch[0].session_id)

    def close(self) -> None:
        """Store what waits, then stop the worker."""
        self.wait()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join()
