"""The web view's routes: choose a user; their sessions, a session's messages, current facts with
their history, the entity graph, a search that shows its plan, hits and scores; forget.

Every page reads through the browse queries (``service/browse.py``) or a service method, in a
worker thread. Served by ``mnemoplan view`` (its own loopback server) and by ``serve --http``
beside the MCP endpoint; ``access.caller_access`` decides who may look and who may forget.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from mnemoplan.errors import Forbidden, InvalidInput, MnemoError, NotFound
from mnemoplan.model import DeepSearchResult, RecallResult
from mnemoplan.web.access import COOKIE, Access, caller_access, same_origin

if TYPE_CHECKING:  # the storage libraries load in the server's start-up thread, not at its import
    from mnemoplan.service.browse import MemoryBrowser
    from mnemoplan.service.service import MemoryService
    from mnemoplan.storage.tokens import TokenStore

log = logging.getLogger(__name__)
T = TypeVar("T")
Call = Callable[[Callable[["MemoryService"], Any]], Awaitable[Any]]  # runs fn(service) in a worker thread
STATIC = Path(__file__).parent / "static"
STATIC_FILES = {p.name for p in STATIC.iterdir() if p.suffix in (".js", ".css")} if STATIC.is_dir() else set()
PAGE = 50


def service_caller(service: MemoryService) -> Call:
    """A ``Call`` over one open service."""

    async def call(fn: Callable[[MemoryService], T]) -> T:
        return await anyio.to_thread.run_sync(fn, service)

    return call


def _status(exc: MnemoError) -> int:
    if isinstance(exc, Forbidden):
        return 403
    return 404 if isinstance(exc, NotFound) else 400 if isinstance(exc, InvalidInput) else 503


def _offset(request: Request) -> int:
    try:
        return max(0, int(request.query_params.get("offset", "0")))
    except ValueError:
        raise InvalidInput("offset must be a whole number.") from None


def _user(request: Request, access: Access) -> str:
    """The user a page is about; a user's token reaches that user only."""
    user = request.query_params.get("user", "").strip()
    if not user:
        raise InvalidInput("Choose a user first.")
    if access.user is not None and user != access.user:
        raise Forbidden(f"This token shows the memory of user {access.user!r} only.",
                        hint="Sign in with that user's token, or an admin token.")  # fmt: skip
    return user


def search_view(result: RecallResult | DeepSearchResult) -> dict[str, Any]:
    """What the search page shows of a result: the plan(s), each step's hits, each item's scores."""
    items = [
        {"rank": n, "id": i.id, "kind": i.kind, "text": i.text, "speaker": i.speaker, "session_id": i.session_id,
         "occurred_at": i.occurred_at.isoformat(), "score": i.score, "scores": sorted(i.scores.items()),
         "provenance": i.provenance}
        for n, i in enumerate(result.items, 1)
    ]  # fmt: skip

    def hits(*names: str) -> list[int]:
        return [it["rank"] for it in items if any(n and n in it["provenance"] for n in names)]

    if isinstance(result, RecallResult):
        plan = result.trace.plan
        plans = [plan] if plan else []
        by_name = {s.step_id: s for s in plan.steps} if plan else {}
        steps = [{"round": 1, "name": s.name, "index": by_name[s.name].index if s.name in by_name else s.name,
                  "count": s.count, "ms": s.ms, "error": s.error,
                  "hits": hits(s.name, by_name[s.name].index if s.name in by_name else "")}
                 for s in result.trace.signals]  # fmt: skip
        notes = [*result.trace.notes, *result.warnings]
    else:
        plans = result.plans
        steps = [{"round": s.round, "name": s.step_id, "index": s.index, "count": s.count, "ms": s.ms,
                  "error": s.error or s.issue, "hits": hits(s.step_id, s.index)} for s in result.steps]  # fmt: skip
        notes = result.warnings
    return {
        "plans": [{"name": p.name, "source": p.source, "combination": p.combination_strategy,
                   "steps": [{"id": s.step_id, "index": s.index, "params": s.params, "weight": s.weight}
                             for s in p.steps]} for p in plans],  # fmt: skip
        "steps": steps, "items": items, "notes": notes,
        "context": getattr(result, "context", ""),
    }  # fmt: skip


