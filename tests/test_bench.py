"""The bench harness on a tiny generic-format dataset: every output, and scores that re-score exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mnemoplan.bench.datasets import normalise_locomo_evidence
from mnemoplan.bench.metrics import question_metrics
from mnemoplan.bench.datasets import Question
from mnemoplan.cli.main import main

ROOT = Path(__file__).resolve().parents[1]

MESSAGES = [
    ("c1", 1, "D1:1", "Ann", "I adopted a greyhound called Pixel last week", "2023-05-08T10:00:00"),
    ("c1", 1, "D1:2", "Ben", "What a lovely name for a dog!", None),
    ("c1", 2, "D2:1", "Ann", "Pixel and I ran on the beach in Brighton", "2023-06-01T09:00:00"),
    ("c1", 2, "D2:2", "Ben", "Brighton sounds windy", None),
    ("c2", 1, "D1:1", "Cy", "My violin lesson moved to Thursdays", "2023-01-03T18:00:00"),
    ("c2", 1, "D1:2", "Di", "Is your teacher still Mrs Okafor?", None),
]
QUESTIONS = [
    ("c1", "q1", "What is the name of Ann's dog?", 1, ["D1:1"]),
    ("c1", "q2", "Where did Ann run with Pixel?", 2, ["D2:1"]),
    ("c2", "q3", "When is the violin lesson?", 1, ["D1:1"]),
    ("c2", "q4", "Who is the violin teacher?", 2, ["D1:2", "D1:1"]),
    ("c2", "q5", "A question without evidence", 2, []),
]


def write_dataset(tmp: Path) -> tuple[Path, Path]:
    messages, questions = tmp / "m.jsonl", tmp / "q.jsonl"
    messages.write_text("".join(
        json.dumps({"conv_id": c, "session": s, "dia_id": d, "speaker": sp, "text": t, "timestamp": ts}) + "\n"
        for c, s, d, sp, t, ts in MESSAGES))  # fmt: skip
    questions.write_text("".join(
        json.dumps({"conv_id": c, "qid": q, "question": text, "answer": "", "category": cat, "evidence": ev}) + "\n"
        for c, q, text, cat, ev in QUESTIONS))  # fmt: skip
    return messages, questions


def test_bench_writes_every_output_and_rescores_exactly(tmp_path: Path) -> None:
    messages, questions = write_dataset(tmp_path)
    out = tmp_path / "out"
    readme = tmp_path / "README.md"
    readme.write_text("# x\n")
    code = main(["bench", "--messages", str(messages), "--questions", str(questions), "--mode", "all",
                 "--out", str(out), "--embedding-model", "hash", "--mcp-sample", "3", "--readme", str(readme),
                 "--cold-starts", "1"])  # fmt: skip
    assert code == 0
    cold = json.loads((out / "metrics.json").read_text())["cold_start"]
    assert cold["starts"] == 1 and cold["runs"][0]["first_call_ms"] > 0
    for mode in ("recall", "deep", "bm25", "vector"):
        rows = [json.loads(line) for line in (out / f"rankings-{mode}.jsonl").read_text().splitlines()]
        assert [r["qid"] for r in rows] == ["q1", "q2", "q3", "q4"]
        assert all(r["latency_ms"] >= 0 and len(r["ranked"]) == len(set(r["ranked"])) for r in rows)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["questions"] == 4 and metrics["ingest"]["messages"] == 6
    assert metrics["mcp_stdio"]["n"] == 3
    assert {"category 1", "category 2", "overall"} <= set(metrics["modes"]["recall"]["quality"])
    for name in ("report.md", "recall_at_10_by_category.png", "latency.png"):
        assert (out / name).stat().st_size > 0
    report = (out / "report.md").read_text()
    quality = {mode: metrics["modes"][mode]["quality"]["category 1"] for mode in ("recall", "deep")}
    row = next(line for line in report.split("## deep − recall")[1].splitlines() if line.startswith("| category 1 |"))
    assert row.split(" | ")[3] == f"{quality['deep']['R@10'] - quality['recall']['R@10']:+.2f}"  # deep less recall
    assert "<!-- bench:start -->" in readme.read_text()
    rescored = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rescore.py"), "--messages", str(messages),
         "--questions", str(questions), str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert rescored.returncode == 0, rescored.stdout + rescored.stderr


def test_bench_without_the_plotting_library_writes_everything_else_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The plots need the bench extra (matplotlib); a run without it must not throw the run away."""
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing it fails
    messages, questions = write_dataset(tmp_path)
    out = tmp_path / "out"
    code = main(["bench", "--messages", str(messages), "--questions", str(questions), "--mode", "bm25,vector",
                 "--out", str(out), "--embedding-model", "hash", "--mcp-sample", "0"])  # fmt: skip
    assert code == 0
    assert "deep − recall" not in (out / "report.md").read_text()
    for name in ("report.md", "metrics.json", "rankings-bm25.jsonl", "rankings-vector.jsonl"):
        assert (out / name).stat().st_size > 0
    assert not list(out.glob("*.png"))
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if "matplotlib" in line)
    assert "mnemoplan[bench]" in warning and err.index(warning) < err.index("ingest")  # said before the work


