"""Progress bars of long commands (import, export, reindex, bench), drawn by tqdm.

tqdm is the one progress library here (it came with the model's libraries already): this
module is its only importer, so every command's bar looks alike. On a terminal a bar is drawn on
stderr; elsewhere (a pipe, a log file, CI) nothing is drawn, and the command's summary says it all.
"""

from __future__ import annotations

import sys
from types import TracebackType

from tqdm import tqdm


class ProgressBar:
    """A bar of ``total`` steps (None: unknown) on stderr, drawn only on a terminal.

    Args:
        label: What is counted, before the bar ("import").
        total: Steps in all, if known.
        unit: What one step is ("msg", "record").
        enabled: Force drawing on (True) or off (False); None draws on a terminal only.
    """

    def __init__(self, label: str, total: int | None = None, unit: str = "it", *, enabled: bool | None = None) -> None:
        draw = sys.stderr.isatty() if enabled is None else enabled
        self.drawn = draw
        self._done = 0  # a disabled tqdm counts nothing
        self._bar = tqdm(total=total, desc=label, unit=unit, file=sys.stderr, disable=not draw,
                         dynamic_ncols=True, mininterval=0.5)  # fmt: skip

    @property
    def done(self) -> int:
        """Steps counted so far."""
        return self._done

    def advance(self, n: int = 1) -> None:
        """Count ``n`` more steps done."""
        self._done += n
        self._bar.update(n)

    def set_total(self, total: int) -> None:
        """Learn the total once known (a streamed file is counted as it is read)."""
        self._bar.total = total
        self._bar.refresh()

    def note(self, text: str) -> None:
        """Show a short status after the counts."""
        self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        """Finish the bar's line."""
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def format_interval(seconds: float) -> str:
    """A duration as the bars show their time left: ``00:04``, ``2:49:00``."""
    return str(tqdm.format_interval(seconds))