class WebView:
    """The view's pages over ``call``; ``writes``: whether forgetting is allowed at all;
    ``tokens``: the server's tokens, which callers then sign in with (None: loopback callers only)."""

    def __init__(self, call: Call, *, writes: bool, prefix: str = "/view", tokens: TokenStore | None = None) -> None:
        self.call = call
        self.writes = writes
        self.prefix = prefix
        self.tokens = tokens

    def page(self, handler: Callable[[Request, Access], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """A route that checks the caller first and shows failures as a page."""

        @functools.wraps(handler)
        async def route(request: Request) -> Response:
            access = caller_access(request, writes=self.writes, tokens=self.tokens)
            if access is None:
                if self.tokens is not None:
                    return self._sign_in_page(request, status=401)
                return HTMLResponse(self._html("error.html", access=None, title="Not allowed",
                                               message="The view answers callers on this machine only."),
                                    status_code=403)  # fmt: skip
            try:
                return await handler(request, access)
            except MnemoError as exc:
                page = self._html("error.html", access=access, title="Cannot show this", message=exc.message,
                                  hint=exc.hint, user=request.query_params.get("user", ""))  # fmt: skip
                return HTMLResponse(page, status_code=_status(exc))
            except Exception:
                log.exception("the web view failed on %s", request.url.path)
                page = self._html("error.html", access=access, title="Internal error",
                                  message="Something went wrong; the details are in the server log.")  # fmt: skip
                return HTMLResponse(page, status_code=500)

        return route

    def _html(self, template: str, **context: Any) -> str:
        from mnemoplan.web.pages import render

        return render(template, base=self.prefix, **context)

    async def browse(self, fn: Callable[[MemoryBrowser], T]) -> T:
        from mnemoplan.service.browse import MemoryBrowser

        return await self.call(lambda s: fn(MemoryBrowser(s.store)))

    # -- pages ---------------------------------------------------------------------------

    async def users(self, request: Request, access: Access) -> Response:
        users = [access.user] if access.user is not None else await self.browse(lambda b: b.users())
        return HTMLResponse(self._html("users.html", access=access, users=users, title="Choose a user"))

    async def sessions(self, request: Request, access: Access) -> Response:
        user, offset = _user(request, access), _offset(request)
        page = await self.browse(lambda b: b.sessions(user, offset=offset, limit=PAGE))
        return HTMLResponse(self._html("sessions.html", access=access, user=user, page=page, title=f"{user}: sessions"))

    async def session(self, request: Request, access: Access) -> Response:
        user, offset = _user(request, access), _offset(request)
        sid = request.query_params.get("id", "")
        page = await self.browse(lambda b: b.messages(user, sid, offset=offset, limit=100))
        return HTMLResponse(self._html("session.html", access=access, user=user, session_id=sid, page=page,
                                       title=f"{user}: session {sid}"))  # fmt: skip

    async def facts(self, request: Request, access: Access) -> Response:
        user, offset = _user(request, access), _offset(request)
        page = await self.browse(lambda b: b.facts(user, offset=offset, limit=PAGE))
        return HTMLResponse(self._html("facts.html", access=access, user=user, page=page, title=f"{user}: facts"))

    async def graph(self, request: Request, access: Access) -> Response:
        user = _user(request, access)
        return HTMLResponse(self._html("graph.html", access=access, user=user, title=f"{user}: entity graph"))

    async def graph_data(self, request: Request, access: Access) -> Response:
        user = _user(request, access)
        graph = await self.browse(lambda b: b.graph(user))
        return JSONResponse({"nodes": graph.nodes, "edges": graph.edges})

    async def search(self, request: Request, access: Access) -> Response:
        user = _user(request, access)
        query = request.query_params.get("q", "").strip()
        mode = "deep" if request.query_params.get("mode") == "deep" else "recall"
        shown = None
        if query:
            if mode == "deep":
                result = await self.call(lambda s: s.deep_search(query, user_id=user))
            else:
                result = await self.call(lambda s: s.recall(query, user_id=user))
            shown = search_view(result)
        partial = request.headers.get("hx-request") == "true" and request.headers.get("hx-target") == "results"
        template = "search_results.html" if partial else "search.html"
        return HTMLResponse(self._html(template, access=access, user=user, q=query, mode=mode, result=shown,
                                       title=f"{user}: search"))  # fmt: skip

    async def forget(self, request: Request, access: Access) -> Response:
        user = _user(request, access)
        if request.method == "GET":  # the confirmation
            rid = request.query_params.get("id", "")
            found = await self.call(lambda s: s.store.log.get(user, [rid]) if len(rid) == 32 else {})
            if rid not in found:
                raise NotFound(f"User {user!r} has no memory {rid!r}.", hint="It may be forgotten already.")
            rec = found[rid]
            return HTMLResponse(self._html("forget.html", access=access, user=user, rec=rec,
                                           title="Forget this memory?"))  # fmt: skip
        if not access.may_write:
            return HTMLResponse(self._html("error.html", access=access, user=user, title="Read-only",
                                           message="This view may not change memory."), status_code=403)  # fmt: skip
        if not same_origin(request):
            return HTMLResponse(self._html("error.html", access=access, user=user, title="Refused",
                                           message="A forget must come from the view's own page."), status_code=403)  # fmt: skip
        form = await request.form()
        rid = str(form.get("id", ""))
        receipt = await self.call(lambda s: s.forget(ids=[rid], user_id=user))
        return HTMLResponse(self._html("forgotten.html", access=access, user=user, receipt=receipt, title="Forgotten"))

    # -- signing in (servers with tokens) -----------------------------------------------

    def _sign_in_page(self, request: Request, *, status: int = 200, message: str = "") -> Response:
        page = self._html("sign_in.html", access=None, title="Sign in", message=message)
        return HTMLResponse(page, status_code=status, headers={"www-authenticate": 'Bearer realm="mnemoplan"'})

    async def sign_in(self, request: Request) -> Response:
        """GET: the form; POST: check the token and keep it in an HttpOnly, same-site cookie."""
        if self.tokens is None:
            return RedirectResponse(f"{self.prefix}/", status_code=303)
        if request.method == "GET":
            return self._sign_in_page(request)
        if not same_origin(request):
            return self._sign_in_page(request, status=403, message="Sign in from the view's own page.")
        form = await request.form()
        token = str(form.get("token", "")).strip()
        if self.tokens.verify(token) is None:
            return self._sign_in_page(request, status=401, message="That token is unknown or was revoked.")
        reply = RedirectResponse(f"{self.prefix}/", status_code=303)
        https = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"  # behind TLS
        reply.set_cookie(COOKIE, token, path=self.prefix, httponly=True, samesite="strict", secure=https)
        return reply

    async def sign_out(self, request: Request) -> Response:
        reply = RedirectResponse(f"{self.prefix}/sign-in" if self.tokens else f"{self.prefix}/", status_code=303)
        reply.delete_cookie(COOKIE, path=self.prefix)
        return reply

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC_FILES:
            return Response("not found", status_code=404)
        return FileResponse(STATIC / name, headers={"cache-control": "public, max-age=86400"})

    async def home(self, request: Request) -> Response:
        return RedirectResponse(f"{self.prefix}/", status_code=307)

    def routes(self) -> list[Route]:
        """Every route of the view, under ``prefix``."""
        p = self.prefix
        return [
            Route(p, self.home, methods=["GET"]),
            Route(f"{p}/", self.page(self.users), methods=["GET"]),
            Route(f"{p}/sessions", self.page(self.sessions), methods=["GET"]),
            Route(f"{p}/session", self.page(self.session), methods=["GET"]),
            Route(f"{p}/facts", self.page(self.facts), methods=["GET"]),
            Route(f"{p}/graph", self.page(self.graph), methods=["GET"]),
            Route(f"{p}/graph.json", self.page(self.graph_data), methods=["GET"]),
            Route(f"{p}/search", self.page(self.search), methods=["GET"]),
            Route(f"{p}/forget", self.page(self.forget), methods=["GET", "POST"]),
            Route(f"{p}/sign-in", self.sign_in, methods=["GET", "POST"]),
            Route(f"{p}/sign-out", self.sign_out, methods=["POST"]),
            Route(f"{p}/static/{{name}}", self.static, methods=["GET"]),
        ]


def create_view_app(call: Call, *, writes: bool = True) -> Starlette:
    """The view as an app of its own (``mnemoplan view``), with ``/`` leading to it."""
    view = WebView(call, writes=writes)

    async def root(request: Request) -> Response:
        return RedirectResponse("/view/", status_code=307)

    return Starlette(routes=[Route("/", root), *view.routes()])
