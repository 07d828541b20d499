"""Expected failures, each with a stable code, a retry hint and advice for the caller.

Every layer raises these; the server turns them into MCP tool errors (``is_error``)
whose text an agent can act on. Anything that is not a ``MnemoError`` is a bug and is
reported as an internal error without details.
"""

from __future__ import annotations

import errno


class MnemoError(Exception):
    """Base class of every expected failure.

    Attributes:
        code: Stable machine-readable code, e.g. ``invalid_input``.
        message: What went wrong, in one sentence.
        hint: What the caller can do about it.
        retryable: True when the same call may succeed later unchanged.
    """

    code = "error"
    retryable = False

    def __init__(self, message: str, *, hint: str = "", code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code

    def to_text(self) -> str:
        """One short paragraph for the tool-error channel."""
        text = f"[{self.code}] {self.message}"
        if self.hint:
            text += f" Hint: {self.hint}"
        if self.retryable:
            text += " (retryable)"
        return text


class InvalidInput(MnemoError):
    """An argument is malformed, out of range or inconsistent with another one."""

    code = "invalid_input"


class TooLarge(InvalidInput):
    """An argument exceeds a configured limit."""

    code = "too_large"


class NotFound(MnemoError):
    """A referenced record does not exist for this user."""

    code = "not_found"


class InvalidPlan(InvalidInput):
    """A query plan does not validate against the index registry."""

    code = "invalid_plan"


class Unavailable(MnemoError):
    """A component is not ready or is temporarily unusable."""

    code = "unavailable"
    retryable = True


class Forbidden(MnemoError):
    """The caller's credentials do not allow this call (another user's memory, a write with a
    read-only token); nothing was read or changed."""

    code = "forbidden"


class HolderGone(Unavailable):
    """The process that holds the data directory, which this one relays to, stopped during a call."""


class DataDirLocked(MnemoError):
    """Another process owns the data directory."""

    code = "data_dir_locked"
    retryable = True


class LLMError(MnemoError):
    """The LLM call failed, timed out or returned something unusable."""

    code = "llm_error"
    retryable = True


class OutOfSpace(MnemoError):
    """The disk (or quota) that holds the data directory is full: nothing more can be written."""

    code = "out_of_space"
    retryable = True


class ReadOnlyData(MnemoError):
    """The data directory cannot be written to: reads work, writes wait until it can."""

    code = "read_only"
    retryable = True


OUT_OF_SPACE_HINT = (
    "Free space on the disk that holds the data directory (MNEMOPLAN_DATA_DIR), or raise its quota, "
    "then retry: the server carries on without a restart, and reads work meanwhile."
)
READ_ONLY_HINT = (
    "Make the data directory (MNEMOPLAN_DATA_DIR) writable for the server's user, then retry: the "
    "server notices without a restart, and reads work meanwhile."
)

# errno values and the words storage libraries that report errors as text (LanceDB and Tantivy
# from Rust, Kùzu from its child process) put in their messages: "(os error 28)", strerror(3).
_OUT_OF_SPACE = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
                 errno.EFBIG: "File too large"}  # fmt: skip
_READ_ONLY = {errno.EROFS: "Read-only file system", errno.EACCES: "Permission denied"}


def storage_failure(exc: BaseException, doing: str = "") -> MnemoError | None:
    """The expected failure a storage exception stands for, or None for anything else.

    Looks through the exception and its causes for an ``OSError`` errno, or a storage library's
    message that names one: a full disk or quota (ENOSPC, EDQUOT, and EFBIG, a file-size limit)
    becomes ``OutOfSpace``, a read-only or forbidden data directory (EROFS, EACCES)
    ``ReadOnlyData``.

    Args:
        exc: What a storage operation raised.
        doing: What was being done, for the message, e.g. ``remember``.

    Returns:
        The ``MnemoError`` to raise instead (``exc`` stays its cause), or None.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MnemoError):
            return None
        number = current.errno if isinstance(current, OSError) else None
        text = str(current)
        for table, kind in ((_OUT_OF_SPACE, OutOfSpace), (_READ_ONLY, ReadOnlyData)):
            for code, words in table.items():
                named = words in text and code != errno.EACCES  # too common: only as a code
                if number == code or named or f"(os error {code})" in text:
                    return _storage_error(kind, words, doing)
        current = current.__cause__ or current.__context__
    return None


def _storage_error(kind: type[MnemoError], words: str, doing: str) -> MnemoError:
    what = f" ({doing})" if doing else ""
    if kind is OutOfSpace:
        return OutOfSpace(f"No room left to write to the data directory{what}: {words.lower()}.",
                          hint=OUT_OF_SPACE_HINT)  # fmt: skip
    return ReadOnlyData(f"The data directory cannot be written to{what}: {words.lower()}.",
                        hint=READ_ONLY_HINT)  # fmt: skip
