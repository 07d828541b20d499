"""The write path of ``remember``: de-duplicate, extract, embed, store, derive (names, times,
facts, passages of long messages, and session summaries: ``ingest.episodes``). The raw text is
stored verbatim: extraction only adds to it, and a failure there never loses a message."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np

from mnemoplan.extract.facts import extract_facts
from mnemoplan.extract.names import KnownKeys, mentions_for
from mnemoplan.extract.summary import SentenceCache
from mnemoplan.extract.times import event_span, find_times
from mnemoplan.ingest import attributes
from mnemoplan.ingest.derive import decide, fact_record, passage_records, subject_key
from mnemoplan.ingest.episodes import episode_vector, episodes_due
from mnemoplan.inference.embedder import TokenVectors
from mnemoplan.ingest.embedding import Progress, RecordEmbedder
from mnemoplan.storage.store import MemoryStore
from mnemoplan.model import Record
from mnemoplan.model.scope import RecordFilter

log = logging.getLogger(__name__)

IMPORTANCE = {"message": 0.5, "fact": 0.7, "procedure": 0.7, "episode": 0.6}


@dataclass
class NewMemory:
    """One validated input of remember."""

    text: str
    kind: str = "message"
    speaker: str = ""
    occurred_at: datetime | None = None
    source_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    derived_from: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MentionJob:
    """Records naming ``old_values`` (not ``new_value``) said by ``subject`` or an assistant before ``at``
    are superseded by ``by``."""

    old_values: list[str]
    new_value: str
    at: datetime
    by: str
    subject: str


@dataclass
class IngestResult:
    """What an ingest call stored."""

    ids: list[str]
    stored: list[Record]
    duplicates: int
    derived: int = 0
    warnings: list[str] = field(default_factory=list)


class PendingView(Protocol):
    """What ``prepare`` reads of the writes accepted but not yet stored (``ingest.deferred``)."""

    def existing(self, user_id: str, session_id: str, hashes: list[str], sources: list[str]) -> dict[str, str]:
        """Ids waiting to be stored, by content hash and by ``src:<source id>`` within the session."""
        ...

    def tail(self, user_id: str, session_id: str) -> list[tuple[str, str]]:
        """(content hash, id) of the session's messages waiting to be stored, oldest first."""
        ...


class SourcesGone(Exception):
    """Records that facts were read from were forgotten before the facts could be stored."""

    def __init__(self, missing: set[str]) -> None:
        super().__init__(f"{len(missing)} source record(s) forgotten meanwhile")
        self.missing = missing


@dataclass(frozen=True)
class IngestConfig:
    """Knobs of ingestion.

    Attributes:
        extract_facts: Read simple facts out of messages by rule.
        fact_similarity: A new fact at least this similar to a current one reinforces it.
        episode_every: Summarise a session again after this many new messages (0: never).
        episode_span: The most messages one summary covers: a longer session is summarised
            stretch by stretch, so a summary's cost does not grow with the session.
    """

    extract_facts: bool = True
    fact_similarity: float = 0.9
    episode_every: int = 10
    episode_span: int = 100


def content_hash(user_id: str, project_id: str, session_id: str, mem: NewMemory) -> str:
    """The identity of a memory's content: a repeat with the same hash is not stored again."""
    when = mem.occurred_at.isoformat() if mem.occurred_at else ""
    parts = [user_id, project_id, session_id, mem.kind, mem.speaker, mem.text, when]
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()


