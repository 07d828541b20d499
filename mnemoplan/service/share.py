"""One store, every host: the process that holds a data directory serves the others.

The first process to lock a data directory opens its stores and also listens on a Unix socket
inside it (``serve.sock``, mode 0600; a caller of another OS user is refused by its peer
credentials where the OS gives them). Any later ``mnemoplan serve`` or CLI command on the same
directory finds it there and relays its calls: a ``RemoteService`` has the service's methods,
sent as one JSON line per call (the method and its arguments), answered with one JSON line
(the result, or the ``MnemoError`` to raise). Plain JSON over the socket, not MCP: the calls
are the service's own, already validated by the relaying process's tools.

When the holder exits, even killed, the kernel lets go of its lock and the relaying process's
call fails with ``HolderGone``; ``open_shared`` then takes the lock and becomes the holder (or,
if another process was quicker, relays to that one). Every write the holder acknowledged is in
the log: LanceDB has written a write's files and its new version before it returns, so a
killed process loses none of it (tests/test_shared_store.py; a power cut, which needs fsync,
is not covered), and the overlays are repaired from the journal when the next holder opens
the stores.

Where Python has no AF_UNIX (Windows), the holder listens on a loopback TCP port instead and
writes the port with a random secret to ``serve.port`` (mode 0600, written atomically); a relay
reads both from the file and sends the secret with each call, so only who can read the data
directory can call.
"""

from __future__ import annotations

import contextlib
import hmac
import inspect
import json
import logging
import os
import secrets
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from mnemoplan import errors
from mnemoplan.errors import DataDirLocked, HolderGone, MnemoError
from mnemoplan.model import (
    DeepSearchResult,
    ExplainPlanResult,
    ForgetReceipt,
    RecallResult,
    RememberResult,
    UserSummary,
)
from mnemoplan.service.service import MemoryService

log = logging.getLogger(__name__)

SOCKET_FILE = "serve.sock"
PORT_FILE = "serve.port"  # where there is no AF_UNIX: {"port": ..., "secret": ...}
# What a relaying process may ask, and what each answers.
RESULTS: dict[str, Any] = {
    "remember": RememberResult, "recall": RecallResult, "deep_search": DeepSearchResult,
    "forget": ForgetReceipt, "explain_plan": ExplainPlanResult, "users": list[UserSummary],
}  # fmt: skip
_LOCAL_ONLY = {"progress"}  # callbacks stay in the relaying process
CAN_UNIX = hasattr(socket, "AF_UNIX")


def socket_path(data_dir: Path) -> Path:
    """Where the holder of ``data_dir`` listens: its Unix socket, or the file naming its TCP port."""
    return data_dir / (SOCKET_FILE if CAN_UNIX else PORT_FILE)


