"""Process-wide settings (``mnemoplan.runtime``), each checked in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "") if hasattr(os, "confstr") else ""

_MAPPED = textwrap.dedent("""
    import ctypes, sys
    import numpy as np
    from mnemoplan.runtime import configure
    if sys.argv[1] == "configure":
        configure()
    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                   "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    freed = np.ones(16 * 2**20 // 8)
    del freed  # glibc now serves arrays up to 16 MB from its heap, unless told otherwise
    before = libc.mallinfo2().hblkhd
    kept = np.ones(2**20 // 8)
    print(libc.mallinfo2().hblkhd - before)
""")


@pytest.mark.skipif(not _GLIBC.startswith("glibc"), reason="glibc's allocator only")
def test_freed_large_arrays_go_back_to_the_system() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def mapped(how: str) -> int:
        out = subprocess.run([sys.executable, "-c", _MAPPED, how], env=env, capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    assert mapped("as-is") == 0  # from the heap: its pages stay with the process once freed
    assert mapped("configure") >= 2**20  # a mapping of its own, returned when freed


def test_what_start_up_built_is_left_out_of_collections_until_a_new_service() -> None:
    script = textwrap.dedent("""
        import gc
        from mnemoplan.runtime import settle_heap, unsettle_heap
        settle_heap()
        frozen = gc.get_freeze_count()
        print(*gc.get_threshold())
        unsettle_heap()
        print(frozen > 1000, gc.get_freeze_count())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["10000", "10", "10", "True", "0"]  # young collections every 10,000 allocations


def test_the_gil_is_handed_over_after_a_millisecond_of_python() -> None:
    script = textwrap.dedent("""
        import sys
        from mnemoplan.runtime import configure
        print(sys.getswitchinterval())
        configure()
        print(sys.getswitchinterval())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert [float(v) for v in out.stdout.split()] == [0.005, 0.001]  # Python's default, then ours
