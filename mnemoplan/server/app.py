"""The MCP server: five thin tools over the memory service.

The service (stores and the embedding model) is built in a background thread while the
server answers ``initialize``; a tool called before it is ready waits for it. Expected
failures become tool errors with a code and a hint; anything else is logged with its
traceback and reported without details.
"""

from __future__ import annotations

import inspect
import difflib
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata
from mcp.types import CallToolResult, NotificationParams, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mnemoplan import __version__
from mnemoplan.config import Settings
from mnemoplan.errors import InvalidInput, MnemoError
from mnemoplan.model import (
    DeepSearchResult,
    ExplainPlanResult,
    FactIn,
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
from mnemoplan.server.auth import auth_options, caller_user
from mnemoplan.server.holder import ServiceHolder
from mnemoplan.server.render import render_text
from mnemoplan.server.schemas import compact_input_schema, compact_output_schema
from mnemoplan.storage.tokens import TokenStore

if TYPE_CHECKING:  # imported by the service's factory, in the start-up thread (see ServiceHolder)
    from mnemoplan.inference.embedder import EmbeddingModel
    from mnemoplan.service.service import MemoryService

log = logging.getLogger(__name__)
T = TypeVar("T")

# Worker threads forgets may hold at once. A forget waits for the purge that takes its bytes off
# the disk (one at a time, behind maintenance): under a stream of forgets on a large store they
# held every worker thread of the server (anyio's 40), and recalls and remembers queued behind
# them. Forgets past these wait without a thread; a purge does the work of every forget begun
# before it, so a few threads lose nothing.
FORGET_THREADS = 4
_FORGET_LIMITERS: weakref.WeakKeyDictionary[ServiceHolder, anyio.CapacityLimiter] = weakref.WeakKeyDictionary()

INSTRUCTIONS = """\
Long-term memory. Call `remember` with what the user says (or facts you distilled), `recall` before
answering anything that may depend on the past (it is fast: call it every turn and paste its `context`),
`deep_memory_search` when recall is not enough, `explain_plan` to see or write the plan deep search
runs, and `forget` when the user asks you to delete something. Every call is scoped to a user_id."""


async def call_service(
    ctx: Context, fn: Callable[[MemoryService, str | None], T], user_id: str | None, *, write: bool,
    forget: bool = False,
) -> T:
    """Run one service call in a worker thread, for the user the caller may reach (``caller_user``:
    an HTTP token decides), mapping failures to tool errors; a ``forget`` in one of its own few
    threads (``FORGET_THREADS``)."""
    holder: ServiceHolder = ctx.request_context.lifespan_context
    limiter = None
    if forget:
        limiter = _FORGET_LIMITERS.get(holder)
        if limiter is None:
            limiter = _FORGET_LIMITERS[holder] = anyio.CapacityLimiter(FORGET_THREADS)
    try:
        user = caller_user(user_id, write=write)
        return await anyio.to_thread.run_sync(holder.call, lambda service: fn(service, user), limiter=limiter)
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

    def convert_result(self, result: Any) -> Any:
        """The SDK's result, with the text content a model should read (``render``) instead of the
        structured content dumped again as indented JSON (which the SDK would make, then this drop:
        a few per cent of a loaded server's event loop)."""
        text = render_text(result)
        model = self.output_model if self.output_schema is not None and not self.wrap_output else None
        if text is None or not (isinstance(model, type) and issubclass(model, BaseModel) and isinstance(result, model)):
            return super().convert_result(result)
        return CallToolResult(content=[TextContent(type="text", text=text)],
                              structured_content=result.model_dump(mode="json", by_alias=True))  # fmt: skip

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
    output_schema = compact_output_schema(meta.output_schema) if meta.output_schema else None
    as_sent = _ArgumentsAsSent(arg_model=arguments, output_schema=output_schema,
                               output_model=meta.output_model, wrap_output=meta.wrap_output)  # fmt: skip
    schema = compact_input_schema(arguments.model_json_schema(by_alias=True))
    description = inspect.cleandoc(tool.description or "")  # a docstring's indentation costs every host tokens
    return tool.model_copy(update={"fn_metadata": as_sent, "parameters": schema, "description": description})


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
    Field(description="Whose memory (default: yours)."),
]

