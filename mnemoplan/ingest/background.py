"""LLM extraction in the background: every N messages of a session, or on an explicit flush.

``remember`` never waits for it: it starts once the messages are stored and findable, and
the rules' reading of them stands whatever the LLM does. The ids of messages not yet read by
the LLM are kept in a small state file (ids only, never text), so a restart, a timeout or a
garbage reply loses nothing: the batch stays pending and is retried later with a growing
delay. A batch is read ``every`` messages at a time, all under one cap of LLM requests (the
remember that made it due); what a cap leaves waits for the next one. Each way it failed is
told once, in the ``warnings`` of the user's next ``remember`` (``take_notices``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from mnemoplan.errors import MnemoError
from mnemoplan.extract.names import entity_key
from mnemoplan.inference.llm_calls import llm_scope
from mnemoplan.ingest.attributes import attribute_key, attribute_record
from mnemoplan.ingest.llm_extractor import ExtractedFact, Extraction
from mnemoplan.ingest.pipeline import Ingestor, SourcesGone
from mnemoplan.model import EntityMention, Record

log = logging.getLogger(__name__)
_SEP = "\x1f"


def llm_fact_record(user_id: str, messages: dict[str, Record], fact: ExtractedFact) -> Record:
    """A record of what the LLM extracted, derived from its source messages."""
    sources = [messages[s] for s in fact.sources if s in messages] or list(messages.values())
    first = sources[0]
    names = [fact.subject, *fact.entities] if fact.subject else list(fact.entities)
    entities: list[EntityMention] = []
    for i, name in enumerate(dict.fromkeys(n for n in names if n and entity_key(n))):
        role = "subject" if i == 0 and fact.subject else ("object" if entity_key(name) == entity_key(fact.object) else
                                                          "mention")  # fmt: skip
        entities.append(EntityMention(key=entity_key(name), name=name, role=role))
    if fact.object and entity_key(fact.object) and all(m.key != entity_key(fact.object) for m in entities):
        entities.append(EntityMention(key=entity_key(fact.object), name=fact.object, role="object"))
    day = fact.event_date
    return Record(
        id=uuid.uuid4().hex, user_id=user_id, project_id=first.project_id, session_id=first.session_id,
        kind=fact.kind, text=fact.text, occurred_at=first.occurred_at, created_at=datetime.now(UTC),
        content_hash=uuid.uuid5(uuid.NAMESPACE_URL, f"{user_id}|llm|{fact.text}").hex,
        derived_from=[m.id for m in sources],
        metadata={"subject": fact.subject, "predicate": fact.predicate, "object": fact.object,
                  "negated": fact.negated, "confidence": fact.confidence, "extractor": "llm"},
        importance=round(0.7 * (0.5 + fact.confidence / 2), 3), entities=entities,
        event_start=day, event_end=day.replace(hour=23, minute=59) if day else None, valid_from=first.occurred_at,
    )  # fmt: skip


def llm_attribute_record(messages: dict[str, Record], fact: ExtractedFact) -> Record | None:
    """The attribute fact of what the LLM read, when it names an attribute of the person an agent
    serves, said by them (as the rules read only theirs: ``attributes.records_of``); decided
    like the rules' (``attributes.decide``). None otherwise."""
    source = next((messages[s] for s in fact.sources if s in messages), None)
    attribute = attribute_key(fact.attribute)
    if (source is None or not attribute or not (fact.value or fact.ended) or not source.requests
            or entity_key(fact.subject) not in ("", "i", "me", entity_key(source.speaker))):
        return None
    # an ending ends what it names ("ended: Farfetch" is no value Farfetch): decided like the rules'
    # ending, whose sentence names the value
    sentence = f"{source.text} {fact.value}" if fact.ended else source.text
    return attribute_record(source, source.speaker, attribute, "" if fact.ended else fact.value, ending=fact.ended,
                            adds=fact.adds, sentence=sentence, extractor="llm")


