"""Who is calling, over HTTP: the SDK's bearer-token authorization over mnemoplan's own tokens.

The SDK does the HTTP side (``AuthSettings``: a 401 with ``WWW-Authenticate`` for a missing or
unknown token, the protected-resource metadata of the MCP authorization spec); this module
gives it a ``TokenVerifier`` over the data directory's ``TokenStore`` and decides, in one
place (``caller_user``), which ``user_id`` a tool call may reach. An external OAuth issuer can
replace the verifier later: ``caller_user`` reads only the ``AccessToken`` the SDK hands on.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings

from mnemoplan.errors import Forbidden
from mnemoplan.storage.tokens import TokenStore

SCOPE_READ = "memory:read"
SCOPE_WRITE = "memory:write"
SCOPE_ADMIN = "memory:admin"
USER_CLAIM = "mnemoplan_user"


class StoreTokenVerifier(TokenVerifier):
    """Verifies bearer tokens against the data directory's token file, as it is now (a revoked
    token is refused at the next request)."""

    def __init__(self, tokens: TokenStore) -> None:
        self._tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        info = self._tokens.verify(token)
        if info is None:
            return None
        scopes = [SCOPE_READ] + ([] if info.read_only else [SCOPE_WRITE]) + ([SCOPE_ADMIN] if info.admin else [])
        return AccessToken(token=token, client_id=f"mnemoplan-token-{info.id}", scopes=scopes,
                           subject=info.user_id, claims={USER_CLAIM: info.user_id})  # fmt: skip


def caller_user(user_id: str | None, *, write: bool) -> str | None:
    """The ``user_id`` a tool call runs with, from the request's access token.

    Without a token (stdio, or HTTP on loopback without tokens) the argument stands. A user's
    token reaches that user only: an omitted ``user_id`` becomes the token's user; another one is
    refused. An admin token may name any user.

    Raises:
        Forbidden: ``user_id`` is not the token's user, or a read-only token asks to write.
    """
    token = get_access_token()
    if token is None:
        return user_id
    if write and SCOPE_WRITE not in token.scopes:
        raise Forbidden("This token may only read: remember and forget are refused.",
                        hint="Ask for a token without --read-only.")  # fmt: skip
    if SCOPE_ADMIN in token.scopes:
        return user_id
    own = (token.claims or {}).get(USER_CLAIM) or token.subject
    if user_id is None or user_id == own:
        return own
    raise Forbidden(f"This token reaches the memory of user {own!r} only, not {user_id!r}; nothing was read or changed.",
                    hint="Leave user_id out (it defaults to the token's user), or use that user's token.")  # fmt: skip


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) only accepts connections from this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def auth_settings(base_url: str, issuer_url: str | None = None) -> AuthSettings:
    """The SDK's settings for a resource server at ``base_url`` (what hosts connect to).

    The tokens are mnemoplan's own, so the issuer defaults to the server itself; an external
    OAuth issuer's URL can be named instead (``MNEMOPLAN_HTTP_ISSUER_URL``).
    """
    return AuthSettings(issuer_url=issuer_url or base_url, resource_server_url=f"{base_url}/mcp",
                        required_scopes=[SCOPE_READ], validate_token_resource=False)  # fmt: skip


def transport_security(host: str, port: int, allowed_hosts: list[str]) -> TransportSecuritySettings | None:
    """The SDK's Host/Origin checks (DNS-rebinding protection): on for loopback as the SDK sets them,
    and on for any other bind whose host names are configured; None leaves the SDK's default."""
    if is_loopback(host) and not allowed_hosts:
        return None  # the SDK turns them on itself for 127.0.0.1, localhost and ::1
    names = ["127.0.0.1", "localhost", "[::1]", *allowed_hosts] if is_loopback(host) else list(allowed_hosts)
    if not names:
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{n}:*" for n in names] + [f"{n}" for n in names],
        allowed_origins=[f"{scheme}://{n}:*" for n in names for scheme in ("http", "https")]
        + [f"{scheme}://{n}" for n in names for scheme in ("http", "https")],
    )


def auth_options(tokens: TokenStore | None, base_url: str | None, issuer_url: str | None) -> dict[str, Any]:
    """``MCPServer``'s arguments for bearer-token authorization with ``tokens`` (none: no auth)."""
    if tokens is None:
        return {}
    if base_url is None:
        raise ValueError("an authenticated server needs its base URL")
    return {"token_verifier": StoreTokenVerifier(tokens), "auth": auth_settings(base_url, issuer_url)}
