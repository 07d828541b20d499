"""The search log: one line per recall and deep search, for ``mnemoplan stats``.

One JSON-lines file per user (named by a hash of the user id), appended in the
background so logging never slows a search. Forgetting records removes the log lines
of searches that returned them (a query that found a forgotten memory is a trace of
it); forgetting a user removes the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from mnemoplan.model import DeepSearchResult, RecallResult

log = logging.getLogger(__name__)


def log_path(root: Path, user_id: str) -> Path:
    """The file of one user's searches."""
    return root / (hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:32] + ".jsonl")


def load_entries(root: Path, user_id: str | None = None) -> list[dict[str, Any]]:
    """Logged searches (of one user, or of all), oldest first; readable while a server runs."""
    paths = [log_path(root, user_id)] if user_id is not None else sorted(root.glob("*.jsonl"))
    out: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    out.append(json.loads(line))
    out.sort(key=lambda e: e.get("ts", ""))
    return out


class SearchLog:
    """Buffered JSONL logs of searches under ``root``.

    Args:
        root: Directory of the per-user files.
        flush_every_s: Longest an entry waits in memory.
    """

    def __init__(self, root: Path, *, flush_every_s: float = 2.0) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._buffer: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._interval = flush_every_s
        self._thread = threading.Thread(target=self._run, name="mnemoplan-search-log", daemon=True)
        self._thread.start()

    def _path(self, user_id: str) -> Path:
        return log_path(self.root, user_id)

    def record(self, entry: dict[str, Any]) -> None:
        """Queue one entry (it must carry ``user_id``)."""
        with self._lock:
            self._buffer.append(entry)
            if len(self._buffer) >= 200:
                self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Write queued entries to their users' files."""
        with self._lock:
            pending, self._buffer = self._buffer, []
        if not pending:
            return
        by_user: dict[str, list[dict[str, Any]]] = {}
        for entry in pending:
            by_user.setdefault(str(entry.get("user_id", "")), []).append(entry)
        with self._file_lock:
            for user_id, entries in by_user.items():
                try:
                    with self._path(user_id).open("a", encoding="utf-8") as fh:
                        for entry in entries:
                            fh.write(json.dumps(entry, ensure_ascii=False, default=str) + "\n")
                except OSError:
                    log.exception("could not write the search log")

    def entries(self, user_id: str | None = None) -> list[dict[str, Any]]:
        """Every logged search (of one user, or of all), oldest first."""
        self.flush()
        with self._file_lock:
            return load_entries(self.root, user_id)

    def forget(self, user_id: str, ids: set[str] | None = None) -> int:
        """Drop a user's log (``ids`` None) or the searches that returned any of ``ids``; returns lines removed."""
        self.flush()
        path = self._path(user_id)
        with self._file_lock:
            if not path.exists():
                return 0
            lines = path.read_text(encoding="utf-8").splitlines()
            if ids is None:
                path.unlink()
                return len(lines)
            kept = [line for line in lines if not ids.intersection(json.loads(line).get("result_ids", []))]
            tmp = path.with_suffix(".tmp")
            try:
                tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
            except OSError:  # a full disk: no half-written copy left behind
                tmp.unlink(missing_ok=True)
                raise
            os.replace(tmp, path)
            return len(lines) - len(kept)

    def close(self) -> None:
        """Stop the writer and flush."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush()


def search_summary(result: RecallResult | DeepSearchResult) -> dict[str, Any]:
    """What the search log keeps of a recall or deep search result."""
    if isinstance(result, RecallResult):
        plan = result.trace.plan
        return {
            "plan": plan.name if plan else "", "steps": [s.model_dump() for s in result.trace.signals],
            "timings_ms": result.trace.timings_ms, "items": len(result.items), "candidates": result.total_candidates,
            "rounds": 1, "cost_usd": 0.0, "llm_calls": 0, "result_ids": [i.id for i in result.items][:50],
            "warnings": len(result.warnings),
        }  # fmt: skip
    stats = result.stats
    return {
        "plan": result.plans[-1].name if result.plans else "",
        "steps": [{"name": s.step_id, "index": s.index, "count": s.count, "ms": s.ms, "error": s.error}
                  for s in result.steps],  # fmt: skip
        "timings_ms": stats.durations_ms, "items": len(result.items),
        "candidates": sum(stats.candidates_per_index.values()), "rounds": stats.rounds, "cost_usd": stats.cost_usd,
        "llm_calls": stats.llm_calls, "sufficient": result.sufficient, "result_ids": [i.id for i in result.items][:50],
        "warnings": len(result.warnings),
    }  # fmt: skip
