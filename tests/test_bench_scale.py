"""bench-scale on a small store: its outputs, and a second run that reuses the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnemoplan.cli.main import main

DATASET = Path("/work/shared/data/locomo10.json")


def run(out: Path, data_dir: Path) -> dict:
    code = main(["bench-scale", "--dataset", str(DATASET), "--messages", "300", "--queries", "20",
                 "--out", str(out), "--embedding-model", "hash",
                 "--data-dir", str(data_dir), "--keep-data"])  # fmt: skip
    assert code == 0
    assert (out / "scale.md").stat().st_size > 0
    return json.loads((out / "scale.json").read_text())


def test_bench_scale_builds_then_reuses_the_store(tmp_path: Path) -> None:
    if not DATASET.exists():
        pytest.skip(f"{DATASET} is missing")
    data_dir = tmp_path / "data"
    first = run(tmp_path / "out1", data_dir)
    assert first["n_messages"] == 300 and not first["reused"]
    assert first["ingest"]["stored"] == 300 and first["ingest"]["remember_calls"] > 1
    assert first["recall"]["10"]["latency_ms"]["n"] == 20 and first["recall"]["50"]["latency_ms"]["n"] == 20
    assert "How the store was built" in (tmp_path / "out1" / "scale.md").read_text()

    second = run(tmp_path / "out2", data_dir)
    assert second["reused"] and second["existing_messages"] == 300
    assert second["ingest"]["stored"] == 0 and second["ingest"]["remember_calls"] == 0
    assert second["n_messages"] == 300
    assert data_dir.exists()  # --keep-data
