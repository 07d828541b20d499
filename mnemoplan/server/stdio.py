"""Serving MCP over stdio: every request the SDK's reader would drop is answered.

The SDK's stdin reader drops a line it cannot read as a JSON-RPC message without a word,
so the caller waits for a reply that never comes. Two causes are mended here:

- A JSON string may escape half of a surrogate pair (``"\\ud83d"``): JavaScript writes one
  when text is cut between the two halves of an emoji. Each unpaired surrogate escape
  becomes U+FFFD, as invalid UTF-8 bytes already do in the SDK's own decoding of stdin: the
  message is answered and stored, with one replacement character where the broken half was.
- Any other line the SDK refuses (not JSON, a request whose params are not an object, one
  nested deeper than its parser's 200 levels) gets a JSON-RPC error, with the request's id.

stdin is read by a daemon thread, not the SDK's AnyIO worker thread: cancelling the server
(Ctrl-C) would wait for that thread's read, which in a terminal ends only with a line.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections.abc import AsyncIterable, AsyncIterator
from contextlib import suppress
from typing import Any

import anyio
import ijson
from anyio import from_thread
from anyio.abc import ObjectSendStream, TaskStatus
from anyio.lowlevel import current_token
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError, jsonrpc_message_adapter
from pydantic import ValidationError

log = logging.getLogger(__name__)

# Escaped backslashes and other escapes are matched too, so that scanning stays aligned:
# in ``\\ud800`` the backslash is escaped and "ud800" is plain text.
_ESCAPE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a whole pair: kept
    r"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"  # half of one: replaced
    r"|\\u[0-9a-fA-F]{4}|\\.",  # anything else escaped: kept
    re.DOTALL,
)
_REPLACEMENT = "\\ufffd"


def repair_lone_surrogates(line: str) -> str:
    """``line`` with every escaped unpaired UTF-16 surrogate replaced by an escaped U+FFFD."""
    if "\\u" not in line:
        return line

    def fix(m: re.Match[str]) -> str:
        text = m.group()
        return _REPLACEMENT if len(text) == 6 and text[2] in "dD" and text[3] in "89abcdefABCDEF" else text

    return _ESCAPE.sub(fix, line)


def refusal(line: str, error: ValidationError) -> JSONRPCError | None:
    """The answer to a line the SDK's reader refuses (``error`` says why), or None for a line
    that gets none: a blank one, a notification, a response.

    As JSON-RPC 2.0 says: text that is not JSON is a parse error; JSON that is not a request
    the server can read is an invalid request, answered with the request's id if it has one.
    """
    if not line.strip():
        return None
    top = _top_level(line)
    if top is None:
        return _error(None, PARSE_ERROR, "Parse error: the message is not JSON.")
    if not isinstance(top, dict):
        return _error(None, INVALID_REQUEST, "Invalid request: one JSON-RPC object per line (no batches).")
    if "method" not in top and ("result" in top or "error" in top):
        return None  # a response to the server: nothing to answer
    if "method" in top and "id" not in top:
        return None  # a notification gets no answer, not even an error
    rid = top.get("id")
    valid = isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))
    return _error(rid if valid else None, INVALID_REQUEST, f"Invalid request: {_why(error)}.")


def _error(rid: str | int | None, code: int, message: str) -> JSONRPCError:
    return JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(code=code, message=message))


def _top_level(line: str) -> dict[str, Any] | str | None:
    """The members of the JSON object on ``line`` (a nested one as ``...``), the type of another
    JSON value, or None for text that is not JSON. The parser is iterative, so a request nested
    past the SDK's parser still shows its id."""
    fields: dict[str, Any] = {}
    depth, key, first = 0, None, None
    try:
        for event, value in ijson.basic_parse(line):
            first = first or event
            if depth == 1 and key is not None:
                fields[key] = ... if event in ("start_map", "start_array") else value
                key = None
            elif depth == 1 and event == "map_key":
                key = value
            depth += event in ("start_map", "start_array")
            depth -= event in ("end_map", "end_array")
    except ijson.JSONError:
        return None
    return fields if first == "start_map" else first


