"""Serving MCP over stdio, with lone UTF-16 surrogates repaired before the SDK parses a line.

A JSON string may escape half of a surrogate pair (``"\\ud83d"``): JavaScript writes one when
text is cut between the two halves of an emoji. The SDK's parser refuses such a line and
drops the message without an answer, so the caller waits for a reply that never comes and
the text is lost. Each unpaired surrogate escape becomes U+FFFD instead, as invalid UTF-8
bytes already do in the SDK's own decoding of stdin: the message is answered and stored,
with one replacement character where the broken half was.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from contextlib import suppress
from io import TextIOWrapper
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server

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


class _Lines:
    """Lines of an async text file, repaired; all that the SDK's stdin reader asks of it."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._source:
            yield repair_lone_surrogates(line)


class _UnownedTextWrapper(TextIOWrapper):
    """A text layer over stdin's buffer that never closes the buffer itself."""

    def close(self) -> None:
        with suppress(ValueError):
            self.detach()


async def serve_stdio(app: MCPServer) -> None:
    """Run ``app`` over stdin/stdout until stdin closes."""
    text = _UnownedTextWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    stdin: Any = _Lines(anyio.wrap_file(text))
    async with stdio_server(stdin=stdin) as (read_stream, write_stream):
        # MCPServer.run_stdio_async does the same with the SDK's own stdin reader.
        server = app._lowlevel_server
        await server.run(read_stream, write_stream, server.create_initialization_options())
