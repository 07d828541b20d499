"""The memory service of a running server, built in the background and replaced when it must be.

See ``ServiceHolder``: tools wait for it, a start-up that failed is tried again, a read-only
service is opened anew once the data directory can be written, and a relay whose holder
stopped is replaced by the process that takes the data directory over.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from mnemoplan.errors import HolderGone, MnemoError, ReadOnlyData, Unavailable, storage_failure
from mnemoplan.runtime import settle_heap, unsettle_heap

if TYPE_CHECKING:  # imported by the service's factory, in the start-up thread
    from mnemoplan.service.service import MemoryService

log = logging.getLogger(__name__)
T = TypeVar("T")


class ServiceHolder:
    """Builds the memory service in the background and hands it to tools once ready.

    The build (importing torch and the storage libraries, opening the stores) holds the
    GIL for long stretches; started at once, it delayed the answer to ``initialize`` by most
    of the build. It therefore waits for the handshake to finish (``go``), for a first tool call,
    or at most ``start_after_s``.

    Nothing that failed stays failed until a restart: a start-up that failed is tried again
    by the next tool call (the data directory may have been unlocked, given room or made
    writable since), and a service that could only open its data directory to read is
    opened anew by the first write that finds the directory writable.
    """

    def __init__(self, factory: Callable[[], MemoryService], *, start_after_s: float = 1.0) -> None:
        self._factory = factory
        self._cond = threading.Condition()
        self._service: MemoryService | None = None
        self._error: BaseException | None = None
        self._building = False
        self._in_use = 0  # calls running on the service: a replacement waits for them
        self._go = threading.Event()
        self._start(start_after_s)

    def go(self) -> None:
        """Start building now (the client has finished the handshake, or needs the service)."""
        self._go.set()

    def _start(self, wait_s: float) -> None:
        """Build in the background (called at first, or under the condition's lock)."""
        self._building = True
        threading.Thread(target=self._build, args=(wait_s,), name="mnemoplan-startup", daemon=True).start()

    def _build(self, wait_s: float) -> None:
        self._go.wait(wait_s)
        service: MemoryService | None = None
        error: BaseException | None = None
        unsettle_heap()  # what an earlier service left may be collected
        try:
            service = self._factory()
            settle_heap()
        except BaseException as exc:
            error = exc
            if isinstance(exc, MnemoError) or storage_failure(exc) is not None:
                log.warning("the memory service could not start: %s", exc)
            else:
                log.exception("the memory service could not start")
        with self._cond:
            self._service, self._error, self._building = service, error, False
            self._cond.notify_all()

    def _acquire(self, timeout_s: float) -> MemoryService:
        self.go()
        with self._cond:
            if not self._building and self._error is not None:
                self._start(0.0)  # try again: what made it fail may be gone
            if not self._cond.wait_for(lambda: not self._building, timeout_s):
                raise Unavailable("The memory service is still starting.", hint="Retry in a few seconds.")
            if self._error is not None:
                raise start_failure(self._error)
            assert self._service is not None  # built, since no error was kept
            self._in_use += 1
            return self._service

    def _release(self) -> None:
        with self._cond:
            self._in_use -= 1
            self._cond.notify_all()

    def _reopen(self, stale: MemoryService, *, gone: bool = False) -> bool:
        """Replace a service that opened its data directory to read only, if the directory can be
        written now (False if it cannot), or (``gone``) a relay whose holder stopped: the data
        directory is taken over, or relayed to the process that took it. Called with no call of
        this thread on the service."""
        with self._cond:
            if self._service is not stale or self._building:
                return True  # another call has replaced it already, or is replacing it
            if not gone and not stale.writable_now():
                return False
            self._building = True  # new calls wait for the new service
            self._cond.wait_for(lambda: self._in_use == 0)
            self._service = None
        log.info("the process that held the data directory stopped: taking it over" if gone else
                 "the data directory can be written again: opening the memory service anew")  # fmt: skip
        try:
            stale.close()
        except Exception:
            log.exception("the read-only memory service did not close cleanly")
        self._build(0.0)
        return True

    def call(self, fn: Callable[[MemoryService], T], *, timeout_s: float = 120.0) -> T:
        """Run ``fn(service)`` in this (worker) thread once the service is ready.

        A write that a read-only service refuses runs again, once, on a service opened anew if
        the data directory can be written now; a call whose relay lost the process holding the
        data directory runs again, once, on the service that takes over.

        Raises:
            MnemoError: start-up failed or is taking too long, or ``fn`` raised it.
        """
        service = self._acquire(timeout_s)
        held = True
        try:
            return fn(service)
        except ReadOnlyData:
            if not service.read_only:
                raise
            self._release()
            held = False
            if not self._reopen(service):
                raise  # still read-only
        except HolderGone:  # once: a remember retried is not stored twice (see MemoryService.remember)
            self._release()
            held = False
            self._reopen(service, gone=True)
        finally:
            if held:
                self._release()
        service = self._acquire(timeout_s)
        try:
            return fn(service)
        finally:
            self._release()

    def close(self) -> None:
        """Wait for start-up to settle, then close the service."""
        self._go.set()
        with self._cond:
            self._cond.wait_for(lambda: not self._building)
            service, self._service = self._service, None
        if service is not None:
            service.close()


def start_failure(error: BaseException) -> MnemoError:
    """What a tool call is told when the service could not start."""
    if isinstance(error, MnemoError):
        return error
    failure = storage_failure(error, "start-up")
    if failure is not None:
        return failure
    return Unavailable("The memory service failed to start; see the server log.",
                       hint="It is tried again at the next call.")  # fmt: skip