class BackgroundExtraction:
    """Pending messages per (user, session), extracted by the LLM on a worker thread.

    Args:
        ingestor: Stores the facts (same dedupe and supersede rules as the rules' facts).
        fetch: Reads records of a user by id (the log).
        extract: The LLM extractor's ``extract`` (messages -> Extraction).
        state_path: JSON file of pending ids and counters.
        every: Messages of a session that trigger an extraction, and read in one LLM call.
        retry_s: First retry delay after a failure (doubles, up to an hour).
        max_calls: LLM requests one extraction run may send (retries and repairs count); 0 for no cap.
    """

    def __init__(
        self,
        ingestor: Ingestor,
        fetch: Callable[[str, list[str]], dict[str, Record]],
        extract: Callable[[list[Record]], Extraction],
        state_path: Path,
        *,
        every: int = 10,
        retry_s: float = 30.0,
        max_calls: int = 0,
    ) -> None:
        self._ingestor, self._fetch, self._extract = ingestor, fetch, extract
        self._path = state_path
        self.every = every
        self._retry_s = retry_s
        self._max_calls = max_calls
        self._notices: dict[str, list[str]] = {}  # per user, until their next remember takes them
        self._told: dict[str, str] = {}  # per user, the last failure told (each is told once)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mnemoplan-extract")
        self._timers: list[threading.Timer] = []
        self._queued: set[str] = set()
        self._retry_at: dict[str, float] = {}  # a batch that failed waits for its retry, whatever arrives
        self._closed = False
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        self.pending: dict[str, list[str]] = state.get("pending", {})
        self.failures: dict[str, int] = state.get("failures", {})
        self.counters: dict[str, int] = state.get("counters", {"extracted": 0, "failed": 0, "facts": 0})
        for key in list(self.pending):  # left over from the last run: retry now
            self._submit(key)

    def _save(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pending": self.pending, "failures": self.failures, "counters": self.counters}))
        os.replace(tmp, self._path)

    def note(self, user_id: str, session_id: str, message_ids: list[str], *, flush: bool = False) -> None:
        """Messages just stored; extraction starts once ``every`` are pending (or at once with ``flush``)."""
        key = f"{user_id}{_SEP}{session_id}"
        with self._lock:
            pending = self.pending.setdefault(key, [])
            pending.extend(i for i in message_ids if i not in pending)
            # A failed batch is tried again when its backoff ends, not at every message that joins it:
            # an LLM that is down is not asked at every remember.
            due = (flush or len(pending) >= self.every) and time.monotonic() >= self._retry_at.get(key, 0.0)
            self._save()
        if due:
            self._submit(key)

    def forget(self, user_id: str, ids: set[str] | None = None) -> None:
        """Drop pending ids of forgotten messages (or of a forgotten user)."""
        with self._lock:
            for key in [k for k in self.pending if k.split(_SEP)[0] == user_id]:
                self.pending[key] = [] if ids is None else [i for i in self.pending[key] if i not in ids]
                if not self.pending[key]:
                    del self.pending[key]
            self._save()

    def _submit(self, key: str) -> None:
        with self._lock:  # one queued run per batch: it reads the batch as it is when it starts
            if self._closed or key in self._queued:
                return
            self._queued.add(key)
        self._pool.submit(self._run, key)

    def _run(self, key: str) -> None:
        with self._lock:
            self._queued.discard(key)
            batch = list(self.pending.get(key, []))
        if not batch:
            return
        user_id = key.split(_SEP)[0]
        with llm_scope("remember", self._max_calls, "MNEMOPLAN_LLM_MAX_CALLS_PER_REMEMBER"):
            for start in range(0, len(batch), self.every):
                chunk = batch[start:start + self.every]
                try:
                    facts = self._read(user_id, chunk)
                except SourcesGone:  # part of the batch was forgotten since: read again what is left of it
                    log.info("a message of an LLM extraction batch was forgotten meanwhile; the batch is read again")
                    self._submit(key)
                    return
                except Exception as exc:  # never lose the batch: it stays pending
                    self._failed(key, user_id, len(batch) - start, exc)
                    return
                with self._lock:
                    self.pending[key] = [i for i in self.pending.get(key, []) if i not in chunk]
                    if not self.pending[key]:
                        del self.pending[key]
                    self.failures.pop(key, None)
                    self._retry_at.pop(key, None)
                    self._told.pop(user_id, None)
                    self.counters["extracted"] += len(chunk)
                    self.counters["facts"] += len(facts)
                    self._save()

    def _read(self, user_id: str, chunk: list[str]) -> list[Record]:
        """Extract and store the facts of some pending messages; the facts stored."""
        records = self._fetch(user_id, chunk)
        messages = [records[i] for i in chunk if i in records]
        extraction = self._extract(sorted(messages, key=lambda r: r.seq)) if messages else None
        by_id = {m.id: m for m in messages}
        facts = [llm_attribute_record(by_id, f) or llm_fact_record(user_id, by_id, f) for f in extraction.facts] \
            if extraction else []  # fmt: skip
        facts.sort(key=lambda f: f.occurred_at)  # attribute values decided in the order they were said
        self._ingestor.add_facts(user_id, facts, read=[m.id for m in messages])
        return facts

    def _failed(self, key: str, user_id: str, left: int, exc: Exception) -> None:
        """A run that stopped: its messages stay pending; retried later unless a cap stopped it
        (then the next remember of the session starts it again); told once to the user."""
        capped = isinstance(exc, MnemoError) and exc.code == "llm_capped"
        with self._lock:
            if not capped:
                self.failures[key] = self.failures.get(key, 0) + 1
            self.counters["failed"] += 1
            delay = min(3600.0, self._retry_s * 2 ** (self.failures.get(key, 1) - 1))
            if not capped:
                self._retry_at[key] = time.monotonic() + delay
            self._save()
            detail = exc.message if isinstance(exc, MnemoError) else type(exc).__name__
            when = "with the session's next messages" if capped else f"in {delay:.0f} s"
            if self._told.get(user_id) != detail:
                self._told[user_id] = detail
                self._notices.setdefault(user_id, []).append(
                    f"LLM extraction of {left} message(s) did not run ({detail}); they keep the rules' reading "
                    f"and wait, retried {when}.")  # fmt: skip
        log.warning("LLM extraction failed (%s); %d message(s) stay pending, retried %s", detail, left, when)
        if not capped:
            self._retry_later(key, delay)

    def take_notices(self, user_id: str) -> list[str]:
        """What went wrong with the user's extraction since they were last told, once each."""
        with self._lock:
            return self._notices.pop(user_id, [])

    def _retry_later(self, key: str, delay: float) -> None:
        if self._closed:
            return
        timer = threading.Timer(delay, self._submit, args=(key,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def retry_now(self, user_id: str | None = None) -> None:
        """Retry every pending batch (of one user) at once (tests, the bench)."""
        for key in list(self.pending):
            if user_id is None or key.split(_SEP)[0] == user_id:
                self._submit(key)

    def drain(self) -> None:
        """Wait for queued extractions to finish."""
        self._pool.submit(lambda: None).result()

    def settle(self) -> None:
        """Read every pending batch now, once, and wait for it (the bench, before it asks)."""
        self.retry_now()
        self.drain()

    def close(self) -> None:
        """Stop: pending batches stay in the state file for the next start."""
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        # Runs not started are dropped (their batches are pending in the state file); one under way
        # ends within the LLM's timeout.
        self._pool.shutdown(wait=True, cancel_futures=True)