def _why(error: ValidationError) -> str:
    """What the SDK found wrong with a message, as it applies to a request."""
    errors = error.errors(include_url=False, include_input=False)
    if errors[0]["type"] == "json_invalid":
        if "recursion limit" in errors[0]["msg"]:
            return "it is nested more deeply than the server reads JSON (200 levels)"
        return errors[0]["msg"]
    first = next((e for e in errors if e["loc"][:1] == ("JSONRPCRequest",)), errors[0])
    where = ".".join(str(part) for part in first["loc"][1:])
    return f"{where}: {first['msg']}" if where else first["msg"]


class _Lines:
    """Lines of an async text file for the SDK's stdin reader: repaired, and only those it can
    read; each of the others is answered on ``answer_with``'s stream instead."""

    def __init__(self, source: AsyncIterable[str]) -> None:
        self._source = source
        self._answers: ObjectSendStream[SessionMessage] | None = None
        self._ready = anyio.Event()

    def answer_with(self, stream: ObjectSendStream[SessionMessage]) -> None:
        """Where to write the answers to refused lines (the transport's write stream)."""
        self._answers = stream
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        await self._ready.wait()
        async for line in self._source:
            line = repair_lone_surrogates(line)
            try:  # what the SDK's reader does with the line, to answer here what it would drop
                jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValidationError as exc:
                await self._refuse(line, exc)
                continue
            yield line

    async def _refuse(self, line: str, error: ValidationError) -> None:
        answer = refusal(line, error)
        if answer is None:
            log.info("ignored a message that is not JSON-RPC and needs no answer: %.80r", line)
            return
        log.info("refused a message: %s", answer.error.message)
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):  # the server has stopped
            await self._answers.send(SessionMessage(answer))


async def stdin_lines(fd: int = 0) -> AsyncIterator[str]:
    """The lines of ``fd`` (stdin), decoded as the SDK decodes them (invalid UTF-8 replaced).

    A daemon thread reads them from a duplicate of the descriptor: a read blocked in a terminal
    then keeps neither Ctrl-C from stopping the server nor the process from exiting, and the
    thread never holds the lock of ``sys.stdin``'s buffer, which the interpreter takes on exit.
    """
    try:
        source = open(os.dup(fd), encoding="utf-8", errors="replace")  # noqa: SIM115 (the thread closes it)
    except OSError:  # no stdin at all: as if it were empty
        return
    send, receive = anyio.create_memory_object_stream[str](0)
    token = current_token()

    def pump() -> None:
        # BrokenResourceError: the server stopped reading; RunFinishedError: the event loop is gone.
        with source, suppress(anyio.BrokenResourceError, anyio.RunFinishedError):
            for line in source:
                from_thread.run(send.send, line, token=token)
            from_thread.run_sync(send.close, token=token)

    threading.Thread(target=pump, name="mnemoplan-stdin", daemon=True).start()
    async with receive:
        async for line in receive:
            yield line


async def serve_stdio(app: MCPServer) -> int | None:
    """Run ``app`` over stdin/stdout until stdin closes, or until Ctrl-C or SIGTERM.

    Returns:
        The number of the signal that stopped the server, None when stdin closed.

    The signals are taken inside the event loop and cancel the server, which closes what it
    opened on its way out. A KeyboardInterrupt raised by a Python-level handler lands in whichever
    task runs at that moment, and asyncio then logged it as an unhandled error, with a traceback.
    """
    stopped: list[int] = []
    stdin = _Lines(stdin_lines())
    async with anyio.create_task_group() as tasks:

        async def stop_on_signals(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            try:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    task_status.started()
                    async for signum in signals:
                        stopped.append(signum)
                        break
            except NotImplementedError:  # Windows' event loop takes no signal handlers: Ctrl-C stays
                task_status.started()  # a KeyboardInterrupt, caught by the CLI
                return
            # A second Ctrl-C or SIGTERM, while the stores close, ends the process at once.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            tasks.cancel_scope.cancel()

        await tasks.start(stop_on_signals)  # listening before the first message is read
        async with stdio_server(stdin=stdin) as (read_stream, write_stream):  # type: ignore[arg-type]
            stdin.answer_with(write_stream)
            # MCPServer.run_stdio_async does the same with the SDK's own stdin reader.
            server = app._lowlevel_server
            await server.run(read_stream, write_stream, server.create_initialization_options())
        tasks.cancel_scope.cancel()
    return stopped[0] if stopped else None
