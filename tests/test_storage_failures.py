"""Storage failures a caller can act on: a full disk, a data directory that cannot be written, a
start-up that failed. Each is a tool error with a code and a hint of its own, reads go on, what a
forget did is said as it is, and the server recovers without a restart once writes can be made.

A real full disk needs a small filesystem of its own, which takes root to mount: that test is
skipped without it, and a process's file-size limit (which the kernel enforces for anyone)
plays the full disk in the one that runs unprivileged.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mnemoplan.errors import OutOfSpace, ReadOnlyData, storage_failure
from mnemoplan.storage.graph.client import GraphError
from mnemoplan.model import MessageIn
from tests.conftest import make_service, run_with_client
from tests.test_mcp_stdio import call, error_text, texts

ROOT = Path(__file__).resolve().parents[1]


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


# A file-size limit makes writes of big files fail with EFBIG, as a full disk fails them with ENOSPC,
# while small ones (a journal intent, a deletion file) go through: a purge, which writes the log's
# fragments anew, fails after the forget it follows deleted the records. Run in a process of its own.
FILE_SIZE_LIMIT = """
import json, resource, signal, sys
from pathlib import Path
from mnemoplan.errors import MnemoError
from mnemoplan.model import MessageIn
from tests.conftest import make_service

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing us
svc = make_service(Path(sys.argv[1]))
def turns(tag):
    return [MessageIn(content=f"{tag} {i} " + "lorem ipsum dolor " * 30, speaker="Ann") for i in range(40)]

ids = svc.remember(messages=turns("first"), user_id="u", session_id="s").ids
svc.store.wait_for_writes("u")
out = {}

def outcome(name, fn):
    try:
        out[name] = fn().model_dump(mode="json")
    except MnemoError as exc:
        out[name] = {"error": exc.code, "text": exc.to_text()}
    except Exception as exc:
        out[name] = {"error": "internal", "text": repr(exc)}

soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
outcome("remember", lambda: svc.remember(messages=turns("second"), user_id="u", session_id="s"))
outcome("recall", lambda: svc.recall("lorem first", user_id="u"))
outcome("forget", lambda: svc.forget(ids=ids[:1], user_id="u"))
out["in_log"] = bool(svc.store.log.get("u", ids[:1]))
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # room again
outcome("remember_again", lambda: svc.remember(messages=turns("third"), user_id="u", session_id="s"))
outcome("forget_again", lambda: svc.forget(ids=ids[1:2], user_id="u"))
out["purges_left"] = [i.op for i in svc.store.journal.pending() if i.op == "purge"]
svc.close()
print(json.dumps(out))
"""


def test_out_of_room_a_write_says_so_a_forget_says_what_it_did_and_both_work_once_there_is_room(
    tmp_path: Path,
) -> None:
    run = subprocess.run([sys.executable, "-c", FILE_SIZE_LIMIT, str(tmp_path / "data")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["remember"]["error"] == "out_of_space", out["remember"]
    assert "Free space" in out["remember"]["text"] and "(retryable)" in out["remember"]["text"]
    assert out["recall"]["items"]  # reads go on
    # The forget deleted the record (out of the log and every search); only its purge failed.
    forget = out["forget"]
    assert forget.get("removed") == 1 and forget["purged"] is False and not out["in_log"], forget
    assert "deleted" in forget["warnings"][0] and "still on the disk" in forget["warnings"][0]
    assert len(out["remember_again"]["ids"]) == 40
    # The next forget of the user purges what the failed purge left, too.
    assert out["forget_again"]["purged"] is True and out["purges_left"] == []


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


@contextmanager
def read_only(path: Path) -> Iterator[Callable[[], None]]:
    """Make ``path`` read-only for this process and its children (a read-only bind mount as root,
    whom permissions do not stop; permissions otherwise); yields what makes it writable again."""
    if os.geteuid() == 0:
        bound = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, check=False)
        if bound.returncode:
            pytest.skip("a bind mount cannot be made here")
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True)
            yield lambda: subprocess.run(["mount", "-o", "remount,rw,bind", str(path)], check=True)
        finally:
            subprocess.run(["umount", "--lazy", str(path)], check=False)
        return

    def chmod(writable: bool) -> None:
        for entry in [path, *path.rglob("*")]:
            mode = entry.stat().st_mode
            entry.chmod(mode | 0o200 if writable else mode & ~0o222)

    chmod(False)
    try:
        yield lambda: chmod(True)
    finally:
        chmod(True)


def test_a_read_only_data_directory_serves_reads_and_takes_writes_once_writable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    svc = make_service(data)
    svc.remember(messages=[MessageIn(content="I keep bees on the roof", speaker="Ann")], user_id="u",
                 session_id="s")  # fmt: skip
    svc.close()
    with read_only(data) as make_writable:

        async def scenario(client: Any) -> None:
            assert "I keep bees on the roof" in texts(await call(client, "recall", query="bees", user_id="u"))
            deep = await call(client, "deep_memory_search", query="bees on the roof", user_id="u")
            assert "I keep bees on the roof" in [item["text"] for item in deep["items"]]
            refused = await error_text(client, "remember", content="The bees swarmed today", user_id="u")
            assert "[read_only]" in refused and "writable" in refused, refused
            assert "[read_only]" in await error_text(client, "forget", scope="user", user_id="u")
            make_writable()  # no restart: the next write finds out
            await call(client, "remember", content="The bees swarmed today", user_id="u")
            found = texts(await call(client, "recall", query="swarmed", user_id="u"))
            assert "The bees swarmed today" in found

        run_with_client(data, scenario)


def test_a_start_up_that_failed_is_tried_again_by_the_next_call(tmp_path: Path) -> None:
    """It used to answer every call with the first failure until the server was restarted."""
    data = tmp_path / "data"
    data.mkdir()
    with (data / "LOCK").open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another process holds the data directory

        async def scenario(client: Any) -> None:
            assert "[data_dir_locked]" in await error_text(client, "recall", query="anything", user_id="u")
            fcntl.flock(other, fcntl.LOCK_UN)  # the other process is done
            await call(client, "remember", content="I moved to Porto", user_id="u")
            assert texts(await call(client, "recall", query="Porto", user_id="u")) == ["I moved to Porto"]

        run_with_client(data, scenario)
