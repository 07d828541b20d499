"""Who is calling the web view, and whether they may change memory: one function to ask.

Until the HTTP server has tokens, only this machine may look (a loopback client address), and it
may forget what the view was started to allow. With tokens, this is the one place that reads the
caller's token and returns its subject and its right to write.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True)
class Access:
    """A caller let in: who, and whether they may forget."""

    who: str
    may_write: bool


def caller_access(request: Request, *, writes: bool) -> Access | None:
    """The caller's access to the view, or None to refuse them.

    Args:
        request: The HTTP request.
        writes: Whether the view was started to allow forgetting.
    """
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
