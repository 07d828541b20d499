"""Expected failures, each with a stable code, a retry hint and advice for the caller.

Every layer raises these; the server turns them into MCP tool errors (``is_error``)
whose text an agent can act on. Anything that is not a ``MnemoError`` is a bug and is
reported as an internal error without details.
"""

from __future__ import annotations


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


class PurgeIncomplete(MnemoError):
    """Records were deleted from every store, but their bytes could not be purged from the disk yet."""

    code = "purge_incomplete"
    retryable = True


class InvalidPlan(InvalidInput):
    """A query plan does not validate against the index registry."""

    code = "invalid_plan"


class Unavailable(MnemoError):
    """A component is not ready or is temporarily unusable."""

    code = "unavailable"
    retryable = True


class DataDirLocked(MnemoError):
    """Another process owns the data directory."""

    code = "data_dir_locked"
    retryable = True


class LLMError(MnemoError):
    """The LLM call failed, timed out or returned something unusable."""

    code = "llm_error"
    retryable = True
