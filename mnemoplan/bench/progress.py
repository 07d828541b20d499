"""The bench's progress line: count, rate and time left, drawn by ``mnemoplan.progress`` (tqdm)
on a terminal; elsewhere (a log file of a build that runs for hours) a plain line now and then."""

from __future__ import annotations

import sys
import time

from mnemoplan.progress import ProgressBar, format_interval

LOG_EVERY_S = 60.0  # between two plain lines when stderr is no terminal


class Progress:
    """``label  123/456  78.9 msg/s  eta 4s`` on a terminal; off one, ``label: 123/456 msg, 78.9 msg/s,
    ~00:04 left`` on stderr every ``every_s`` seconds (and nothing for work shorter than that).

    Args:
        label: What is counted.
        total: Items in all.
        unit: What one item is.
        every_s: Seconds between two plain lines, off a terminal.
    """

    def __init__(self, label: str, total: int, unit: str = "it", *, every_s: float = LOG_EVERY_S) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self._bar = ProgressBar(label, total, unit)
        self._every = every_s
        self._started = self._logged = time.monotonic()

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        self.done += n
        self._bar.advance(n)
        if not self._bar.drawn and time.monotonic() - self._logged >= self._every:
            self._log()

    def _log(self) -> None:
        self._logged = now = time.monotonic()
        rate = self.done / max(now - self._started, 1e-9)
        left = ""
        if rate > 0 and self.total > self.done:
            left = f", ~{format_interval((self.total - self.done) / rate)} left"
        print(f"{self.label}: {self.done}/{self.total} {self.unit}, {rate:.1f} {self.unit}/s{left}",
              file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        """Finish the line."""
        self._bar.close()