SessionFrom = Annotated[str | None, Field(description="Your current session: its memories are left out.")]
IncludeSession = Annotated[bool, Field(description="Keep them.")]


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
        session_id: Annotated[str | None, Field(description="The conversation they belong to.")] = None,
        project_id: Annotated[str | None, Field(description="Project scope, if any.")] = None,
        occurred_at: Annotated[
            UtcDatetime | None,
            Field(description="When it was said (ISO-8601); default now."),
        ] = None,
        kind: Annotated[Kind | None, Field(description="message (default), fact, procedure or episode.")] = None,
        speaker: Annotated[str | None, Field(description="Who said it, for content.")] = None,
        metadata: Annotated[Metadata | None, Field(description="JSON kept with it.")] = None,
        flush: Annotated[bool, Field(description="Extract this session's facts now (LLM configured).")] = False,
        fact: Annotated[FactIn | None, Field(description=(
            "Instead of content: a fact about the user; a new value supersedes the old."))] = None,
    ) -> RememberResult:
        """Save to long-term memory, verbatim. Call it with each user message worth keeping (what they
        say about themselves, their plans, people, decisions) or with facts you distilled. Pass
        `content` for one memory or `messages` for a conversation. A repeat is stored once."""

        def progress(done: int, total: int) -> None:  # from the worker thread
            try:
                anyio.from_thread.run(ctx.report_progress, done, total, f"embedded {done} of {total} sentences")
            except Exception:  # a report that cannot be sent must not cost the memories
                log.debug("a progress report could not be sent", exc_info=True)

        # A caller that asks for progress (a progress token) waits for the embedding and hears of it;
        # any other call is answered once accepted (``MemoryService.remember``, the server's default).
        asked = (ctx.request_context.meta or {}).get("progress_token") is not None

        return await call_service(
            ctx,
            lambda s, user: s.remember(
                content=content, messages=messages, user_id=user, session_id=session_id,
                project_id=project_id, occurred_at=occurred_at, kind=kind, speaker=speaker, metadata=metadata,
                flush=flush, progress=progress if asked else None, fact=fact,
            ),  # fmt: skip
            user_id, write=True,
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
            UtcDatetime | None, Field(description="'Now' for relative times in the query.")
        ] = None,
        history: Annotated[
            list[str] | None,
            Field(description="The last turns, so that a follow-up ('how much?') finds its topic."),
        ] = None,
        options: Annotated[RecallOptions | None, Field(description="Rarely needed tuning.")] = None,
        session_id: SessionFrom = None,
        include_session: IncludeSession = False,
    ) -> RecallResult:
        """Search long-term memory (fast). Call it at the start of a task and before answering anything that
        may depend on the past. Read `context`. Each item has a `confidence` (0-1); `no_match` true means
        memory holds nothing on this: say so rather than guess."""
        return await call_service(
            ctx,
            lambda s, user: s.recall(
                query, user_id=user, limit=limit, project_id=project_id, time_range=time_range,
                reference_time=reference_time, options=options, history=history, session_id=session_id,
                include_session=include_session,
            ),  # fmt: skip
            user_id, write=False,
        )

    @tool(title="Deep memory search", annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    async def deep_memory_search(
        ctx: Context,
        query: Annotated[str, Field(description="What to find.")],
        user_id: UserId = None,
        time_range: Annotated[TimeRange | None, Field(description="Only things that happened in this window.")] = None,
        max_results: Annotated[
            int | None, Field(description="How many (1-30, default 10).")
        ] = None,
        plan: Annotated[
            QueryPlan | None, Field(description="A plan from explain_plan (edited or not), run as given.")
        ] = None,
        project_id: Annotated[str | None, Field(description="Only this project's memories.")] = None,
        reference_time: Annotated[
            UtcDatetime | None, Field(description="'Now' for relative times in the query.")
        ] = None,
        session_id: SessionFrom = None,
        include_session: IncludeSession = False,
    ) -> DeepSearchResult:
        """Thorough search (seconds): when recall found little (low confidence, no_match) or the question
        needs several memories, counting or dates. Returns `context`, items and `no_match` like recall."""
        return await call_service(
            ctx,
            lambda s, user: s.deep_search(
                query, user_id=user, time_range=time_range, max_results=max_results, plan=plan,
                project_id=project_id, reference_time=reference_time, session_id=session_id,
                include_session=include_session,
            ),  # fmt: skip
            user_id, write=False,
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
            Field(description="Delete a whole user, project or session instead."),
        ] = None,
        user_id: UserId = None,
        project_id: Annotated[str | None, Field(description="The project, for scope=project.")] = None,
        session_id: Annotated[str | None, Field(description="The session, for scope=session.")] = None,
    ) -> ForgetReceipt:
        """Delete memories for good, only when the user asks: by `ids` (from recall), or a whole
        session, project or user with `scope`."""
        return await call_service(
            ctx,
            lambda s, user: s.forget(ids=ids, scope=scope, user_id=user, project_id=project_id, session_id=session_id),
            user_id, write=True, forget=True,
        )

    @tool(title="Explain plan", annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True))
    async def explain_plan(
        ctx: Context,
        query: Annotated[str, Field(description="The query to plan.")],
        user_id: UserId = None,
        full: Annotated[bool, Field(description="Also full index descriptors and plan schema (~20 KB).")] = False,
    ) -> ExplainPlanResult:
        """Show, without running it, the plan recall and deep_memory_search would run for a query, and a
        line per index; edit the plan and pass it to deep_memory_search as `plan`."""
        return await call_service(
            ctx, lambda s, user: s.explain_plan(query, user_id=user, full=full), user_id, write=False
        )

    return tools


