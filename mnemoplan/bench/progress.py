"""A small progress line on stderr: count, rate and time left."""

from __future__ import annotations

import sys
import time


class Progress:
    """``label  123/456  78.9 msg/s  eta 4s`` redrawn at most every half second."""

    def __init__(self, label: str, total: int, unit: str = "it") -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self.started = time.perf_counter()
        self._drawn = 0.0

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        self.done += n
        now = time.perf_counter()
        if now - self._drawn >= 0.5 or self.done >= self.total:
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._drawn = now
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate else 0.0
        sys.stderr.write(f"\r{self.label:>8} {self.done}/{self.total}  {rate:.1f} {self.unit}/s  eta {eta:.0f}s   ")
        sys.stderr.flush()

    def close(self) -> None:
        """Finish the line."""
        self._draw(time.perf_counter())
        sys.stderr.write("\n")
