"""A loopback HTTP server that speaks enough of the Anthropic Messages API, or of OpenAI's chat
completions API, for the real client libraries.

Tests point ``LLMClient`` at it by ``base_url`` so the LLM paths run through the real SDKs
(``anthropic``, ``openai``): their request building, their response parsing and their
exception classes. The server is scripted: each ``POST /v1/messages`` (Anthropic) or
``POST /v1/chat/completions`` (OpenAI) takes the next queued ``Reply``, or asks the
``responder`` when the queue is empty, and every request body is kept for assertions, with
the tokens it reported (what a provider would bill).

Only the standard library is used, so the server cannot drift with the SDK it is testing.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

Responder = Callable[[dict[str, Any]], "Reply"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer to a Messages API request.

    Attributes:
        text: The assistant's text, sent as a single text content block.
        input_tokens: Reported in ``usage.input_tokens``.
        output_tokens: Reported in ``usage.output_tokens``.
        status: HTTP status; anything but 200 answers with an Anthropic-style error body.
        error_type: ``error.type`` of the error body (``api_error``, ``rate_limit_error``...).
        message: ``error.message`` of the error body.
        delay_s: Seconds to wait before answering, to make the client time out.
        stop_reason: ``stop_reason`` of a successful reply.
        headers: Extra response headers, e.g. ``{"retry-after": "0"}``.
        refusal: OpenAI only: a refusal reported apart from the text (``message.refusal``), the
            content then null.
        body: Raw bytes sent instead of a Messages API body (with ``content_type``), to play an
            endpoint that answers with something else: a proxy's HTML page, a truncated body.
        content_type: The ``Content-Type`` of ``body``.
    """

    text: str = ""
    input_tokens: int = 10
    output_tokens: int = 5
    status: int = 200
    error_type: str = "api_error"
    message: str = "scripted failure"
    delay_s: float = 0.0
    stop_reason: str = "end_turn"
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    content_type: str = "application/json"
    refusal: str | None = None


class _HTTPServer(ThreadingHTTPServer):
    """The socket server, with a back-reference to the scripted state it serves."""

    daemon_threads = True

    def __init__(self, owner: LoopbackMessagesServer, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _MessagesHandler)
        self.owner = owner


class _MessagesHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keep-alive, as the real API does, so the client's connection pool is exercised.
    protocol_version = "HTTP/1.1"
    # Idle keep-alive connections are dropped after this long, so stopped servers leave no threads.
    timeout = 10
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Keep pytest's output clean: the recorded requests are the log."""

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        owner = self.server.owner
        error = _openai_error if owner.api == "openai" else _error_body
        if self.path.split("?", 1)[0] != ROUTES[owner.api]:
            self._send(404, error("not_found_error", f"no route {self.path}"), {})
            return
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            self._send(400, error("invalid_request_error", "body is not JSON"), {})
            return
        try:
            reply = owner._next_reply(body, dict(self.headers))
        except Exception as err:  # noqa: BLE001 - a broken responder must fail the test visibly
            self._send(400, error("invalid_request_error", f"responder raised {err!r}"), {})
            return
        if reply is None:
            # 400 is not retried by the client, so an under-scripted test fails at once and clearly.
            self._send(400, error("invalid_request_error", "no scripted reply left"), {})
            return
        if reply.delay_s > 0 and owner._stopping.wait(reply.delay_s):
            return  # shutting down: do not answer a client that has long given up
        if reply.body is not None:
            self._send(reply.status, reply.body, reply.headers, reply.content_type)
            return
        if reply.status != 200:
            self._send(reply.status, error(reply.error_type, reply.message), reply.headers)
            return
        owner._served(reply)
        answer = _completion_body if owner.api == "openai" else _message_body
        self._send(200, answer(body, reply), reply.headers)

    def _send(self, status: int, payload: dict[str, Any] | bytes, headers: dict[str, str],
              content_type: str = "application/json") -> None:  # fmt: skip
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("request-id", f"req_{uuid.uuid4().hex[:24]}")
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The client timed out and closed the socket while we were delaying: expected.
            self.close_connection = True


ROUTES = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


