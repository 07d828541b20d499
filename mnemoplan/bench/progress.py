"""The bench's progress line: count, rate and time left, drawn by ``mnemoplan.progress`` (tqdm)."""

from __future__ import annotations

from mnemoplan.progress import ProgressBar


class Progress:
    """``label  123/456  78.9 msg/s  eta 4s`` on a terminal; nothing when stderr is not one."""

    def __init__(self, label: str, total: int, unit: str = "it") -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self._bar = ProgressBar(label, total, unit)

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more items done."""
        self.done += n
        self._bar.advance(n)

    def close(self) -> None:
        """Finish the line."""
        self._bar.close()
