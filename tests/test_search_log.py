"""Every recall and deep search is logged; forget removes the traces; stats aggregates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnemoplan.errors import InvalidInput
from mnemoplan.storage import store as store_module
from mnemoplan.storage.graph.client import GraphError
from mnemoplan.cli.main import main
from mnemoplan.service.service import MemoryService
from tests.conftest import make_service


def test_searches_are_logged_and_forget_removes_their_traces(service: MemoryService) -> None:
    kept = service.remember(content="the heron nests by the weir", user_id="u").ids[0]
    secret = service.remember(content="the safe code is 9981 under the heron print", user_id="u").ids[0]
    service.recall("heron", user_id="u")
    service.deep_search("safe code", user_id="u")
    with pytest.raises(InvalidInput):
        service.recall("   ", user_id="u")
    entries = service.search_log.entries("u")
    assert [e["tool"] for e in entries] == ["recall", "deep"]  # a rejected query never ran a search
    assert all(e["ok"] and e["duration_ms"] > 0 and e["plan"] for e in entries)
    assert secret in entries[1]["result_ids"] and entries[1]["rounds"] >= 1
    receipt = service.forget(ids=[secret], user_id="u")
    assert receipt.deleted["search_log"] == 2  # both searches returned the forgotten memory
    assert all(secret not in e["result_ids"] for e in service.search_log.entries("u"))
    service.recall("weir", user_id="u")
    service.forget(scope="user", user_id="u")
    assert service.search_log.entries("u") == []
    assert kept


def test_stats_command_reads_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svc = make_service(tmp_path / "data")
    try:
        svc.remember(content="otters play in the river", user_id="u")
        for _ in range(3):
            svc.recall("otters", user_id="u")
        svc.deep_search("river otters", user_id="u")
    finally:
        svc.close()
    assert main(["stats", "--data-dir", str(tmp_path / "data"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["recall"]["searches"] == 3 and summary["deep"]["searches"] == 1
    assert summary["recall"]["errors"] == 0 and summary["recall"]["p50_ms"] > 0
    with pytest.raises(SystemExit):
        main(["stats", "--help"])
    assert "only this user's searches (default: every user's)" in capsys.readouterr().out


def test_stats_latency_counts_searches_that_ran() -> None:
    from mnemoplan.cli.stats import summarise_searches

    entries = [{"tool": "recall", "ok": True, "duration_ms": ms} for ms in (10.0, 12.0, 14.0)]
    entries += [{"tool": "recall", "ok": False, "duration_ms": 0.1} for _ in range(4)]  # rejected at once
    summary = summarise_searches(entries)["recall"]
    assert summary["errors"] == 4 and summary["p50_ms"] == 12.0


def test_command_errors_are_one_line_and_an_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MNEMOPLAN_EMBEDDING_MODEL", "hash")
    data = str(tmp_path / "data")
    assert main(["search", "otters", "--data-dir", data]) == 2  # a mistyped directory is not made a store
    assert "[not_found] There is no data directory" in capsys.readouterr().err and not Path(data).exists()
    make_service(Path(data)).close()
    assert main(["search", "otters", "--limit", "0", "--data-dir", data]) == 2
    assert main(["search", " ", "--data-dir", data]) == 2
    err = capsys.readouterr().err
    assert err.count("[invalid_input]") == 2 and "Traceback" not in err
    assert main(["search", "otters", "--data-dir", data]) == 0
    assert "no memories of user 'default' match" in capsys.readouterr().out
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    assert main(["search", "otters", "--data-dir", str(tmp_path / "a-file")]) == 1
    assert "mnemoplan: " in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--http", "--port", "99999", "--data-dir", data])
    assert exit_.value.code == 2 and "between 1 and 65535" in capsys.readouterr().err

    def no_graph(path: Path, **_kwargs: object) -> None:
        raise GraphError(f"the graph database at {path} could not be opened (held by another process)")

    monkeypatch.setattr(store_module, "GraphIndex", no_graph)
    assert main(["search", "otters", "--data-dir", data]) == 1
    err = capsys.readouterr().err
    assert "mnemoplan: the graph database at" in err and "Traceback" not in err
