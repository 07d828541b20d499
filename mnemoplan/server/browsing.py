"""Read-only MCP resources to browse a user's memory, the prompt that tells a host's model how to
use memory, and the web view beside the MCP endpoint of ``serve --http``.

Resources (JSON, paged by ``offset`` and ``limit``; each page names the URI of the next):

- ``memory://users``: every user with a memory;
- ``memory://{user_id}/sessions``: a user's sessions, most recent first;
- ``memory://{user_id}/messages{?session_id}``: a session's messages, in order;
- ``memory://{user_id}/facts``: current facts, each with the facts it replaced.

They read through the browse queries (``service/browse.py``), as the web view and the export do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.mcpserver.resources.templates import ResourceSecurity

from mnemoplan.errors import MnemoError, Unavailable
from mnemoplan.web.app import WebView

if TYPE_CHECKING:  # the storage libraries load in the server's start-up thread, not at its import
    from mnemoplan.service.browse import MemoryBrowser, Page
    from mnemoplan.service.service import MemoryService
    from mnemoplan.storage.tokens import TokenStore

T = TypeVar("T")
JSON = "application/json"
# Ids are names, never paths here: the SDK's path checks would refuse a session id such as "/a".
NAMES = ResourceSecurity(exempt_params={"user_id", "session_id"})

MEMORY_PROMPT = """\
You have long-term memory through the mnemoplan tools. Use it like this:

1. At the start of each task or conversation, call `recall` with the user's request (and `history` with the last \
turns for a follow-up). Read its `context`; if it says memory holds nothing on this, do not guess from memory.
2. When the user says something about themselves (who they are, people and pets in their life, preferences, plans, \
decisions, changes such as a move or a new job), call `remember` with their words, a `session_id` for the \
conversation and `occurred_at` when known. Store what they said, verbatim; do not store your own guesses.
3. When `recall` is not enough (a question across many sessions, about order or change over time), call \
`deep_memory_search`.
4. When the user asks you to forget something, find it with `recall`, then call `forget` with those ids (or a \
session or the whole user scope when asked), and tell the user what was removed.
5. Never mention ids or scores to the user unless asked; say what you remember and when it was said."""


class ServiceRunner(Protocol):
    """What runs a call on the server's service (``app.ServiceHolder``)."""

    def call(self, fn: Callable[[MemoryService], T]) -> T:
        """Run ``fn(service)`` once the service is ready."""
        ...


Holder = Callable[[], ServiceRunner | None]  # the running server's service, once its lifespan began


async def _run(holder: Holder, fn: Callable[[MemoryService], T]) -> T:
    current = holder()
    if current is None:
        raise Unavailable("The memory service is not running.", hint="Retry in a few seconds.")
    return await anyio.to_thread.run_sync(current.call, fn)


def _browser(service: MemoryService) -> MemoryBrowser:
    from mnemoplan.service.browse import MemoryBrowser

    return MemoryBrowser(service.store)


def _paged(page: Page, next_uri: str) -> str:
    body: dict[str, Any] = page.as_dict()
    body["next"] = f"{next_uri}offset={page.next_offset}" if page.next_offset is not None else None
    return json.dumps(body, ensure_ascii=False, default=str)


def add_browsing(mcp: MCPServer, holder: Holder) -> None:
    """Register the resources and the prompt on ``mcp``."""

    async def _read(fn: Callable[[MemoryService], T]) -> T:
        try:
            return await _run(holder, fn)
        except MnemoError as exc:
            raise ResourceError(exc.to_text()) from None

    @mcp.resource("memory://users", name="users", title="Users", mime_type=JSON,
                  description="Every user with a memory (ids to use in the other resources).")  # fmt: skip
    async def users() -> str:
        found = await _read(lambda s: _browser(s).users())
        return json.dumps({"users": found}, ensure_ascii=False)

    @mcp.resource("memory://{user_id}/sessions{?offset,limit}", name="sessions", title="Sessions", mime_type=JSON,
                  security=NAMES, description="A user's sessions, most recent first: id, first and last time, "
                  "number of messages, first words. Paged: offset, limit (default 50, max 500).")  # fmt: skip
    async def sessions(user_id: str, offset: int = 0, limit: int = 50) -> str:
        page = await _read(lambda s: _browser(s).sessions(user_id, offset=offset, limit=limit))
        return _paged(page, f"memory://{quote(user_id, safe='')}/sessions?limit={limit}&")

    @mcp.resource("memory://{user_id}/messages{?session_id,offset,limit}", name="messages", title="A session's messages",
                  mime_type=JSON, security=NAMES, description="The messages of one session (session_id), in order, "
                  "with speaker and time. Paged: offset, limit (default 100, max 500).")  # fmt: skip
    async def messages(user_id: str, session_id: str = "", offset: int = 0, limit: int = 100) -> str:
        page = await _read(lambda s: _browser(s).messages(user_id, session_id, offset=offset,
                                                                          limit=limit))  # fmt: skip
        uri = f"memory://{quote(user_id, safe='')}/messages?session_id={quote(session_id, safe='')}&limit={limit}&"
        return _paged(page, uri)

    @mcp.resource("memory://{user_id}/facts{?offset,limit}", name="facts", title="Current facts", mime_type=JSON,
                  security=NAMES, description="A user's current facts, newest first, each with the older facts it "
                  "replaced (history) and its validity. Paged: offset, limit (default 100, max 500).")  # fmt: skip
    async def facts(user_id: str, offset: int = 0, limit: int = 100) -> str:
        page = await _read(lambda s: _browser(s).facts(user_id, offset=offset, limit=limit))
        return _paged(page, f"memory://{quote(user_id, safe='')}/facts?limit={limit}&")

    @mcp.prompt(name="use_memory", title="Use long-term memory",
                description="How to use memory well: recall at the start of a task, remember what the user says "
                "about themselves, forget on request.")  # fmt: skip
    def use_memory(user_id: str = "") -> str:
        who = f"\n\nThe user's id for every memory call: {user_id!r}." if user_id else ""
        return MEMORY_PROMPT + who


def add_web_view(mcp: MCPServer, holder: Holder, tokens: TokenStore | None = None) -> None:
    """Serve the web view at /view beside the MCP endpoint, over the server's own service; with
    ``tokens``, callers sign in with the same tokens as the MCP endpoint's."""

    async def call(fn: Callable[[MemoryService], T]) -> T:
        return await _run(holder, fn)

    view = WebView(call, writes=True, tokens=tokens)
    for route in view.routes():
        mcp.custom_route(route.path, methods=sorted((route.methods or {"GET"}) - {"HEAD"}))(route.endpoint)
