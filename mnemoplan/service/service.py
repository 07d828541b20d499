"""The memory service: one method per tool, over the store, the ingestor and the planners.

No MCP here: the tools, the CLI and the benchmark all call these methods, so they
exercise the same code paths.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from mnemoplan.errors import InvalidInput, MnemoError, NotFound, TooLarge
from mnemoplan.inference.embedder import Embedder
from mnemoplan.ingest.attributes import state_fact
from mnemoplan.ingest.background import BackgroundExtraction
from mnemoplan.ingest.deferred import DeferredIngest
from mnemoplan.ingest.pipeline import Ingestor, NewMemory, Progress
from mnemoplan.search.registry import IndexRegistry
from mnemoplan.service.failures import storage_errors
from mnemoplan.service.limits import Limits, json_chars
from mnemoplan.service.search_log import SearchLog, search_summary
from mnemoplan.storage.lock import can_write
from mnemoplan.storage.store import DeleteReport, MemoryStore
from mnemoplan.model import (
    DeepSearchResult,
    ExplainPlanResult,
    FactIn,
    ForgetReceipt,
    MemoryItem,
    MessageIn,
    QueryPlan,
    Record,
    RecallOptions,
    RecallResult,
    RememberResult,
    TimeRange,
    UserSummary,
    as_utc,
    check_record_ids,
    check_scope,
    check_text,
)
from mnemoplan.model.scope import RecordFilter, Scope
from mnemoplan.planner.deep import DeepSearch
from mnemoplan.planner.recall import RecallPipeline

log = logging.getLogger(__name__)
SearchResult = TypeVar("SearchResult", RecallResult, DeepSearchResult)


RECEIPT_IDS = 20  # ids a forget receipt lists; its counts cover the rest


class MemoryService:
    """Everything the tools do.

    Args:
        store: The log and overlays.
        embedder: Text embedder.
        registry: Searchable indexes.
        recall: The recall pipeline.
        deep: Deep search.
        limits: Input limits.
        default_user_id: User of calls that name none.
        ingestor: The write path.
        search_log: Where searches are logged; None for none.
        extraction: Facts extracted by an LLM in the background; None without an LLM.
        deferred: Stores remember's messages on a worker thread once accepted; None stores them
            before remember answers.
    """

    def __init__(
        self,
        *,
        store: MemoryStore,
        embedder: Embedder,
        registry: IndexRegistry,
        recall: RecallPipeline,
        deep: DeepSearch,
        limits: Limits,
        default_user_id: str,
        ingestor: Ingestor,
        search_log: SearchLog | None = None,
        extraction: BackgroundExtraction | None = None,
        deferred: DeferredIngest | None = None,
    ) -> None:
        self.extraction = extraction
        self.deferred = deferred
        self.store = store
        self.embedder = embedder
        self.registry = registry
        self.recall_pipeline = recall
        self.deep = deep
        self.limits = limits
        self.default_user_id = default_user_id
        self.ingestor = ingestor
        self.search_log = search_log
        self.on_close: list[Callable[[], None]] = []

    @property
    def read_only(self) -> bool:
        """True when the data directory could not be written when the store opened: reads only."""
        return self.store.read_only

    def writable_now(self) -> bool:
        """Whether the data directory can be written now (a read-only service is then opened anew)."""
        return can_write(self.store.data_dir)

    # -- argument checks -----------------------------------------------------------------

    def _logged(self, tool: str, user: str, query: str, search: Callable[[], SearchResult]) -> SearchResult:
        """Run a search and log it (query, plan, timings, counts, rounds, cost, outcome)."""
        started = time.perf_counter()
        entry: dict[str, Any] = {"ts": datetime.now(UTC).isoformat(), "tool": tool, "user_id": user, "query": query}
        try:
            result = search()
        except MnemoError as exc:
            entry.update(ok=False, error=exc.code)
            raise
        except Exception:
            entry.update(ok=False, error="internal_error")
            raise
        else:
            entry.update(ok=True, **search_summary(result))
            self.store.note_access([item.id for item in result.items])
            return result
        finally:
            entry["duration_ms"] = round((time.perf_counter() - started) * 1000, 3)
            if self.search_log is not None:
                self.search_log.record(entry)

    def _user(self, user_id: str | None) -> str:
        """The user named, else (None) the server's, with this server's caches of them caught up
        (``MemoryStore.catch_up``). An empty name is an error, not the server's user: a caller whose
        variable came out empty must not write to, read or forget another's memory."""
        if user_id == "":
            raise InvalidInput(
                "user_id is empty.",
                hint=f"Name the user, or leave user_id out for the server's user ({self.default_user_id!r}).",
            )
        user = check_scope(self.default_user_id if user_id is None else user_id, what="user_id", required=True)
        self.store.catch_up(user)
        return user

    def _reader(self, user_id: str | None, *, wait_accepted: bool = True) -> str:
        """The user of a read, once every write of theirs that returned is visible: stored, or
        (``wait_accepted`` False: recall, which searches them where they wait) accepted."""
        user = self._user(user_id)
        if self.deferred is not None and wait_accepted:
            self.deferred.wait(user)
        self.store.wait_for_writes(user)
        return user


    def settle(self) -> None:
        """Wait until every accepted message is stored and searchable (benchmarks, shutdown)."""
        if self.deferred is not None:
            self.deferred.wait()
        self.store.wait_for_writes()

    def _query(self, query: str) -> str:
        return check_text(query, what="query", max_chars=self.limits.max_query_chars,
                          hint="Shorten it to what is asked, or raise MNEMOPLAN_MAX_QUERY_CHARS.")

    @staticmethod
    def _own_session(session_id: str | None, include: bool) -> str | None:
        """The session a search leaves out: the caller's own, unless it asks for it."""
        session = check_scope(session_id, what="session_id")
        return session if session and not include else None

    @staticmethod
    def _window(time_range: TimeRange | None) -> tuple[datetime | None, datetime | None]:
        return (None, None) if time_range is None else (time_range.checked().after, time_range.checked().before)

    # -- tools ---------------------------------------------------------------------------

    @storage_errors("remember")
    def remember(
        self,
        *,
        content: str | None = None,
        messages: list[MessageIn] | None = None,
        user_id: str | None = None,
        session_id: str | None = None,
        project_id: str | None = None,
        occurred_at: datetime | None = None,
        kind: str | None = None,
        speaker: str | None = None,
        metadata: dict[str, Any] | None = None,
        flush: bool = False,
        progress: Progress | None = None,
        fact: FactIn | None = None,
    ) -> RememberResult:
        """Store one text or a list of messages, losslessly, skipping exact repeats; or a fact an
        agent states (an attribute's new value supersedes the old, ``ingest.attributes``).

        ``progress(done, total)`` hears how the embedding of a large call goes, in sentences.

        Raises:
            InvalidInput: neither or both of content and messages; bad text or ids.
            TooLarge: text or batch over the limits.
            ReadOnlyData: the data directory cannot be written.
            OutOfSpace: its disk is full.
        """
        self.store.check_writable()
        user = self._user(user_id)
        session = check_scope(session_id, what="session_id")
        project = check_scope(project_id, what="project_id")
        if fact is not None and content is None and not messages:
            stored = state_fact(self.ingestor, user, fact, session_id=session, project_id=project, at=occurred_at)
            return RememberResult(user_id=user, session_id=session, ids=[r.id for r in stored], stored=len(stored),
                                  duplicates=1 - len(stored), derived=len(stored))  # fmt: skip
        if (content is None) == (not messages) or fact is not None:
            raise InvalidInput(
                "Send one of content (one memory), messages (a list) or fact, not several and not none.",
                hint='e.g. {"content": "I moved to Lisbon"} or {"messages": [{"content": "...", "speaker": "user"}]}',
            )
        if messages is None:
            messages = [MessageIn(content=content or "", kind=kind, speaker=speaker, metadata=metadata)]
        if len(messages) > self.limits.max_messages_per_call:
            raise TooLarge(
                f"{len(messages)} messages in one call; the limit is {self.limits.max_messages_per_call}.",
                hint="Send them in several calls.",
            )
        memories = []
        for i, msg in enumerate(messages):
            at = "" if content is not None else f"messages[{i}]."  # errors name the field the caller sent
            text = check_text(msg.content, what=f"{at}content", max_chars=self.limits.max_text_chars)
            extra = {**(metadata or {}), **(msg.metadata or {})}
            if json_chars(extra) > self.limits.max_metadata_chars:
                own = msg.metadata is not None and json_chars(msg.metadata) > self.limits.max_metadata_chars
                raise TooLarge(
                    f"{at if own else ''}metadata is over {self.limits.max_metadata_chars} characters as JSON.",
                    hint="Keep metadata to small tags and ids; store text as content.",
                )
            memories.append(
                NewMemory(
                    text=text,
                    kind=msg.kind or kind or "message",
                    speaker=check_scope(msg.speaker or speaker, what=f"{at if msg.speaker else ''}speaker"),
                    occurred_at=msg.occurred_at or occurred_at,
                    source_id=check_scope(msg.source_id, what=f"{at}source_id"),
                    metadata=extra,
                )
            )
        if self.deferred is not None and progress is None:  # a large import with progress is stored as it waits
            ids, duplicates = self.deferred.accept(user, memories, session, project)
            if flush and self.extraction is not None:  # extraction reads the stored records
                self.deferred.wait(user)
                self.extraction.note(user, session, [], flush=True)
            return RememberResult(user_id=user, session_id=session, ids=ids, stored=len(ids) - duplicates,
                                  duplicates=duplicates, derived=0, warnings=self._notices(user))  # fmt: skip
        if self.deferred is not None:
            self.deferred.wait(user)  # in order after the user's accepted calls
        result = self.ingestor.ingest(user, memories, session_id=session, project_id=project, progress=progress)
        if self.extraction is not None:
            new = [r.id for r in result.stored if r.kind == "message"]
            self.extraction.note(user, session, new, flush=flush)
        return RememberResult(
            user_id=user,
            session_id=session,
            ids=result.ids,
            stored=len(result.ids) - result.duplicates,
            duplicates=result.duplicates,
            derived=result.derived,
            warnings=[*result.warnings, *self._notices(user)],
        )

    def _notices(self, user: str, *, llm: bool = True) -> list[str]:
        """While the user's accepted messages cannot be stored, and (``llm``) how their LLM extraction
        degraded since their last remember, each told once."""
        waiting = self.deferred.warnings(user) if self.deferred is not None else []
        return waiting + (self.extraction.take_notices(user) if llm and self.extraction is not None else [])

    @storage_errors("recall")
    def recall(
        self,
        query: str,
        *,
        user_id: str | None = None,
        limit: int | None = None,
        project_id: str | None = None,
        time_range: TimeRange | None = None,
        reference_time: datetime | None = None,
        options: RecallOptions | None = None,
        history: list[str] | None = None,
        session_id: str | None = None,
        include_session: bool = False,
    ) -> RecallResult:
        """The fast path: deterministic multi-signal retrieval and a ready-to-paste context.

        ``session_id``: the session the call is made from; its memories, which the caller holds
        in its context already, are left out unless ``include_session``.

        Raises:
            InvalidInput: bad query, limit, scope or time range.
        """
        user = self._reader(user_id, wait_accepted=False)
        query = self._query(query)
        limit = self.limits.recall_default_limit if limit is None else limit
        if not 1 <= limit <= self.limits.recall_max_limit:
            raise InvalidInput(f"limit must be between 1 and {self.limits.recall_max_limit}, got {limit}.")
        after, before = self._window(time_range)
        scope = Scope(user, check_scope(project_id, what="project_id"), after, before,
                      outside_session=self._own_session(session_id, include_session))  # fmt: skip
        self.limits.check_history(history)
        if self.deferred is not None:  # an attribute question reads the facts of what waits
            self.deferred.wait_for_facts(scope, query)
        now = as_utc(reference_time) if reference_time is not None else None  # naive is UTC, as in the models
        result = self._logged("recall", user, query, lambda: self.recall_pipeline.run(
            query, scope, limit=limit, reference_time=now, options=options, history=history))  # fmt: skip
        return result.model_copy(update={"warnings": result.warnings + self._notices(user, llm=False)})

    @storage_errors("deep_memory_search")
    def deep_search(
        self,
        query: str,
        *,
        user_id: str | None = None,
        time_range: TimeRange | None = None,
        max_results: int | None = None,
        plan: QueryPlan | None = None,
        project_id: str | None = None,
        reference_time: datetime | None = None,
        session_id: str | None = None,
        include_session: bool = False,
    ):
        """The thorough path: plan, execute, judge, re-plan, rerank.

        ``max_results`` defaults to a caller plan's own, else 10. ``session_id`` and
        ``include_session`` as for ``recall``.

        Raises:
            InvalidInput: bad arguments.
            InvalidPlan: a caller plan that does not validate.
        """
        user = self._reader(user_id)
        query = self._query(query)
        what = "max_results"
        if max_results is None:
            max_results, what = (10, what) if plan is None else (plan.max_results, "plan.max_results")
        if not 1 <= max_results <= self.limits.deep_max_results:
            raise InvalidInput(
                f"{what} must be between 1 and {self.limits.deep_max_results}, got {max_results}."
            )
        after, before = self._window(time_range)
        scope = Scope(user, check_scope(project_id, what="project_id"), after, before,
                      outside_session=self._own_session(session_id, include_session))  # fmt: skip
        now = as_utc(reference_time) if reference_time is not None else None  # naive is UTC, as in the models
        return self._logged("deep", user, query, lambda: self.deep.run(
            query, scope, max_results=max_results, plan=plan, reference_time=now))  # fmt: skip

    @storage_errors("search")
    def single_index_search(
        self, index: str, query: str, *, user_id: str | None = None, params: dict[str, Any] | None = None
    ) -> list[MemoryItem]:
        """One index alone, in its own order (no fusion, no expansion): the baselines of the bench.

        Raises:
            InvalidPlan: unknown index or parameter.
        """
        user = self._reader(user_id)
        query = self._query(query)
        return self.recall_pipeline.single_index(index, query, Scope(user), params or {})

    @storage_errors("forget")
    def forget(
        self,
        *,
        ids: list[str] | None = None,
        scope: Literal["user", "project", "session"] | None = None,
        user_id: str | None = None,
        project_id: str | None = None,
        session_id: str | None = None,
    ) -> ForgetReceipt:
        """Delete by id or by scope, from every store, and purge the bytes.

        Every call first finishes what an earlier forget of the user left unfinished (it
        failed after deleting, so those records are out of the log already): its receipt
        lists them in ``finished_ids``, and their ids are not unknown to it.

        Raises:
            InvalidInput: neither ids nor scope, a malformed id, a scope without its id.
            NotFound: an id that is not one of this user's memories (nothing is deleted).
            ReadOnlyData: the data directory cannot be written (nothing is deleted).
            OutOfSpace: its disk is full. Once the records are deleted, a purge that fails for
                it is no error: the receipt says ``purged`` False, and why, in ``warnings``.
        """
        started = time.perf_counter()
        self.store.check_writable()
        user = self._user(user_id)
        if self.deferred is not None:  # what remember accepted is forgotten like what it stored
            self.deferred.wait(user)
        if bool(ids) == bool(scope):
            raise InvalidInput(
                "Send either ids or a scope (user, project or session), not both and not neither.",
                hint='e.g. {"ids": ["<id>"]} or {"scope": "session", "session_id": "s1"}',
            )
        if ids:
            if len(ids) > self.limits.max_forget_ids:
                raise TooLarge(f"{len(ids)} ids in one call; the limit is {self.limits.max_forget_ids}.")
            wanted = check_record_ids(ids)
            found = set(self.store.log.ids(RecordFilter(user, ids=tuple(wanted))))
            unfinished = self.store.unfinished_ids(user)
            waiting = {r.id for r in self.deferred.waiting(user)} if self.deferred is not None else set()
            unknown = [rid for rid in wanted if rid not in found and rid not in unfinished and rid not in waiting]
            if unknown:
                raise NotFound(
                    f"{len(unknown)} id(s) are not memories of user {user!r} (never stored, or forgotten "
                    f"already): {', '.join(unknown[:5])}.",
                    hint="Nothing was deleted. Check the ids and the user_id; a forget that succeeded "
                    "needs no retry.",
                )
            report = self.store.delete(user, [rid for rid in wanted if rid in found])
            self._discard_waiting(report, user, lambda r: r.id not in wanted)
            label = "ids"
        elif scope == "user":
            report = self.store.drop_user(user)
            if self.deferred is not None:
                self.deferred.drop(user)  # files of calls that failed to be stored hold their text
            label = "user"
        elif scope in ("project", "session"):
            value = check_scope(project_id if scope == "project" else session_id, what=f"{scope}_id", required=True)
            if scope == "project":
                where = RecordFilter(user, project_id=value)
            else:
                where = RecordFilter(user, session_id=value)
            report = self.store.delete(user, self.store.log.ids(where))
            field = "project_id" if scope == "project" else "session_id"
            self._discard_waiting(report, user, lambda r: getattr(r, field) != value)
            label = scope
        else:
            raise InvalidInput(f"Unknown scope {scope!r}.", hint="Use user, project or session.")
        # The records are deleted: what follows is bookkeeping, whose failure (a full disk) the
        # receipt reports rather than turning the whole forget into an error.
        gone = None if label == "user" else {*report.ids, *report.finished}
        if self.search_log is not None:
            try:
                report.per_store["search_log"] = self.search_log.forget(user, gone)
            except OSError as exc:
                log.warning("the search log could not be rewritten after a forget", exc_info=True)
                report.warnings.append(f"The search log could not be rewritten ({exc.strerror or exc}): "
                                       "it still lists the searches that returned them.")  # fmt: skip
        if self.extraction is not None:
            try:
                self.extraction.forget(user, gone)
            except OSError:  # only its state file: it is up to date in memory, and stale ids are skipped
                log.warning("the LLM extraction's state could not be saved after a forget", exc_info=True)
        return ForgetReceipt(
            user_id=user,
            scope=label,
            ids=report.ids[:RECEIPT_IDS],
            removed=len(report.ids),
            deleted=report.per_store,
            finished_ids=report.finished[:RECEIPT_IDS],
            purged=report.purged,
            warnings=report.warnings,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    def _discard_waiting(self, report: DeleteReport, user: str, keep: Callable[[Record], bool]) -> None:
        """Forget, too, what still waits to be stored (its store failed, and is being retried)."""
        if gone := self.deferred.discard(user, keep) if self.deferred is not None else []:
            report.ids.extend(rid for rid in gone if rid not in report.ids)
            report.per_store["accepted"] = len(gone)

    @storage_errors("explain_plan")
    def explain_plan(self, query: str, *, user_id: str | None = None, full: bool = False) -> ExplainPlanResult:
        """The plans recall and deep search would run, and a line per index (``full``: every index's
        descriptor and the plan's JSON schema). Runs nothing."""
        user = self._reader(user_id)
        query = self._query(query)
        result = self.deep.explain(query, user, full=full)
        if result.plan_schema:  # the schema's bound is the model's widest; this server takes at most its own cap
            result.plan_schema["properties"]["max_results"]["maximum"] = self.limits.deep_max_results
        return result

    def users(self) -> list[UserSummary]:
        """Every user the store holds, with their records and sessions."""
        return [UserSummary(user_id=u, records=r, sessions=s) for u, (r, s) in self.store.log.user_counts().items()]

    def close(self) -> None:
        """Release every store (each is closed even when another fails to close); what was
        registered in ``on_close`` (serving other processes) goes first."""
        with ExitStack() as closing:
            closing.callback(self.store.close)
            if self.deferred is not None:  # stores what waits, before the store closes
                closing.callback(self.deferred.close)
            if self.search_log is not None:
                closing.callback(self.search_log.close)
            if self.extraction is not None:
                closing.callback(self.extraction.close)
            closing.callback(self.deep.close)
            for fn in self.on_close:
                closing.callback(fn)