def _over_tcp(path: Path) -> bool:
    return path.name == PORT_FILE


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, readable by this OS user only."""
    fd, tmp = tempfile.mkstemp(prefix=".serve-", dir=path.parent)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's user id (Linux), or None where the OS does not tell."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return uid


@cache
def _adapter(method: str, name: str) -> TypeAdapter[Any]:
    return TypeAdapter(get_type_hints(getattr(MemoryService, method))[name])


@cache
def _result_adapter(method: str) -> TypeAdapter[Any]:
    return TypeAdapter(RESULTS[method])  # built once: building one costs more than the call's validation


def _error_reply(exc: MnemoError) -> dict[str, Any]:
    return {"error": {"class": type(exc).__name__, "code": exc.code, "message": exc.message, "hint": exc.hint}}


def _raise_reply(error: dict[str, Any]) -> None:
    kind = getattr(errors, error.get("class", ""), None)
    if not (isinstance(kind, type) and issubclass(kind, MnemoError)):
        kind = MnemoError
    raise kind(error["message"], hint=error.get("hint", ""), code=error.get("code"))


class ShareServer:
    """Serves ``service`` to other processes of this OS user on the data directory's socket.

    Args:
        service: The service this process opened (it holds the data directory's lock).
        path: The socket's path; a file left there by a holder that died is replaced.
    """

    def __init__(self, service: MemoryService, path: Path) -> None:
        self._service = service
        self.path = path
        path.unlink(missing_ok=True)  # this process holds the lock: whatever is there is stale
        self._secret: str | None = None
        if _over_tcp(path):
            self._sock = socket.create_server(("127.0.0.1", 0))
            self._secret = secrets.token_urlsafe(32)
            _write_private(path, json.dumps({"port": self._sock.getsockname()[1], "secret": self._secret}))
        else:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(0o177)  # the socket file is created 0600: no moment when others may connect
            try:
                self._sock.bind(str(path))
            finally:
                os.umask(old)
            self._sock.listen(64)
        self._inode = os.stat(path).st_ino
        self._closed = False
        # Threads kept between calls: a new thread per call made each recall slower (the storage and
        # inference libraries keep per-thread state), and bounds how many calls run at once.
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mnemoplan-share-call")
        threading.Thread(target=self._accept, name="mnemoplan-share", daemon=True).start()
        log.info("serving other processes on %s", path)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            self._pool.submit(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                uid = _peer_uid(conn) if self._secret is None else None
                if uid is not None and uid != os.getuid():
                    log.warning("refused a connection from user id %d on %s", uid, self.path)
                    return
                with conn.makefile("rb") as reader:
                    line = reader.readline()
                if not line:
                    return
                request = json.loads(line)
                if self._secret is not None and not hmac.compare_digest(str(request.get("secret", "")), self._secret):
                    log.warning("refused a call without the secret of %s", self.path)
                    return
                conn.sendall(json.dumps(self._answer(request)).encode() + b"\n")
            except OSError:
                log.info("a relaying process went away before its answer")

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        method = request.get("method")
        if method == "ping":
            return {"result": os.getpid()}
        if method not in RESULTS:
            return _error_reply(errors.InvalidInput(f"No such call: {method!r}."))
        try:
            kwargs = {k: _adapter(method, k).validate_python(v) for k, v in request.get("kwargs", {}).items()}
            result = getattr(self._service, method)(**kwargs)
            return {"result": to_jsonable_python(result)}
        except MnemoError as exc:
            return _error_reply(exc)
        except Exception as exc:
            failure = errors.storage_failure(exc, method)
            if failure is not None:
                return _error_reply(failure)
            log.exception("unexpected error in a relayed %s", method)
            return _error_reply(MnemoError("Unexpected server error; the details are in the log of the process "
                                           "that holds the data directory.", code="internal_error"))  # fmt: skip

    def close(self) -> None:
        """Stop listening, let the calls under way finish; remove the socket file unless another
        holder has replaced it."""
        self._closed = True
        try:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
            self._sock.close()
            self._pool.shutdown(wait=True)  # calls under way finish before the stores close
        finally:
            try:
                if os.stat(self.path).st_ino == self._inode:
                    self.path.unlink()
            except FileNotFoundError:
                pass


class RemoteService:
    """The memory service of the process that holds the data directory, over its socket.

    Has the service's call methods (``remember``, ``recall``, ``deep_search``, ``forget``,
    ``explain_plan``, ``users``). A call that names no user runs for this process's default user.

    Args:
        path: The holder's socket.
        default_user_id: This process's default user.
        timeout_s: How long one call may take (deep search with an LLM takes seconds).
    """

    read_only = False
    embedder = None

    def __init__(self, path: Path, default_user_id: str, *, timeout_s: float = 600.0) -> None:
        self.path = path
        self.default_user_id = default_user_id
        self._timeout_s = timeout_s

    @classmethod
    def connect(cls, path: Path, default_user_id: str) -> RemoteService | None:
        """A relay to the holder listening on ``path``, or None if no process answers there."""
        remote = cls(path, default_user_id, timeout_s=30.0)
        try:
            remote._request({"method": "ping"})
        except HolderGone:
            return None
        remote._timeout_s = 600.0
        return remote

    def _request(self, request: dict[str, Any]) -> Any:
        try:
            if _over_tcp(self.path):
                where = json.loads(self.path.read_text(encoding="utf-8"))
                request = {**request, "secret": where["secret"]}
                sock = socket.create_connection(("127.0.0.1", int(where["port"])), timeout=self._timeout_s)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with sock:
                if not _over_tcp(self.path):
                    sock.settimeout(self._timeout_s)
                    sock.connect(str(self.path))
                sock.sendall(json.dumps(request).encode() + b"\n")
                with sock.makefile("rb") as reader:
                    line = reader.readline()
        except (OSError, ValueError, KeyError) as exc:  # refused, reset, no such file, timed out
            raise HolderGone(f"The process that holds the data directory stopped answering ({exc}).",
                             hint="Retry: another process takes the data directory over.") from None  # fmt: skip
        if not line:
            raise HolderGone("The process that holds the data directory stopped during the call.",
                             hint="Retry: another process takes the data directory over.")  # fmt: skip
        reply = json.loads(line)
        if "error" in reply:
            _raise_reply(reply["error"])
        return reply["result"]

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        bound = inspect.signature(getattr(MemoryService, method)).bind(None, *args, **kwargs)
        sent = {k: v for k, v in bound.arguments.items() if k != "self" and k not in _LOCAL_ONLY}
        if "user_id" in inspect.signature(getattr(MemoryService, method)).parameters and sent.get("user_id") is None:
            sent["user_id"] = self.default_user_id
        result = self._request({"method": method, "kwargs": to_jsonable_python(sent)})
        return _result_adapter(method).validate_python(result)

    def remember(self, *args: Any, **kwargs: Any) -> RememberResult:
        return self._call("remember", *args, **kwargs)

    def recall(self, *args: Any, **kwargs: Any) -> RecallResult:
        return self._call("recall", *args, **kwargs)

    def deep_search(self, *args: Any, **kwargs: Any) -> DeepSearchResult:
        return self._call("deep_search", *args, **kwargs)

    def forget(self, *args: Any, **kwargs: Any) -> ForgetReceipt:
        return self._call("forget", *args, **kwargs)

    def explain_plan(self, *args: Any, **kwargs: Any) -> ExplainPlanResult:
        return self._call("explain_plan", *args, **kwargs)

    def users(self) -> list[UserSummary]:
        return self._call("users")

    def writable_now(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing to release: each call has its own connection."""


