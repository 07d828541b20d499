"""Rounds of remember-then-forget over MCP stdio, as ``bench/forget_rounds.py`` runs them at length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.forget_rounds import RoundsResult, files_holding, run_rounds
from tests.conftest import run_with_client


def test_rounds_of_remember_then_forget_all_succeed_and_leave_no_secret_on_disk(tmp_path: Path) -> None:
    """By id, session and project in turn, with speakers and batch sizes varying: the graph
    process crashed in every second purge from the third round on, and the failed forget
    could be neither retried nor finished, its secret left in the log's files."""
    data = tmp_path / "data"

    async def scenario(client: Any) -> RoundsResult:
        return await run_rounds(client, 12, data)

    result = run_with_client(data, scenario)
    assert (result.failed, result.unfinished, result.lingering) == ([], [], [])
    found = files_holding(data, result.forgotten + result.kept)
    assert [s for s in result.forgotten if s in found] == []
    assert all(s in found for s in result.kept)  # the search does find what was not forgotten
