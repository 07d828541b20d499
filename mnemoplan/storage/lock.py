"""The data directory's lock: one mnemoplan process per data directory, on every platform.

A directory that can be written is locked with ``filelock.FileLock`` on its ``LOCK`` file
(``flock`` on POSIX, ``LockFileEx`` on Windows). One that cannot (a read-only mount, or no
write permission for the server's user) is still locked, so that a server can read it
without another one writing meanwhile: ``FileLock`` opens its file for writing and fails
there, so the file is opened read-only and locked through that descriptor with filelock's
``lock_descriptor`` (the same primitive, which needs no write access).
"""

from __future__ import annotations

import os
from pathlib import Path

from filelock import FileLock, Timeout, lock_descriptor

from mnemoplan.errors import READ_ONLY_HINT, DataDirLocked, ReadOnlyData

LOCK_FILE = "LOCK"


def can_write(data_dir: Path) -> bool:
    """Whether this process may write in the data directory now (a read-only mount, or a directory
    without write permission for the server's user, may not)."""
    if not os.access(data_dir, os.W_OK | os.X_OK):  # EROFS is reported too, for root as well
        return False
    lock = data_dir / LOCK_FILE
    return not lock.exists() or os.access(lock, os.W_OK)


def _locked(data_dir: Path) -> DataDirLocked:
    return DataDirLocked(
        f"Another mnemoplan process is using the data directory {data_dir}.",
        hint="Stop the other server (or CLI command), or point MNEMOPLAN_DATA_DIR elsewhere.",
    )


class DataDirLock:
    """This process's hold on a data directory, taken by ``acquire`` and let go by ``release``.

    Attributes:
        writable: Whether the directory could be written when it was locked.
    """

    def __init__(self, writable: bool, lock: FileLock | None = None, fd: int | None = None) -> None:
        self.writable = writable
        self._lock = lock
        self._fd = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Lock the data directory for this process (created if missing), without waiting.

        Raises:
            DataDirLocked: Another process (or another store in this one) holds the lock.
            ReadOnlyData: The directory cannot be written and holds no store to read.
        """
        data_dir.mkdir(parents=True, exist_ok=True)
        if not can_write(data_dir):
            return cls(False, fd=cls._lock_read_only(data_dir))
        # Not thread-local: the store is closed by whichever thread closes it.
        lock = FileLock(data_dir / LOCK_FILE, mode=0o600, thread_local=False, blocking=False)
        try:
            lock.acquire()
        except Timeout:
            raise _locked(data_dir) from None
        return cls(True, lock=lock)

    @staticmethod
    def _lock_read_only(data_dir: Path) -> int:
        """The lock file's read-only descriptor, locked (``FileLock`` cannot lock without write access).

        Raises:
            DataDirLocked: Another process holds the lock.
            ReadOnlyData: There is no lock file, so no store to read.
        """
        try:
            fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
        except FileNotFoundError:
            raise ReadOnlyData(
                f"The data directory {data_dir} cannot be written to and holds no memories yet.",
                hint=READ_ONLY_HINT,
            ) from None
        try:
            held = lock_descriptor(fd, blocking=False)
        except BaseException:
            os.close(fd)
            raise
        if not held:
            os.close(fd)
            raise _locked(data_dir)
        return fd

    def release(self) -> None:
        """Let the data directory go (closing the descriptor releases a read-only lock)."""
        if self._lock is not None:
            self._lock.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