def open_shared(
    data_dir: Path, build: Callable[[], MemoryService], default_user_id: str, *, wait_s: float = 120.0,
    unserved_wait_s: float = 10.0,
) -> MemoryService | RemoteService:
    """Relay to the process that holds ``data_dir``, or hold it: open the service with ``build``
    and serve it to the others.

    A directory locked by a process that does not answer yet is tried again: for ``wait_s``
    while a socket is left there (its holder was killed and another process is taking over,
    repairing the stores first), for ``unserved_wait_s`` while there is none (a process is
    opening the stores, or the holder serves nobody: a ``reindex``, an older mnemoplan).

    Raises:
        DataDirLocked: Still locked, and nobody answering, after that.
        MnemoError: ``build`` failed otherwise.
    """
    path = socket_path(data_dir)
    started = time.monotonic()
    while True:
        remote = RemoteService.connect(path, default_user_id) if path.exists() else None
        if remote is not None:
            log.info("the data directory %s is held by another process: relaying to it", data_dir)
            return remote
        try:
            service = build()
        except DataDirLocked:
            if time.monotonic() - started >= (wait_s if path.exists() else unserved_wait_s):
                raise
            time.sleep(0.2)
            continue
        if not service.read_only:
            try:
                server = ShareServer(service, path)
            except OSError as exc:  # a path too long for a socket, say: serve this host alone
                log.warning("cannot serve other processes on %s (%s); they will find the directory locked",
                            path, exc)  # fmt: skip
            else:
                service.on_close.append(server.close)
        return service
