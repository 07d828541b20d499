"""bench-scale on a small store: its outputs (the keys other tools read), a second run that reuses the
store, and the HTTP load with its checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mnemoplan.cli.main import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"  # ../shared beside the repository
LOCOMO = SHARED / "locomo10.json"
REALMEM = SHARED / "realmem-dev"


def run(out: Path, data_dir: Path, *extra: str) -> dict:
    code = main(["bench-scale", "--dataset", str(LOCOMO), "--dataset", str(REALMEM), "--users", "3",
                 "--per-user", "40", "--big-user", "500", "--queries", "6", "--embedding-model", "hash",
                 "--out", str(out), "--data-dir", str(data_dir), "--keep-data", *extra])  # fmt: skip
    assert code == 0
    assert (out / "scale.md").stat().st_size > 0
    return json.loads((out / "scale.json").read_text())


def test_bench_scale_builds_measures_loads_then_reuses_the_store(tmp_path: Path) -> None:
    if not (LOCOMO.exists() and REALMEM.exists()):
        pytest.skip("the shared datasets are missing")
    data_dir = tmp_path / "data"
    first = run(tmp_path / "out1", data_dir, "--clients", "2", "--load-seconds", "3", "--load-rate", "4")
    assert first["messages"] == 3 * 40 + 2 * 400 + 500 and first["users"] == 6
    assert not first["build"]["reused"] and first["build"]["stored"] == first["messages"]
    assert first["memories"] >= first["messages"] and first["disk_bytes_per_memory"] > 0
    assert set(first["by_user_size"]) == {"40", "400", "500"}
    assert all(v["recall_p50_ms"] > 0 and v["n"] > 0 for v in first["by_user_size"].values())
    for key in ("cold_recall_p50_ms", "rss_mb", "build_s"):
        assert key in first
    load = first["http"]
    assert load["clients"] == 2 and load["calls"] > 0 and load["errors"] == 0
    assert load["lost_writes"] == 0 and load["forgotten_still_stored"] == 0 and load["forgotten_returned"] == 0
    assert load["foreign_returned"] == 0  # each client sees only its own user's memory
    assert load["client_cpu_ms_per_call"] > 0
    if sys.platform == "linux":  # read from /proc: None elsewhere
        assert load["server_cpu_ms_per_call"] > 0

    second = run(tmp_path / "out2", data_dir, "--clients", "0")
    assert second["build"]["reused"] and second["build"]["stored"] == 0 and second["build_s"] == 0.0
    assert second["messages"] >= first["messages"] and second["http"] is None  # plus the notes the measures wrote
    assert data_dir.exists()  # --keep-data


def test_bench_scale_measures_a_store_of_a_few_users_of_one_size(tmp_path: Path) -> None:
    """With no big user and fewer users than it times cold, one user is still left for the
    process's own first recall."""
    if not (LOCOMO.exists() and REALMEM.exists()):
        pytest.skip("the shared datasets are missing")
    code = main(["bench-scale", "--dataset", str(LOCOMO), "--dataset", str(REALMEM), "--users", "2",
                 "--per-user", "20", "--big-user", "0", "--queries", "2", "--embedding-model", "hash",
                 "--clients", "0", "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path / "data")])  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "out" / "scale.json").read_text())
    assert report["users"] == 2 and set(report["by_user_size"]) == {"20"}
    assert report["cold_users"] == 1