def test_locomo_evidence_quirks_are_normalised() -> None:
    assert normalise_locomo_evidence(["D8:6; D9:17", "D:11:26", "D9:1 D4:4 D4:6", "D30:05", "D", "D30:5"]) == [
        "D8:6", "D9:17", "D11:26", "D9:1", "D4:4", "D4:6", "D30:5"]  # fmt: skip


def test_a_question_without_results_is_a_miss() -> None:
    q = Question("q", "c", "?", "1", ["D1:1", "D2:2"], [1, 2])
    assert question_metrics(q, [], {}) == {
        "R@1": 0.0, "R@5": 0.0, "any@5": 0.0, "R@10": 0.0, "any@10": 0.0, "R@25": 0.0, "session_R@10": 0.0}  # fmt: skip
    half = question_metrics(q, ["D9:9", "D1:1", "D1:1"], {"D1:1": 1, "D9:9": 9})
    assert half["R@1"] == 0.0 and half["R@5"] == 0.5 and half["session_R@10"] == 0.5


def test_abstain_mode_asks_each_question_of_its_own_and_another_conversation(tmp_path: Path) -> None:
    messages, questions = write_dataset(tmp_path)
    out = tmp_path / "abstain"
    code = main(["bench", "--messages", str(messages), "--questions", str(questions), "--mode", "abstain",
                 "--out", str(out), "--embedding-model", "hash", "--mcp-sample", "0"])  # fmt: skip
    assert code == 0
    rows = [json.loads(line) for line in (out / "abstain.jsonl").read_text().splitlines()]
    assert len(rows) == 4  # the question without evidence is excluded, as in every mode
    assert {r["half"] for r in rows} == {"fit", "held_out"}
    for r in rows:
        assert 0.0 <= r["own"]["confidence"] <= 1.0 and 0.0 <= r["other"]["confidence"] <= 1.0
    metrics = json.loads((out / "abstain.json").read_text())["abstain"]
    assert 0.0 <= metrics["all"]["auroc"] <= 1.0
    assert "weights" in metrics["refit_on_fit_half"]


def test_auroc_counts_ties_half() -> None:
    from mnemoplan.bench.abstain import auroc

    assert auroc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auroc([0.1], [0.9]) == 0.0
    assert auroc([0.5], [0.5]) == 0.5


def test_questions_with_asked_at_are_asked_when_their_turn_comes(tmp_path: Path) -> None:
    """Mid-conversation: only the turns before the asking one are in memory when it is asked."""
    data = tmp_path / "realmem-like"
    data.mkdir()
    turns = [("c1", 1, "D1:1", "User", "My bike is a blue Brompton"), ("c1", 1, "D1:2", "Assistant", "Nice folding bike!"),
             ("c1", 2, "D2:1", "User", "I sold the Brompton and bought a red Trek"),
             ("c1", 2, "D2:2", "Assistant", "Enjoy the Trek."), ("c1", 3, "D3:1", "User", "Which bike do I ride?")]
    (data / "messages.jsonl").write_text("".join(json.dumps(
        {"conv_id": c, "session": s, "dia_id": d, "speaker": sp, "text": t, "timestamp": f"2024-01-0{s}"}) + "\n"
        for c, s, d, sp, t in turns))  # fmt: skip
    (data / "questions.jsonl").write_text("".join(json.dumps(
        {"conv_id": "c1", "qid": q, "question": text, "answer": "", "category": "x", "evidence": ev, "asked_at": at})
        + "\n" for q, text, ev, at in [("q1", "Which bike do I have?", ["D1:1"], "D2:1"),
                                       ("q2", "Which bike do I ride?", ["D2:1"], "D3:1")]))  # fmt: skip
    out = tmp_path / "out"
    assert main(["bench", "--dataset", str(data), "--mode", "all", "--out", str(out),
                 "--embedding-model", "hash", "--mcp-sample", "0"]) == 0  # fmt: skip
    for mode in ("recall", "deep", "bm25", "vector", "fusion"):
        rows = {r["qid"]: r["ranked"] for r in map(json.loads, (out / f"rankings-{mode}.jsonl").read_text().splitlines())}
        assert set(rows["q1"]) <= {"D1:1", "D1:2"}  # asked before D2:1 was said
        assert "D3:1" not in rows["q2"]  # the asking turn itself is not in memory
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["remember"]["messages"] == 4 and metrics["questions"] == 2
    assert "fusion" in metrics["modes"] and "p99" in metrics["remember"]["all"]
    assert main(["bench", "--dataset", str(data), "--mode", "recall", "--out", str(tmp_path / "one"),
                 "--embedding-model", "hash", "--mcp-sample", "0", "--questions-per-conversation", "1"]) == 0
    assert json.loads((tmp_path / "one" / "metrics.json").read_text())["remember"]["messages"] == 2


def test_a_bench_off_a_terminal_logs_its_progress_now_and_then(capsys: pytest.CaptureFixture[str]) -> None:
    from mnemoplan.bench.progress import Progress

    quiet = Progress("build", 10, unit="msg", every_s=10**6)  # nothing before its interval has passed
    quiet.advance(3)
    quiet.close()
    assert capsys.readouterr().err == ""
    every = Progress("build", 10, unit="msg", every_s=0)  # pytest's stderr is no terminal
    every.advance(4)
    every.advance(6)
    every.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("build: 4/10 msg, ") and " msg/s, ~" in lines[0]
    assert lines[0].endswith(" left") and lines[1].startswith("build: 10/10 msg, ") and "left" not in lines[1]