class Ingestor:
    """Turns validated inputs into stored records.

    Args:
        store: The memory store.
        embed: Embeds a batch of texts.
        config: What to derive.
        embed_with_tokens: Embeds a batch of texts and gives their token vectors from the same
            pass, projected by ``token_vectors.projection`` (``SentenceEmbedder.embed_with_tokens``);
            with it, each record's tokens are stored for the ``token_match`` index.
        sentences: What session summaries read of each sentence, kept between summaries. Whoever
            passes it must have the store's deletes empty it (``MemoryStore(forgotten=...)``);
            without it, nothing is kept past one summary.
    """

    def __init__(
        self, store: MemoryStore, embed: Callable[[list[str]], np.ndarray], config: IngestConfig | None = None,
        embed_with_tokens: Callable[..., tuple[np.ndarray, list[TokenVectors]]] | None = None,
        sentences: SentenceCache | None = None,
    ) -> None:  # fmt: skip
        self.store = store
        self.vectors = RecordEmbedder(embed, embed_with_tokens, store.bm25.terms)
        self.config = config or IngestConfig()
        self.sentences = sentences
        # per user, the records to close that ``_settle_facts`` found and ``_apply`` closes
        self._mentions: dict[str, list[MentionJob]] = {}

    def embed_records(
        self, records: list[Record], progress: Progress | None = None
    ) -> tuple[np.ndarray, list[bytes | None]]:
        """Each record's vector and packed token vectors (see ``RecordEmbedder.embed_records``)."""
        return self.vectors.embed_records(records, progress)

    def prepare(
        self, user_id: str, memories: list[NewMemory], session_id: str, project_id: str,
        pending: PendingView | None = None,
    ) -> tuple[list[str], list[Record], int]:
        """The records of new memories, with their ids, and the ids of repeats (stored, or with
        ``pending`` still waiting to be: a retry of a call whose write is under way is a repeat).

        Returns (the id of each memory, the records to store, how many were repeats).
        """
        now = datetime.now(UTC)
        hashes = [content_hash(user_id, project_id, session_id, m) for m in memories]
        sources = [m.source_id for m in memories if m.source_id]
        # Pending first: a write leaves the pending ones only once the store holds it.
        existing = pending.existing(user_id, session_id, hashes, sources) if pending is not None else {}
        existing = {**self.store.existing(user_id, session_id, hashes, sources), **existing}
        # A message with neither source id nor time cannot be told from another saying the same
        # ("Yes" to two questions): it is a repeat only as part of a retried call, that is when
        # such messages of the call, in order, are the session's last messages.
        loose = [i for i, m in enumerate(memories) if not m.source_id and m.occurred_at is None and m.kind == "message"]
        retried: dict[int, str] = {}
        if loose and all(hashes[i] in existing for i in loose):
            waiting = pending.tail(user_id, session_id) if pending is not None else []
            stored_tail = self.store.session_tail(user_id, session_id, max(0, len(loose) - len(waiting)))
            tail = (stored_tail + waiting)[-len(loose):]
            if [h for h, _ in tail] == [hashes[i] for i in loose]:
                retried = {i: rid for i, (_, rid) in zip(loose, tail, strict=True)}
        loose_set = set(loose)
        known = KnownKeys(frozenset(self.store.catalog(user_id).entities))  # its keys, made once per call
        ids: list[str] = []
        fresh: list[Record] = []
        duplicates = 0
        for i, (mem, digest) in enumerate(zip(memories, hashes, strict=True)):
            # A source id is the message's identity: same text under another id is another
            # message. Without one, the same content (and time) an earlier call stored is a
            # repeat, but not the same content twice in one call.
            if mem.source_id:
                prior = existing.get(f"src:{mem.source_id}")
            else:
                prior = retried.get(i) if i in loose_set else existing.get(digest)
            if prior:
                ids.append(prior)
                duplicates += 1
                continue
            when = mem.occurred_at or now
            start, end = event_span(find_times(mem.text, when))
            rec = Record(
                id=uuid.uuid4().hex, user_id=user_id, project_id=project_id, session_id=session_id,
                kind=mem.kind, speaker=mem.speaker, text=mem.text, occurred_at=when, created_at=now,  # type: ignore[arg-type]
                source_id=mem.source_id, content_hash=digest, derived_from=mem.derived_from,
                metadata=mem.metadata, importance=IMPORTANCE.get(mem.kind, 0.5),
                entities=mentions_for(mem.text, mem.speaker, known), event_start=start, event_end=end,
                valid_from=when if mem.kind == "fact" else None,
            )  # fmt: skip
            if mem.source_id:
                existing[f"src:{mem.source_id}"] = rec.id
            ids.append(rec.id)
            fresh.append(rec)
        return ids, fresh, duplicates

    def _facts_of(self, messages: list[Record]) -> list[Record]:
        if not self.config.extract_facts:
            return []
        known = KnownKeys(frozenset(self.store.catalog(messages[0].user_id).entities) if messages else frozenset())
        out = []
        for msg in messages:
            if msg.kind != "message" or not msg.speaker:
                continue  # without a speaker, "I" cannot be resolved: no fact beats a wrong one
            try:
                candidates = extract_facts(msg.text, msg.speaker, msg.occurred_at, known_names=known)
            except Exception:  # extraction is a bonus: it must never cost a message
                log.exception("fact extraction failed on one message; the message is stored anyway")
                continue
            out.extend(fact_record(msg, fc) for fc in candidates)
            try:
                out.extend(attributes.records_of(msg))
            except Exception:  # as above: a bonus, never a lost message
                log.exception("attribute extraction failed on one message; the message is stored anyway")
        return out

    def _settle_facts(
        self, user_id: str, facts: list[Record], vectors: np.ndarray
    ) -> tuple[list[int], list[tuple[str, str]], list[str]]:
        """Decide each new fact: (indexes to store, (old, new) supersessions, reinforced old ids).

        An attribute fact's supersessions also close the records that named the old value
        (``attributes``): those are queued in ``self._mentions`` for ``_apply``."""
        ledger = self.store.ledger(user_id)
        keep: list[int] = []
        supersede: list[tuple[str, str]] = []
        reinforce: list[str] = []
        jobs = self._mentions[user_id] = []
        for i, fact in enumerate(facts):
            if attributes.is_attribute_fact(fact):
                subject = subject_key(fact)
                verdict = attributes.decide(fact, ledger.current_facts(subject))
                if verdict.store:
                    ledger.add_fact(fact.id, fact.metadata, vectors[i], 1, fact)
                    ledger.by_hash[fact.content_hash] = fact.id
                    keep.append(i)
                by = fact.id if verdict.store else (fact.derived_from[0] if fact.derived_from else "")
                supersede.extend((old, by) for old in verdict.supersede if by)
                for old in verdict.supersede:
                    ledger.retire_fact(old)  # later facts of this call see the change
                if verdict.ended and by:
                    jobs.append(MentionJob(verdict.ended, str(fact.metadata.get("value", "")),
                                                     fact.occurred_at, by, str(fact.metadata.get("subject", ""))))
                continue
            if fact.content_hash in ledger.by_hash:
                reinforce.append(ledger.by_hash[fact.content_hash])
                continue
            subject = subject_key(fact)
            decision = decide(fact, vectors[i], ledger.current_facts(subject), self.config.fact_similarity)
            if not decision.store:
                reinforce.append(decision.reinforce)
                continue
            if decision.contradicts:
                fact.metadata["contradicts"] = decision.contradicts
            supersede.extend((old, fact.id) for old in decision.supersede)
            ledger.add_fact(fact.id, fact.metadata, vectors[i], 1, fact)  # later facts of this call see it
            ledger.by_hash[fact.content_hash] = fact.id
            keep.append(i)
        return keep, supersede, reinforce

    def ingest(
        self, user_id: str, memories: list[NewMemory], *, session_id: str = "", project_id: str = "",
        progress: Progress | None = None,
    ) -> IngestResult:
        """Store new memories of one user (in order), skipping repeats, then derive facts and episodes.

        ``progress`` hears of the embedding (most of the time of a large call), in sentences.
        One user's calls (and forgets) run one at a time (``MemoryStore.writing``): each looks
        for repeats, current facts and a due summary in what the one before stored.
        """
        with self.store.writing(user_id):
            return self._ingest(user_id, memories, session_id, project_id, progress)

    def store_prepared(self, user_id: str, fresh: list[Record], progress: Progress | None = None) -> IngestResult:
        """Derive facts and summaries of records ``prepare`` made (of one session or several), embed
        and store them all, in one pass of the model and one append.

        The caller holds the user's write lock (``MemoryStore.writing``).
        """
        ids = [r.id for r in fresh]
        if not fresh:
            return IngestResult(ids, [], 0)
        return self._derive_and_store(user_id, ids, fresh, 0, progress)

    @contextmanager
    def _ledger_kept_true(self, user_id: str) -> Iterator[None]:
        """A write notes new facts in the ledger before it stores them; if it fails on the way
        (the model, the log, a summary's vector), the ledger is read from the log again rather
        than list facts that were never stored."""
        try:
            yield
        except BaseException:
            self.store.drop_ledger(user_id)
            raise

    def _ingest(
        self, user_id: str, memories: list[NewMemory], session_id: str, project_id: str,
        progress: Progress | None,
    ) -> IngestResult:  # fmt: skip
        ids, fresh, duplicates = self.prepare(user_id, memories, session_id, project_id)
        if not fresh:
            return IngestResult(ids, [], duplicates)
        return self._derive_and_store(user_id, ids, fresh, duplicates, progress)

    def _derive_and_store(
        self, user_id: str, ids: list[str], fresh: list[Record], duplicates: int, progress: Progress | None,
    ) -> IngestResult:  # fmt: skip
        facts = self._facts_of(fresh)
        passages = [p for m in fresh if m.kind == "message" for p in passage_records(m)]
        warnings: list[str] = []
        episodes: list[Record] = []
        replaced: dict[str, list[str]] = {}  # summaries a fresh one replaces, by session
        for session_id in dict.fromkeys(r.session_id for r in fresh):
            try:
                made, gone = episodes_due(self.store, self.config.episode_every, self.config.episode_span,
                                          self.sentences, user_id, session_id,
                                          [r for r in fresh if r.session_id == session_id])  # fmt: skip
            except Exception:
                log.exception("the session summary could not be made; the messages are stored")
                warnings.append("the session summary could not be refreshed (the messages are stored)")
                continue
            episodes += made
            if gone:
                replaced[session_id] = gone
        vectors, tokens = self.embed_records(fresh + facts + passages, progress)
        n, m = len(fresh), len(fresh) + len(facts)
        fact_vectors = vectors[n:m]
        with self._ledger_kept_true(user_id):
            settled = self._settle_facts(user_id, facts, fact_vectors) if facts else ([], [], [])
            keep, supersede, reinforce = settled
            records = fresh + [facts[i] for i in keep] + passages
            rows = [vectors[:n], fact_vectors[keep], vectors[m:]]
            packed = tokens[:n] + [tokens[n + i] for i in keep] + tokens[m:]
            for episode in episodes:  # a summary's words are its messages': no tokens of its own
                records.append(episode)
                rows.append(episode_vector(self.store, episode, fresh, vectors[:n])[None, :])
                packed.append(None)
            for session_id, gone in replaced.items():
                self.store.retract(user_id, gone, session_id)
            stored = self.store.append(records, np.concatenate(rows), packed)
            self._apply(user_id, supersede, reinforce)
        return IngestResult(ids, stored, duplicates, len(keep) + len(episodes), warnings)

    def backfill_tokens(self, user_id: str, progress: Progress | None = None, batch: int = 256) -> int:
        """Give token vectors to a user's records that have none (written before the log had
        them); summaries never have their own. Returns how many records gained them.

        Re-embeds those records, as fast as ingest embeds new ones; ``progress`` hears
        (done, total) in records."""
        if not self.vectors.gives_tokens:
            return 0
        missing = sorted(self.store.log.records_lacking_tokens(user_id), key=lambda r: r.seq)
        done = 0
        for start in range(0, len(missing), batch):
            part = missing[start : start + batch]
            _, tokens = self.embed_records(part)
            self.store.log.set_tokens(user_id, {r.id: t for r, t in zip(part, tokens, strict=True) if t is not None})
            done += len(part)
            if progress is not None:
                progress(done, len(missing))
        return done

    def add_facts(self, user_id: str, facts: list[Record], *, read: list[str] | None = None) -> list[Record]:
        """Store facts extracted elsewhere (the LLM), with the same near-duplicate and supersede rules.

        ``read``: the ids of every record the facts were read from (the LLM's whole batch; by
        default, those the facts cite). If one was forgotten since it was read, no fact is
        stored: any of them may hold what was forgotten.

        Raises:
            SourcesGone: some of ``read`` is no longer stored (nothing was stored).
        """
        if not facts:
            return []
        with self.store.writing(user_id):
            cited = [s for f in facts for s in f.derived_from]
            self._check_sources(user_id, read if read is not None else cited)
            vectors, tokens = self.embed_records(facts)
            with self._ledger_kept_true(user_id):
                keep, supersede, reinforce = self._settle_facts(user_id, facts, vectors)
                kept = [facts[i] for i in keep]
                stored = self.store.append(kept, vectors[keep], [tokens[i] for i in keep]) if keep else []
                self._apply(user_id, supersede, reinforce)
            return stored

    def _check_sources(self, user_id: str, ids: list[str]) -> None:
        wanted = sorted(set(ids))
        if not wanted:
            return
        stored = set(self.store.log.ids(RecordFilter(user_id, ids=tuple(wanted))))
        if len(stored) < len(wanted):
            raise SourcesGone(set(wanted) - stored)

    def _apply(self, user_id: str, supersede: list[tuple[str, str]], reinforce: list[str]) -> None:
        jobs = self._mentions.pop(user_id, [])
        at = {job.by: job.at for job in jobs}
        for old, new in supersede:
            self.store.supersede(user_id, old, new, at.get(new))
        for job in jobs:
            self.store.supersede_mentions(user_id, job.old_values, job.new_value, job.at, job.by,
                                          attributes.speakers_of(job.subject))
        self.store.reinforce(user_id, reinforce)