def create_app(
    settings: Settings,
    factory: Callable[[], MemoryService] | None = None,
    *,
    tokens: TokenStore | None = None,
    base_url: str | None = None,
) -> MCPServer:
    """The MCP server over ``settings``; ``factory`` builds the service (default: from settings,
    shared with every other process on the data directory: ``service.share``).

    Args:
        settings: The configuration.
        factory: Builds the service.
        tokens: Over HTTP, the bearer tokens callers must present (None: no authentication).
        base_url: The server's public URL (``http://host:port``), for the protected-resource
            metadata; required with ``tokens``.
    """
    configure()  # a host may start the server without the command: process-wide settings first

    embeddings: list[EmbeddingModel] = []  # one: a service opened anew (see ServiceHolder) reuses the model

    def build() -> MemoryService:
        # Imported here, in the start-up thread: the storage libraries take a second to import.
        from mnemoplan.service.bootstrap import build_service, settings_embedding

        if not embeddings:  # loaded only by the process that holds the data directory
            embeddings.append(settings_embedding(settings))
        return build_service(settings, embedding=embeddings[0])

    def default_factory() -> MemoryService:
        from mnemoplan.service.share import open_shared

        return open_shared(settings.data_dir, build, settings.default_user_id)  # type: ignore[return-value]

    running: list[ServiceHolder] = []  # the web view's way to the service (it has no MCP context)

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[ServiceHolder]:
        holder = ServiceHolder(factory or default_factory)
        running.append(holder)
        try:
            yield holder
        finally:
            running.remove(holder)
            # Shielded: a stop (Ctrl-C, SIGTERM) cancels the server, and a cancelled await would
            # raise before the stores closed, leaving what waits to be stored unstored.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(holder.close)

    mcp = _MemoryServer(
        "mnemoplan",
        title="mnemoplan memory",
        instructions=INSTRUCTIONS,
        version=__version__,
        lifespan=lifespan,
        log_level=settings.log_level,
        tools=memory_tools(),
        **auth_options(tokens, base_url, settings.http_issuer_url),
    )

    from mnemoplan.server.browsing import add_browsing, add_web_view

    add_browsing(mcp, lambda: running[-1] if running else None)
    add_web_view(mcp, lambda: running[-1] if running else None, tokens)

    @mcp.custom_route("/health", methods=["GET"])
    async def health(_: Any) -> Any:
        """Alive, for a proxy's health check (no token needed; it says nothing of any memory)."""
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "version": __version__})

    async def on_initialized(ctx: Any, _: Any) -> None:
        ctx.lifespan_context.go()

    # MCPServer (mcp 2.x) has no public hook for the handshake's end; its low-level server does.
    mcp._lowlevel_server.add_notification_handler("notifications/initialized", NotificationParams, on_initialized)
    return mcp
