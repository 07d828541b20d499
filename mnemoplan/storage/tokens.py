"""Bearer tokens for the HTTP server, kept hashed in the data directory (or, for servers sharing a
log in object storage, in a table of that log: ``log.token_table``).

A token is ``mnp_`` followed by 32 random bytes (``secrets.token_urlsafe``); only its SHA-256
is stored, so the file tells nobody a token (a slow hash buys nothing for a secret this long).
The file (``tokens.json``, mode 0600) is replaced atomically on each change, and a verifier
re-reads it whenever it changed (a ``stat`` per request otherwise), so a revoked token is
refused from the next request on, by every server on the directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from mnemoplan.errors import InvalidInput, NotFound
from mnemoplan.storage.log.token_table import TokenTable

TOKENS_FILE = "tokens.json"
PREFIX = "mnp_"


@dataclass(frozen=True)
class TokenInfo:
    """One token, without its secret.

    Attributes:
        id: Short public id, for ``token list`` and ``token revoke``.
        user_id: The user whose memory the token reaches; None for an admin token.
        admin: May name any user_id.
        read_only: May recall and search, not remember or forget.
        created_at: ISO-8601 UTC.
        note: What the token is for, as given at creation.
    """

    id: str
    user_id: str | None
    admin: bool
    read_only: bool
    created_at: str
    note: str = ""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenStore:
    """The tokens of one data directory.

    Args:
        data_dir: The data directory (created if missing when a token is created).
    """

    def __init__(self, data_dir: Path, shared: TokenTable | None = None) -> None:
        self.path = data_dir / TOKENS_FILE
        self._shared = shared
        self._lock = threading.Lock()
        self._seen: object = None  # (inode, size, mtime_ns) of the file last read, or the table's version
        self._by_hash: dict[str, TokenInfo] = {}

    # -- reads -------------------------------------------------------------------------

    def _entries(self) -> list[dict]:
        if self._shared is not None:
            return self._shared.entries()
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return list(data.get("tokens", []))

    def _stamp(self) -> object:
        """What changes when a token is made or revoked: the file's identity, or the shared table's version."""
        if self._shared is not None:
            return self._shared.version()
        try:
            st = os.stat(self.path)
            return (st.st_ino, st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            return None

    def _current(self) -> dict[str, TokenInfo]:
        """Tokens by hash, read again only when they changed (the file is replaced, never edited)."""
        key = self._stamp()
        with self._lock:
            if key != self._seen:
                entries = self._entries() if key is not None else []
                self._by_hash = {e["hash"]: _info(e) for e in entries}
                self._seen = key
            return self._by_hash

    def configured(self) -> bool:
        """Whether any token exists (the HTTP server then requires one)."""
        return bool(self._current())

    def verify(self, token: str) -> TokenInfo | None:
        """The token's holder, or None for a token that does not exist (or was revoked)."""
        if not token.startswith(PREFIX):
            return None
        return self._current().get(_digest(token))

    def list(self) -> list[TokenInfo]:
        """Every token, oldest first, without secrets."""
        return [_info(e) for e in self._entries()]

    # -- writes ------------------------------------------------------------------------

    def create(self, *, user_id: str | None, admin: bool = False, read_only: bool = False,
               note: str = "") -> tuple[str, TokenInfo]:  # fmt: skip
        """Make a token for ``user_id`` (or an admin token); returns the secret, shown once.

        Raises:
            InvalidInput: neither or both of a user and admin.
        """
        if admin == (user_id is not None):
            raise InvalidInput("A token is for one user or an admin token.", hint="Pass --user U or --admin.")
        if user_id is not None and not user_id.strip():
            raise InvalidInput("The token's user is empty.", hint="Pass --user with the user's id.")
        secret = PREFIX + secrets.token_urlsafe(32)
        info = TokenInfo(id=secrets.token_hex(4), user_id=user_id, admin=admin, read_only=read_only,
                         created_at=datetime.now(UTC).isoformat(timespec="seconds"), note=note)  # fmt: skip
        entry = {**asdict(info), "hash": _digest(secret)}
        with self._lock:
            if self._shared is not None:
                self._shared.add(entry)
            else:
                self._write([*self._entries(), entry])
        return secret, info

    def revoke(self, token_id: str) -> TokenInfo:
        """Delete a token: it is refused from the next request on.

        Raises:
            NotFound: no token has this id.
        """
        with self._lock:
            entries = self._entries()
            kept = [e for e in entries if e["id"] != token_id]
            if len(kept) == len(entries):
                raise NotFound(f"There is no token {token_id!r}.", hint="`mnemoplan token list` shows the ids.")
            if self._shared is not None:
                self._shared.remove(token_id)
            else:
                self._write(kept)
        return next(_info(e) for e in entries if e["id"] == token_id)

    def _write(self, entries: list[dict]) -> None:
        """Replace the file atomically, readable by this OS user only."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tokens-", dir=self.path.parent)  # mkstemp: mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"version": 1, "tokens": entries}, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _info(entry: dict) -> TokenInfo:
    return TokenInfo(id=entry["id"], user_id=entry.get("user_id"), admin=bool(entry.get("admin")),
                     read_only=bool(entry.get("read_only")), created_at=entry.get("created_at", ""),
                     note=entry.get("note", ""))
