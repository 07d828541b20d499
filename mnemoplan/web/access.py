"""Who is calling the web view, and what they may see and change: one function to ask.

Without tokens, only this machine may look (a loopback client address), and it may forget what
the view was started to allow. With tokens (``mnemoplan token create``), the same tokens as the
MCP endpoint: a caller signs in once with a token, kept in an HttpOnly, SameSite=Strict cookie
(or sends ``Authorization: Bearer``); a user's token shows that user's memory only, an admin
token any user's, and a read-only token never forgets. The token is checked on every request,
so a revoked one is refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.requests import Request

if TYPE_CHECKING:
    from mnemoplan.storage.tokens import TokenStore

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})
COOKIE = "mnemoplan_view_token"


@dataclass(frozen=True)
class Access:
    """A caller let in: who, whether they may forget, and the one user they may see (None: any)."""

    who: str
    may_write: bool
    user: str | None = None
    signed_in: bool = False


def presented_token(request: Request) -> str | None:
    """The token a request carries: an ``Authorization: Bearer`` header, else the view's cookie."""
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return request.cookies.get(COOKIE) or None


def caller_access(request: Request, *, writes: bool, tokens: TokenStore | None = None) -> Access | None:
    """The caller's access to the view, or None to refuse them.

    Args:
        request: The HTTP request.
        writes: Whether the view was started to allow forgetting.
        tokens: The server's tokens; None for a server without any (loopback callers only).
    """
    if tokens is not None:  # started with tokens: always a token, even once every one is revoked
        token = presented_token(request)
        info = tokens.verify(token) if token else None
        if info is None:
            return None
        who = f"admin token {info.id}" if info.admin else f"token {info.id} of {info.user_id}"
        return Access(who=who, may_write=writes and not info.read_only, user=None if info.admin else info.user_id,
                      signed_in=True)  # fmt: skip
    client = request.client.host if request.client else ""
    if client not in LOOPBACK and not client.startswith("127."):
        return None
    return Access(who=f"local ({client})", may_write=writes)


def same_origin(request: Request) -> bool:
    """Whether a request that changes memory comes from the view's own pages (a page of another
    site in the same browser could otherwise post a forget to a loopback address)."""
    if request.headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
        return False
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return False
    return urlsplit(origin).netloc == request.headers.get("host", "")