def _error_body(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


def _openai_error(error_type: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": None}}


def _completion_body(request: dict[str, Any], reply: Reply) -> dict[str, Any]:
    finish = {"max_tokens": "length", "end_turn": "stop"}.get(reply.stop_reason, reply.stop_reason)
    message = {"role": "assistant", "content": None if reply.refusal else reply.text, "refusal": reply.refusal}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": request.get("model", "unknown") if isinstance(request, dict) else "unknown",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                  "total_tokens": reply.input_tokens + reply.output_tokens},
    }


def _message_body(request: dict[str, Any], reply: Reply) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "unknown") if isinstance(request, dict) else "unknown",
        "content": [{"type": "text", "text": reply.text}],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


class LoopbackMessagesServer:
    """A scripted Messages API (or chat-completions API, ``api="openai"``) on 127.0.0.1, served
    from a daemon thread.

    Usage::

        server = LoopbackMessagesServer()
        server.start()
        server.script(Reply(text='{"ok": true}'), Reply(status=500))
        ...  # point a client at server.url
        server.stop()

    Attributes:
        responder: Called with the request body when no scripted reply is queued.
    """

    def __init__(self, responder: Responder | None = None, api: str = "anthropic") -> None:
        if api not in ROUTES:
            raise ValueError(f"api must be one of {sorted(ROUTES)}")
        self.responder = responder
        self.api = api
        self.tokens_served = [0, 0]  # input, output: what the replies sent with 200 reported
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._requests: list[dict[str, Any]] = []
        self._headers: list[dict[str, str]] = []
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self, port: int = 0) -> LoopbackMessagesServer:
        """Bind ``port`` (a free one by default) on 127.0.0.1 and start serving.

        Returns:
            The server itself, for chaining.

        Raises:
            RuntimeError: If the server is already running.
        """
        if self._httpd is not None:
            raise RuntimeError("server already started")
        self._stopping.clear()
        self._httpd = _HTTPServer(self, port)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
            name="llm-loopback-server",
        )  # fmt: skip
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; wakes any handler still delaying its reply."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> LoopbackMessagesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL for the client, e.g. ``http://127.0.0.1:54321``.

        Raises:
            RuntimeError: If the server is not running.
        """
        if self._httpd is None:
            raise RuntimeError("server not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def base_url(self) -> str:
        """What a client is given as its base URL: the root (Anthropic) or the root's ``/v1`` (OpenAI)."""
        return self.url + ("/v1" if self.api == "openai" else "")

    def user_prompt(self, request: dict[str, Any]) -> str:
        """The first user message of a request, whichever API it was sent to."""
        return next(m["content"] for m in request["messages"] if m["role"] == "user")

    def system_prompt(self, request: dict[str, Any]) -> str:
        """The system prompt of a request, whichever API it was sent to."""
        if self.api == "anthropic":
            return request.get("system", "")
        return next((m["content"] for m in request["messages"] if m["role"] == "system"), "")

    def script(self, *replies: Reply) -> None:
        """Queue replies; each request takes the next one, in order."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request body received so far (parsed JSON), oldest first; a copy."""
        with self._lock:
            return list(self._requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The headers of every request received so far, oldest first; a copy."""
        with self._lock:
            return list(self._headers)

    @property
    def pending(self) -> int:
        """How many scripted replies are still queued."""
        with self._lock:
            return len(self._queue)

    def _served(self, reply: Reply) -> None:
        with self._lock:
            self.tokens_served[0] += reply.input_tokens
            self.tokens_served[1] += reply.output_tokens

    def _next_reply(self, body: dict[str, Any], headers: dict[str, str]) -> Reply | None:
        with self._lock:
            self._requests.append(body)
            self._headers.append(headers)
            if self._queue:
                return self._queue.popleft()
        # Outside the lock: a responder may be slow or inspect server state itself.
        return self.responder(body) if self.responder is not None else None


LoopbackLLMServer = LoopbackMessagesServer  # the name that says it speaks either API


@pytest.fixture
def llm_server() -> Iterator[LoopbackMessagesServer]:
    """A started loopback Messages API server, stopped after the test."""
    server = LoopbackMessagesServer().start()
    try:
        yield server
    finally:
        server.stop()
