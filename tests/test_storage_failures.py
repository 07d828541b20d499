"""Storage failures a caller can act on: a full disk, a data directory that cannot be written.
Each is a tool error with a code and a hint of its own, reads go on, and writes resume without a
restart once they can be made.

A real full disk needs a small filesystem of its own, which takes root to mount: that test is
skipped without it.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mnemoplan.errors import OutOfSpace, ReadOnlyData, storage_failure
from mnemoplan.indexes.graph import GraphError
from tests.conftest import run_with_client
from tests.test_mcp_stdio import call, error_text, texts


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), OutOfSpace),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), OutOfSpace),
        (OSError(errno.EFBIG, "File too large"), OutOfSpace),
        # LanceDB, Tantivy and Kùzu (from its child process), word for word from real full disks.
        (RuntimeError("lance error: LanceError(IO): No space left on device (os error 28), /root/.cargo/"
                      "registry/src/lance-file-13.0.0/src/writer/structural.rs:258:9"), OutOfSpace),
        (ValueError("An IO error occurred: 'No space left on device (os error 28)'"), OutOfSpace),
        (GraphError("RuntimeError: IO exception: Cannot write to file. path: /d/graph/graph.kuzu "
                    "fileDescriptor: 4 offsetToWrite: 4096 numBytesToWrite: 4096 numBytesWritten: -1. "
                    "Error: No space left on device"), OutOfSpace),
        (OSError(errno.EROFS, "Read-only file system"), ReadOnlyData),
        (ValueError('Failed to acquire Lockfile: IoError(Os { code: 30, kind: ReadOnlyFilesystem, message: '
                    '"Read-only file system" }). None'), ReadOnlyData),
        (PermissionError(errno.EACCES, "Permission denied"), ReadOnlyData),
        (OSError(errno.ENOENT, "No such file or directory"), None),
        (ValueError("Permission denied by the model's licence"), None),  # the words alone are too common
        (KeyError("x"), None),
    ],
)
def test_storage_failures_are_told_apart_in_every_form_they_take(
    raised: Exception, expected: type | None
) -> None:
    try:
        try:
            raise raised
        except Exception as inner:
            raise RuntimeError("the overlay write failed") from inner  # found through the causes too
    except RuntimeError as outer:
        failure = storage_failure(outer, "remember")
    if expected is None:
        assert failure is None
        return
    assert isinstance(failure, expected) and failure.retryable and "(remember)" in failure.message
    assert "MNEMOPLAN_DATA_DIR" in failure.hint and "without a restart" in failure.hint


@contextmanager
def small_filesystem(path: Path, size: str = "64m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path``: a disk that really fills up (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem takes root")
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False)


def fill(filesystem: Path) -> Path:
    """Take every byte left on ``filesystem``; returns the file to delete to give them back."""
    filler = filesystem / "filler"
    block = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as fh:
        for size in (len(block), 4096, 1):  # down to the last byte of the last page
            try:
                while True:
                    fh.write(block[:size])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_is_out_of_space_reads_go_on_and_writes_resume_once_there_is_room(
    tmp_path: Path,
) -> None:
    with small_filesystem(tmp_path / "disk") as disk:

        async def scenario(client: Any) -> None:
            await call(client, "remember", content="Our boat is called Sea Lark", user_id="u")
            filler = fill(disk)
            refused = await error_text(client, "remember", content="The boat needs new sails", user_id="u")
            assert "[out_of_space]" in refused and "Free space" in refused, refused
            found = texts(await call(client, "recall", query="boat", user_id="u"))
            assert found == ["Our boat is called Sea Lark"]  # reads go on
            filler.unlink()
            await call(client, "remember", content="The boat needs new sails", user_id="u")
            found = texts(await call(client, "recall", query="sails", user_id="u"))
            assert "The boat needs new sails" in found

        run_with_client(disk / "data", scenario)
