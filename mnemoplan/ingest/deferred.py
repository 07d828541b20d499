"""``remember`` off the caller's path: accept durably, answer, then embed, derive and store.

The caller's part is cheap: validate, tell repeats (against the store and what waits), build
the records with their ids, and write them to the inbox (one synced file). The rest (facts,
session summaries, embeddings, the log append and the overlays) runs on one worker thread,
a user's waiting calls together, so a burst of single messages is embedded and appended in
batches.

What ``remember`` acknowledged is findable by the next recall (read-your-writes), without the
recall waiting for the embedding: recall searches what still waits by its words
(``unindexed``) and reads it from here (``WithWaiting``). Other reads (deep search, forget)
wait for the user's accepted calls. A store that fails is retried at once, then with a growing
delay; its messages keep waiting (found, and a retried call is still a repeat), and ``warnings``
says so. A crash before the worker stores a call leaves its file in the inbox; the next start
stores it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from mnemoplan.extract.attributes import asked_attribute
from mnemoplan.ingest.pipeline import IngestResult, Ingestor, NewMemory
from mnemoplan.model import Record, RecordHead
from mnemoplan.model.scope import RecordFilter, Scope
from mnemoplan.storage.bm25 import BM25Doc
from mnemoplan.storage.documents import bm25_doc
from mnemoplan.storage.inbox import Accepted, Inbox
from mnemoplan.storage.locks import KeyedLocks
from mnemoplan.storage.store import MemoryStore

log = logging.getLogger(__name__)

# Records stored in one go, of one user, whatever their sessions: one pass of the model over many
# short texts runs faster than several (bench/README.md); the cap bounds how long a batch holds the
# worker (and the user's write lock).
MAX_BATCH = 128
RETRY_FIRST_S = 0.5  # a failed store is retried after this, then twice as long each time...
RETRY_MOST_S = 60.0  # ...up to this


@dataclass
class _UserQueue:
    waiting: list[Accepted] = field(default_factory=list)
    busy: bool = False  # the worker holds a batch of this user
    failures: int = 0  # failed stores in a row of the first waiting batch
    error: str = ""  # why the last one failed
    retry_at: float = 0.0  # monotonic time before which the worker leaves this user's batch alone

    def ready(self, now: float) -> bool:
        return bool(self.waiting) and not self.busy and self.retry_at <= now


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
        self._cond = threading.Condition()  # over the queues; held briefly (every recall reads what waits)
        self._accepting = KeyedLocks()  # a user's calls accepted one at a time, in order
        self._users: dict[str, _UserQueue] = {}
        self._closed = False  # new calls refused
        self._stopping = False  # the worker stops once nothing waits that may be stored now
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
        # Under the user's lock alone: telling repeats may read the user's ledger and catalog from
        # the log (a first call of the user), and the inbox's file is synced; every recall, of any
        # user, meanwhile reads what waits under the queues' lock.
        with self._accepting.hold(user_id):
            with self._cond:
                if self._closed:
                    raise RuntimeError("the ingest queue is closed")
            ids, fresh, duplicates = self.ingestor.prepare(user_id, memories, session_id, project_id, self)
            if fresh:
                accepted = self.inbox.put(user_id, session_id, fresh)
                with self._cond:
                    self._users.setdefault(user_id, _UserQueue()).waiting.append(accepted)
                    self._cond.notify_all()
        return ids, duplicates

    def existing(self, user_id: str, session_id: str, hashes: list[str], sources: list[str]) -> dict[str, str]:
        """Ids waiting (or being stored), by content hash and by ``src:<source id>`` in the session."""
        wanted, srcs = set(hashes), set(sources)
        out: dict[str, str] = {}
        for rec in self.waiting(user_id):
            if rec.content_hash in wanted:
                out.setdefault(rec.content_hash, rec.id)
            if rec.source_id in srcs and rec.session_id == session_id:
                out.setdefault(f"src:{rec.source_id}", rec.id)
        return out

    def tail(self, user_id: str, session_id: str) -> list[tuple[str, str]]:
        """(content hash, id) of the session's waiting messages, oldest first."""
        return [(r.content_hash, r.id) for r in self.waiting(user_id)
                if r.session_id == session_id and r.kind == "message"]  # fmt: skip

    def _waiting_records(self, user_id: str) -> list[Record]:
        queue = self._users.get(user_id)
        return [r for a in queue.waiting for r in a.records] if queue else []

    def waiting(self, user_id: str) -> list[Record]:
        """The user's records accepted and not yet stored (those being stored included), in order."""
        with self._cond:
            return self._waiting_records(user_id)

    def unindexed(self, user_id: str) -> list[BM25Doc]:
        """What BM25 would index of the user's waiting records (the text alone, without the turn before)."""
        return [bm25_doc(r, None) for r in self.waiting(user_id)]

    def warnings(self, user_id: str) -> list[str]:
        """What a tool's result says while the user's accepted messages cannot be stored."""
        with self._cond:
            queue = self._users.get(user_id)
            if queue is None or not queue.failures:
                return []
            count = sum(len(a.records) for a in queue.waiting)
        return [f"{count} accepted message(s) are not stored yet: storing them failed {queue.failures} time(s) "
                f"({queue.error}); they are retried in the background, and found by their words meanwhile"]

    def wait(self, user_id: str | None = None, *, stored: bool = False) -> None:
        """Block until the user's (or everyone's) accepted calls are stored, or (unless ``stored``)
        wait for the retry of a store that failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._idle(user_id, stored))

    def wait_for_facts(self, scope: Scope, query: str) -> None:
        """Before recall answers a question about one of the asker's attributes ("where do I live
        now?"), wait for the records it may read that still wait: the answer's fact would be read
        from them (``planner.slots``), and the older value would lead meanwhile. Any other recall
        searches what waits by its words, without waiting."""
        if not asked_attribute(query)[0]:
            return
        with self._cond:
            waiting = self._waiting_records(scope.user_id)
        if any(scope.admits(r) for r in waiting):  # the caller's own session is left out: not waited for
            self.wait(scope.user_id)

    def pending(self, user_id: str | None = None) -> int:
        """Records accepted and not yet stored."""
        with self._cond:
            users = [user_id] if user_id is not None else list(self._users)
            return sum(len(a.records) for u in users if u in self._users for a in self._users[u].waiting)

    def _idle(self, user_id: str | None, stored: bool = False) -> bool:
        users = [user_id] if user_id is not None else list(self._users)
        queues = [self._users[u] for u in users if u in self._users]
        return all(not stored and q.failures and not q.busy for q in queues)

    def drop(self, user_id: str) -> None:
        """A forget of the whole user: waiting calls of theirs are not stored (caller waits first
        for any batch under way, see ``wait``); a call of theirs being accepted is let finish
        first, and goes too."""
        with self._accepting.hold(user_id):
            with self._cond:
                queue = self._users.get(user_id)
                if queue is not None and not queue.busy:
                    del self._users[user_id]
                    self._cond.notify_all()
            self.inbox.drop(user_id)

    def discard(self, user_id: str, keep: Callable[[Record], bool]) -> list[str]:
        """A forget of records that still wait (their store failed): those ``keep`` refuses are not
        stored, and leave the inbox. Returns their ids. The caller waited first (``wait``)."""
        gone: list[str] = []
        with self._accepting.hold(user_id), self._cond:
            queue = self._users.get(user_id)
            if queue is None or queue.busy:
                return gone
            kept: list[Accepted] = []
            for accepted in queue.waiting:
                records = [r for r in accepted.records if keep(r)]
                gone += [r.id for r in accepted.records if not keep(r)]
                if len(records) < len(accepted.records):
                    self.inbox.done(accepted)
                    if records:
                        accepted = self.inbox.put(accepted.user_id, accepted.session_id, records)
                if records:
                    kept.append(accepted)
            queue.waiting = kept
            if not kept:
                del self._users[user_id]
            self._cond.notify_all()
        return gone

    # -- the worker ------------------------------------------------------------------------

    def _next(self) -> tuple[str, list[Accepted]] | None:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._stopping and not any(q.ready(now) for q in self._users.values()):
                    return None  # closed, nothing left that may be stored now
                if any(q.ready(now) for q in self._users.values()):
                    break
                retries = [q.retry_at for q in self._users.values() if q.waiting and not q.busy]
                self._cond.wait(timeout=max(0.0, min(retries) - now) if retries else None)
            for user_id, queue in self._users.items():
                if queue.ready(now):
                    batch, size = [], 0
                    for accepted in queue.waiting:
                        if batch and size + len(accepted.records) > MAX_BATCH:
                            break
                        batch.append(accepted)
                        size += len(accepted.records)
                    queue.busy = True
                    return user_id, batch
            return None

    def _run(self) -> None:
        while True:
            picked = self._next()
            if picked is None:
                return
            user_id, batch = picked
            result: IngestResult | None = None
            error = ""
            try:
                result = self._store(user_id, batch)
            except Exception as exc:  # the batch keeps waiting (and its files stay): retried, later and later
                error = f"{type(exc).__name__}: {exc}"[:200]
                log.exception("storing %d accepted message(s) failed; retried in the background",
                              sum(len(a.records) for a in batch))  # fmt: skip
                self.failures.append(f"storing accepted messages failed ({type(exc).__name__}); retried")
            if result is not None:  # before waiters hear of it: a forget of the user finds no file,
                for accepted in batch:  # and a remember with flush finds its messages noted
                    self.inbox.done(accepted)
                self._tell_stored(user_id, batch, result)
            with self._cond:
                queue = self._users[user_id]
                queue.busy = False
                if result is None:
                    queue.failures += 1
                    queue.error = error
                    queue.retry_at = time.monotonic() + min(RETRY_MOST_S, RETRY_FIRST_S * 2 ** (queue.failures - 1))
                else:
                    queue.waiting = queue.waiting[len(batch):]
                    queue.failures, queue.error, queue.retry_at = 0, "", 0.0
                    del self._users[user_id]
                    if queue.waiting:  # to the back: one user's large import does not hold up the others
                        self._users[user_id] = queue
                self._cond.notify_all()

    def _tell_stored(self, user_id: str, batch: list[Accepted], result: IngestResult) -> None:
        if self._stored is None:
            return
        for accepted in batch:  # per call, so per session
            mine = {r.id for r in accepted.records}
            stored = [r for r in result.stored if r.id in mine]
            try:
                if stored:
                    self._stored(user_id, accepted.session_id, stored)
            except Exception:
                log.exception("a listener of stored messages failed")

    def _store(self, user_id: str, batch: list[Accepted]) -> IngestResult:
        records = [r for a in batch for r in a.records]
        with self.store.writing(user_id):
            known = set(self.store.log.ids(RecordFilter(user_id, ids=tuple(r.id for r in records))))
            fresh = [r for r in records if r.id not in known]  # a crash after the append stored them
            return self.ingestor.store_prepared(user_id, fresh)

    def close(self) -> None:
        """Refuse new calls, store what waits (calls being accepted included), then stop the worker
        (what keeps failing stays in the inbox for the next start)."""
        with self._cond:
            self._closed = True  # an accept checks this first
        self._accepting.wait_idle()  # those past the check have joined the queue
        self.wait()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._worker.join()


class RecordReader(Protocol):
    """What recall reads records from (the log)."""

    def get(self, user_id: str, ids: list[str]) -> dict[str, Record]:
        """Records of one user by id."""
        ...

    def heads(self, user_id: str, ids: list[str]) -> dict[str, RecordHead] | None:
        """What ranking reads of some records, if held in memory; else None."""
        ...

    def select(self, where: RecordFilter, columns: list[str]) -> list[dict[str, Any]]:
        """Some columns of the records a filter selects."""
        ...


class WithWaiting:
    """The log as recall reads records, and the records still waiting to be stored besides
    (``RecordSource``): what the search found of them by their words is returned like any memory.

    Args:
        log: Reads stored records (the log).
        deferred: What waits.
    """

    def __init__(self, log: RecordReader, deferred: DeferredIngest) -> None:
        self._log, self._deferred = log, deferred

    def _waiting(self, user_id: str, ids: list[str], found: Mapping[str, object]) -> dict[str, Record]:
        missing = set(ids) - found.keys()
        if not missing:
            return {}
        return {r.id: r for r in self._deferred.waiting(user_id) if r.id in missing}

    def get(self, user_id: str, ids: list[str]) -> dict[str, Record]:
        """Records of one user by id: waiting, else stored. Waiting ones are looked up first: the
        log holds none of them, and asking it for an id it lacks is a read of the table (~10 ms on
        an agent's store, most of a recall right after a remember)."""
        wanted = set(ids)
        waiting = {r.id: r for r in self._deferred.waiting(user_id) if r.id in wanted} if ids else {}
        found = self._log.get(user_id, [rid for rid in ids if rid not in waiting])
        return {**found, **waiting}

    def heads(self, user_id: str, ids: list[str]) -> dict[str, RecordHead] | None:
        """What ranking reads of some records, if the log holds the user in memory (see ``LanceLog.heads``)."""
        found = self._log.heads(user_id, ids)
        if found is None:
            return None
        return {**found, **{rid: r.head() for rid, r in self._waiting(user_id, ids, found).items()}}

    def select(self, where: RecordFilter, columns: list[str]) -> list[dict[str, Any]]:
        """Some columns of the stored records a filter selects (``LanceLog.select``): the attribute
        facts a question about the asker reads were stated by a stored record's facts, or by a
        remember of a fact, which stores before it answers."""
        return self._log.select(where, columns)
