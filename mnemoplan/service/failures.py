"""Storage failures a caller can act on, raised as their ``MnemoError`` by every service method."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from mnemoplan.errors import storage_failure

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")


def storage_errors(doing: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """A service method whose storage failures that the caller can act on (a full disk, a data
    directory that cannot be written) raise their ``MnemoError`` (see ``errors.storage_failure``)
    instead of the storage library's own exception, which reached callers as an internal error."""

    def wrap(method: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(method)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                failure = storage_failure(exc, doing)
                if failure is None:
                    raise
                log.warning("%s failed: %s", doing, failure.message, exc_info=True)
                raise failure from exc

        return call

    return wrap
