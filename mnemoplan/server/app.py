"""The MCP server: five thin tools over the memory service.

The service (stores and the embedding model) is built in a background thread while the
server answers ``initialize``; a tool called before it is ready waits for it. Expected
failures become tool errors with a code and a hint; anything else is logged with its
traceback and reported without details.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import NotificationParams, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mnemoplan import __version__
from mnemoplan.config import Settings
from mnemoplan.errors import InvalidInput, MnemoError, ReadOnlyData, Unavailable, storage_failure
from mnemoplan.model import (
    DeepSearchResult,
    ExplainPlanResult,
    ForgetReceipt,
    Kind,
    MessageIn,
    Metadata,
    QueryPlan,
    RecallOptions,
    RecallResult,
    RememberResult,
    TimeRange,
    UtcDatetime,
)
from mnemoplan.runtime import configure

if TYPE_CHECKING:  # imported by the service's factory, in the start-up thread (see ServiceHolder)
    from mnemoplan.inference.embedder import EmbeddingModel
    from mnemoplan.service.service import MemoryService

log = logging.getLogger(__name__)
T = TypeVar("T")

INSTRUCTIONS = """\
Long-term memory. Call `remember` with what the user says (or facts you distilled), `recall` before
answering anything that may depend on the past (it is fast: call it every turn and paste its `context`),
`deep_memory_search` when recall is not enough, `explain_plan` to see or write the plan deep search
runs, and `forget` when the user asks you to delete something. Every call is scoped to a user_id."""


class ServiceHolder:
    """Builds the memory service in the background and hands it to tools once ready.

    The build (importing torch and the storage libraries, opening the stores) holds the
    GIL for long stretches; started at once, it delayed the answer to ``initialize`` by most
    of the build. It therefore waits for the handshake to finish (``go``), for a first tool call,
    or at most ``start_after_s``.

    Nothing that failed stays failed until a restart: a start-up that failed is tried again
    by the next tool call (the data directory may have been unlocked, given room or made
    writable since), and a service that could only open its data directory to read is
    opened anew by the first write that finds the directory writable.
    """

    def __init__(self, factory: Callable[[], MemoryService], *, start_after_s: float = 1.0) -> None:
        self._factory = factory
        self._cond = threading.Condition()
        self._service: MemoryService | None = None
        self._error: BaseException | None = None
        self._building = False
        self._in_use = 0  # calls running on the service: a replacement waits for them
        self._go = threading.Event()
        self._start(start_after_s)

    def go(self) -> None:
        """Start building now (the client has finished the handshake, or needs the service)."""
        self._go.set()

    def _start(self, wait_s: float) -> None:
        """Build in the background (called at first, or under the condition's lock)."""
        self._building = True
        threading.Thread(target=self._build, args=(wait_s,), name="mnemoplan-startup", daemon=True).start()

    def _build(self, wait_s: float) -> None:
        self._go.wait(wait_s)
        service: MemoryService | None = None
        error: BaseException | None = None
        try:
            service = self._factory()
        except BaseException as exc:
            error = exc
            if isinstance(exc, MnemoError) or storage_failure(exc) is not None:
                log.warning("the memory service could not start: %s", exc)
            else:
                log.exception("the memory service could not start")
        with self._cond:
            self._service, self._error, self._building = service, error, False
            self._cond.notify_all()

    def _acquire(self, timeout_s: float) -> MemoryService:
        self.go()
        with self._cond:
            if not self._building and self._error is not None:
                self._start(0.0)  # try again: what made it fail may be gone
            if not self._cond.wait_for(lambda: not self._building, timeout_s):
                raise Unavailable("The memory service is still starting.", hint="Retry in a few seconds.")
            if self._error is not None:
                raise start_failure(self._error)
            assert self._service is not None  # built, since no error was kept
            self._in_use += 1
            return self._service

    def _release(self) -> None:
        with self._cond:
            self._in_use -= 1
            self._cond.notify_all()

    def _reopen(self, stale: MemoryService) -> bool:
        """Replace a service that opened its data directory to read only, if the directory can be
        written now; False if it cannot. Called with no call of this thread on the service."""
        with self._cond:
            if self._service is not stale or self._building:
                return True  # another call has replaced it already, or is replacing it
            if not stale.writable_now():
                return False
            self._building = True  # new calls wait for the new service
            self._cond.wait_for(lambda: self._in_use == 0)
            self._service = None
        log.info("the data directory can be written again: opening the memory service anew")
        try:
            stale.close()
        except Exception:
            log.exception("the read-only memory service did not close cleanly")
        self._build(0.0)
        return True

    def call(self, fn: Callable[[MemoryService], T], *, timeout_s: float = 120.0) -> T:
        """Run ``fn(service)`` in this (worker) thread once the service is ready.

        A write that a read-only service refuses runs again, once, on a service opened anew if
        the data directory can be written now.

        Raises:
            MnemoError: start-up failed or is taking too long, or ``fn`` raised it.
        """
        service = self._acquire(timeout_s)
        held = True
        try:
            return fn(service)
        except ReadOnlyData:
            if not service.read_only:
                raise
            self._release()
            held = False
            if not self._reopen(service):
                raise  # still read-only
        finally:
            if held:
                self._release()
        service = self._acquire(timeout_s)
        try:
            return fn(service)
        finally:
            self._release()

    def close(self) -> None:
        """Wait for start-up to settle, then close the service."""
        self._go.set()
        with self._cond:
            self._cond.wait_for(lambda: not self._building)
            service, self._service = self._service, None
        if service is not None:
            service.close()


def start_failure(error: BaseException) -> MnemoError:
    """What a tool call is told when the service could not start."""
    if isinstance(error, MnemoError):
        return error
    failure = storage_failure(error, "start-up")
    if failure is not None:
        return failure
    return Unavailable("The memory service failed to start; see the server log.",
                       hint="It is tried again at the next call.")  # fmt: skip


async def call_service(ctx: Context, fn: Callable[[MemoryService], T]) -> T:
    """Run one service call in a worker thread, mapping failures to tool errors."""
    holder: ServiceHolder = ctx.request_context.lifespan_context
    try:
        return await anyio.to_thread.run_sync(holder.call, fn)
    except MnemoError as exc:
        raise ToolError(exc.to_text()) from None
    except Exception:
        log.exception("unexpected error in a tool call")
        raise ToolError("[internal_error] Unexpected server error; the details are in the server log.") from None


class _ArgumentsAsSent(FuncMetadata):
    """The SDK's handling of a tool's arguments, except that a string is read as JSON only for an
    argument that takes a list or an object.

    The SDK parses any string sent for an argument not typed plain ``str`` as JSON first (hosts
    send lists and objects as JSON text), so an optional ``user_id: "null"`` became None, the
    server's own user, and ``"[]"`` a list that was refused. A user id, a query or a text is the
    string the caller sent."""

    def pre_parse_json(self, data: dict[str, Any]) -> dict[str, Any]:
        fields = self.arg_model.model_fields
        structured = {k: v for k, v in data.items() if k in fields and _takes_structure(fields[k].annotation)}
        return {**data, **super().pre_parse_json(structured)}


def _takes_structure(annotation: Any) -> bool:
    """Whether an argument takes a list, an object or a model (alone or in a union)."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
    return any(_is_structure(m) for m in members)


def _is_structure(kind: Any) -> bool:
    if get_origin(kind) is Annotated:
        return _is_structure(get_args(kind)[0])
    return kind in (list, dict) or get_origin(kind) in (list, dict) or (
        isinstance(kind, type) and issubclass(kind, BaseModel))


def build_tool(fn: Callable[..., Any], **options: Any) -> Tool:
    """The SDK's tool for ``fn``, refusing arguments it does not know (``additionalProperties``
    is false in its input schema) and numbers that are not finite (NaN and the infinities are no
    JSON, though the SDK's parser reads them), and taking strings as sent (``_ArgumentsAsSent``)."""
    tool = Tool.from_function(fn, **options)
    meta = tool.fn_metadata
    forbid = {"model_config": ConfigDict(extra="forbid", allow_inf_nan=False), "__module__": __name__}
    arguments = type(meta.arg_model.__name__, (meta.arg_model,), forbid)
    as_sent = _ArgumentsAsSent(arg_model=arguments, output_schema=meta.output_schema,
                               output_model=meta.output_model, wrap_output=meta.wrap_output)  # fmt: skip
    schema = arguments.model_json_schema(by_alias=True)
    return tool.model_copy(update={"fn_metadata": as_sent, "parameters": schema})


class _MemoryServer(MCPServer):
    """The SDK's server, with arguments that fail the input schema reported as the service's
    own bad input: a code, each field's problem in a line, a hint; not pydantic's dump with
    its documentation links."""

    def __init__(self, *args: Any, tools: list[Tool], **kwargs: Any) -> None:
        super().__init__(*args, tools=tools, **kwargs)
        self._arguments = {t.name: list(t.parameters.get("properties", {})) for t in tools}

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:  # not a crash (UnexpectedToolError), e.g. of the result's conversion
            if isinstance(exc, UnexpectedToolError) or not isinstance(exc.__cause__, ValidationError):
                raise
            problem = bad_arguments(exc.__cause__, self._arguments.get(name, [])).to_text()
            raise ToolError(f"Error executing tool {name}: {problem}") from exc.__cause__


def bad_arguments(error: ValidationError, arguments: Sequence[str] = ()) -> InvalidInput:
    """A tool call's schema errors as one InvalidInput: each field with its problem; an argument
    the tool does not take, with the closest of its ``arguments``."""
    problems = []
    for err in error.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1 and arguments:
            problems.append(f"{where}: no such argument; did you mean {_closest(where, arguments)}?")
        else:
            problems.append(f"{where}: {err['msg'][:1].lower()}{err['msg'][1:]}")
    return InvalidInput(
        f"{len(problems)} argument(s) do not fit the tool's input schema: " + "; ".join(problems[:10]) + ".",
        hint="Each tool's input schema (tools/list) names its arguments and their types; times are ISO-8601, "
        "e.g. 2024-05-01T14:00:00Z.",
    )


def _closest(name: str, arguments: Sequence[str]) -> str:
    """The argument most like ``name``, ignoring case and separators (``userId`` -> ``user_id``)."""

    def folded(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "")

    return max(arguments, key=lambda a: difflib.SequenceMatcher(None, folded(name), folded(a)).ratio())


UserId = Annotated[
    str | None,
    Field(description="Whose memory; left out, the server's configured user (an empty string is an error)."),
]

SessionFrom = Annotated[str | None, Field(description=(
    "The session this call is made from (the session_id you remember its turns under): its memories, "
    "already in your context, are left out of the results."))]  # fmt: skip
IncludeSession = Annotated[bool, Field(description="Also return memories of session_id.")]


def memory_tools() -> list[Tool]:
    """The five tools."""
    tools: list[Tool] = []

    def tool(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def add(fn: Callable[..., Any]) -> Callable[..., Any]:
            tools.append(build_tool(fn, **options))
            return fn

        return add

    @tool(
        title="Remember",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
    )
    async def remember(
        ctx: Context,
        content: Annotated[str | None, Field(description="One memory to store verbatim.")] = None,
        messages: Annotated[
            list[MessageIn] | None, Field(description="Several messages, in conversation order.")
        ] = None,
        user_id: UserId = None,
        session_id: Annotated[str | None, Field(description="Conversation or session the messages belong to.")] = None,
        project_id: Annotated[str | None, Field(description="Project scope, if any.")] = None,
        occurred_at: Annotated[
            UtcDatetime | None,
            Field(description="When it was said (ISO-8601, UTC if no offset); default now."),
        ] = None,
        kind: Annotated[Kind | None, Field(description="message (default), fact, procedure or episode.")] = None,
        speaker: Annotated[str | None, Field(description="Who said it, for content.")] = None,
        metadata: Annotated[Metadata | None, Field(description="Free-form JSON kept with it.")] = None,
        flush: Annotated[bool, Field(description="Extract facts from this session's pending messages now "
                                                 "(with an LLM configured; otherwise every 10 messages).")] = False,
    ) -> RememberResult:
        """Store messages or facts for a user, losslessly, and index them. A repeat is not stored
        twice: a message whose source_id its session already holds; without a source_id, the
        same speaker, text and occurred_at an earlier call stored in the same session; with
        neither, a retried call (the session's last messages sent again)."""

        def progress(done: int, total: int) -> None:  # from the worker thread; a no-op unless the caller asked
            try:
                anyio.from_thread.run(ctx.report_progress, done, total, f"embedded {done} of {total} sentences")
            except Exception:  # a report that cannot be sent must not cost the memories
                log.debug("a progress report could not be sent", exc_info=True)

        return await call_service(
            ctx,
            lambda s: s.remember(
                content=content, messages=messages, user_id=user_id, session_id=session_id,
                project_id=project_id, occurred_at=occurred_at, kind=kind, speaker=speaker, metadata=metadata,
                flush=flush, progress=progress,
            ),  # fmt: skip
        )

    @tool(title="Recall", annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    async def recall(
        ctx: Context,
        query: Annotated[str, Field(description="The question or the user's latest message.")],
        user_id: UserId = None,
        limit: Annotated[int | None, Field(description="How many memories (default 10, max 50).")] = None,
        project_id: Annotated[str | None, Field(description="Only this project's memories.")] = None,
        time_range: Annotated[TimeRange | None, Field(description="Only memories from this window.")] = None,
        reference_time: Annotated[
            UtcDatetime | None, Field(description="'Now' for relative times in the query (default: now).")
        ] = None,
        history: Annotated[
            list[str] | None,
            Field(description=(
                "The last turns of the conversation, so a follow-up ('how much?', 'when did we get her?') finds "
                "its topic: the start of the last two turns, at most 40 words, is searched with it. A complete "
                "question is searched alone."
            )),
        ] = None,
        options: Annotated[RecallOptions | None, Field(description="Safe per-call overrides of the defaults.")] = None,
        session_id: SessionFrom = None,
        include_session: IncludeSession = False,
    ) -> RecallResult:
        """Fast memory retrieval (milliseconds): ranked memories with per-signal scores and a context string to paste into your prompt."""
        return await call_service(
            ctx,
            lambda s: s.recall(
                query, user_id=user_id, limit=limit, project_id=project_id, time_range=time_range,
                reference_time=reference_time, options=options, history=history, session_id=session_id,
                include_session=include_session,
            ),  # fmt: skip
        )

    @tool(title="Deep memory search", annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    async def deep_memory_search(
        ctx: Context,
        query: Annotated[str, Field(description="What to find.")],
        user_id: UserId = None,
        time_range: Annotated[TimeRange | None, Field(description="Only things that happened in this window.")] = None,
        max_results: Annotated[
            int | None, Field(description="How many results (1-30; default: the plan's max_results, else 10).")
        ] = None,
        plan: Annotated[
            QueryPlan | None, Field(description="A plan from explain_plan, possibly edited; run exactly as given.")
        ] = None,
        project_id: Annotated[str | None, Field(description="Only this project's memories.")] = None,
        reference_time: Annotated[
            UtcDatetime | None, Field(description="'Now' for relative times in the query (UTC if no offset).")
        ] = None,
        session_id: SessionFrom = None,
        include_session: IncludeSession = False,
    ) -> DeepSearchResult:
        """Thorough search (seconds): plans over every index, executes, judges, re-plans and reranks; returns structured results with stats."""
        return await call_service(
            ctx,
            lambda s: s.deep_search(
                query, user_id=user_id, time_range=time_range, max_results=max_results, plan=plan,
                project_id=project_id, reference_time=reference_time, session_id=session_id,
                include_session=include_session,
            ),  # fmt: skip
        )

    @tool(
        title="Forget",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True),
    )
    async def forget(
        ctx: Context,
        ids: Annotated[list[str] | None, Field(description="Memory ids to delete.")] = None,
        scope: Annotated[
            Literal["user", "project", "session"] | None,
            Field(description="Delete a whole scope instead: the user, a project, or a session."),
        ] = None,
        user_id: UserId = None,
        project_id: Annotated[str | None, Field(description="The project, for scope=project.")] = None,
        session_id: Annotated[str | None, Field(description="The session, for scope=session.")] = None,
    ) -> ForgetReceipt:
        """Delete memories by id or by scope from every store, for real: old versions and index segments are purged."""
        return await call_service(
            ctx,
            lambda s: s.forget(ids=ids, scope=scope, user_id=user_id, project_id=project_id, session_id=session_id),
        )

    @tool(title="Explain plan", annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    async def explain_plan(
        ctx: Context,
        query: Annotated[str, Field(description="The query to plan.")],
        user_id: UserId = None,
    ) -> ExplainPlanResult:
        """The plan recall and deep_memory_search would run, and the schema of every index, so you can edit the plan and pass it to deep_memory_search. Runs nothing."""
        return await call_service(ctx, lambda s: s.explain_plan(query, user_id=user_id))

    return tools


def create_app(settings: Settings, factory: Callable[[], MemoryService] | None = None) -> MCPServer:
    """The MCP server over ``settings``; ``factory`` builds the service (default: from settings)."""
    configure()  # a host may start the server without the command: process-wide settings first

    embeddings: list[EmbeddingModel] = []  # one: a service opened anew (see ServiceHolder) reuses the model

    def default_factory() -> MemoryService:
        # Imported here, in the start-up thread: the storage libraries take a second to import.
        from mnemoplan.service.bootstrap import build_service, settings_embedding

        if not embeddings:
            embeddings.append(settings_embedding(settings))
        return build_service(settings, embedding=embeddings[0])

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[ServiceHolder]:
        holder = ServiceHolder(factory or default_factory)
        try:
            yield holder
        finally:
            await anyio.to_thread.run_sync(holder.close)

    mcp = _MemoryServer(
        "mnemoplan",
        title="mnemoplan memory",
        instructions=INSTRUCTIONS,
        version=__version__,
        lifespan=lifespan,
        log_level=settings.log_level,
        tools=memory_tools(),
    )

    async def on_initialized(ctx: Any, _: Any) -> None:
        ctx.lifespan_context.go()

    # MCPServer (mcp 2.x) has no public hook for the handshake's end; its low-level server does.
    mcp._lowlevel_server.add_notification_handler("notifications/initialized", NotificationParams, on_initialized)
    return mcp
