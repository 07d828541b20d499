"""The export holds everything needed to rebuild memory: import it into an empty store and
recall answers as before; what was forgotten is not in it."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemoplan.cli.main import main
from mnemoplan.model import MessageIn
from mnemoplan.service.browse import MemoryBrowser
from mnemoplan.service.service import MemoryService
from mnemoplan.transfer.export import write_export
from mnemoplan.transfer.importer import import_file
from tests.conftest import make_service

START = datetime(2024, 1, 5, 9, 0, tzinfo=UTC)
SESSIONS = [
    ["I adopted a beagle called Rufus.", "He loves the beach at Cascais.", "My sister Ana lives in Porto.",
     "I work as a nurse at the city hospital.", "We plan a trip to Madeira in May."],
    ["I moved to Lisbon last spring.", "Rufus is scared of thunder.", "I started learning the cello.",
     "Ana is getting married in October.", "I do not eat meat any more."],
    ["Actually I now live in Braga.", "My cello teacher is called Marta.", "I switched to night shifts.",
     "Rufus turned three on Sunday.", "I bought a green gravel bike."],
]
QUERIES = ["Where do I live?", "What is my dog called?", "Who is Marta?", "When is Ana's wedding?", "bike"]


def fill(service: MemoryService, user: str = "alice") -> str:
    forgotten = ""
    for s, texts in enumerate(SESSIONS):
        msgs = [MessageIn(content=t, speaker="alice" if i % 2 == 0 else "bob", source_id=f"s{s}-{i}",
                          occurred_at=START + timedelta(days=30 * s, minutes=i)) for i, t in enumerate(texts)]  # fmt: skip
        result = service.remember(messages=msgs * 1, user_id=user, session_id=f"session-{s}")
        if s == 1:
            forgotten = result.ids[4]
    service.remember(content="Prefers tea to coffee", kind="fact", user_id=user, metadata={"source": "host"})
    service.remember(content="Bob's own memory", user_id="bob", session_id="b")
    service.forget(ids=[forgotten], user_id=user)
    return forgotten


def export_text(service: MemoryService, users: list[str]) -> str:
    out = io.StringIO()
    write_export(service, out, users)
    return out.getvalue()


def test_export_round_trip_gives_the_same_recall(tmp_path: Path) -> None:
    source = make_service(tmp_path / "a")
    try:
        forgotten = fill(source)
        text = export_text(source, ["alice"])
        before = {q: source.recall(q, user_id="alice", reference_time=START + timedelta(days=90)) for q in QUERIES}
        facts_before = MemoryBrowser(source.store).facts("alice").as_dict()
        sessions_before = MemoryBrowser(source.store).sessions("alice").as_dict()
    finally:
        source.close()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["type"] == "mnemoplan-export" and lines[0]["users"] == ["alice"]
    assert all(row["user_id"] == "alice" for row in lines[1:])  # bob's memory is not in alice's export
    assert forgotten not in text and "I do not eat meat" not in text  # forgotten: in no export
    assert any(row["kind"] == "fact" and row["derived_from"] for row in lines[1:])  # derived facts, with sources
    path = tmp_path / "alice.jsonl"
    path.write_text(text, encoding="utf-8")

    target = make_service(tmp_path / "b")
    try:
        summary = import_file(target, path)
        assert summary.format == "mnemoplan" and summary.stored == len(lines) - 1 and summary.skipped == []
        for q in QUERIES:
            after = target.recall(q, user_id="alice", reference_time=START + timedelta(days=90))
            assert [(i.id, i.text) for i in after.items] == [(i.id, i.text) for i in before[q].items], q
            assert [i.score for i in after.items] == pytest.approx([i.score for i in before[q].items], abs=1e-4)
            assert after.context == before[q].context
        assert MemoryBrowser(target.store).facts("alice").as_dict() == facts_before
        assert MemoryBrowser(target.store).sessions("alice").as_dict() == sessions_before
        again = import_file(target, path)
        assert again.stored == 0 and again.duplicates == len(lines) - 1
        volatile = ("seq", "access_count", "last_accessed_at")  # the log's numbering, and recalls since

        def kept(rows: str) -> list[dict]:
            return [{k: v for k, v in json.loads(r).items() if k not in volatile} for r in rows.splitlines()[1:]]

        assert kept(export_text(target, ["alice"])) == kept(text)
    finally:
        target.close()


def test_an_export_with_vectors_is_imported_without_embedding_and_ranks_exactly_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_service(tmp_path / "a")
    try:
        fill(source)
        out = io.StringIO()
        write_export(source, out, ["alice"], vectors=True)
        text = out.getvalue()
        before = {q: source.recall(q, user_id="alice", reference_time=START + timedelta(days=90)) for q in QUERIES}
        stored_before = {rec.id: (emb.tolist(), tokens) for rec, emb, tokens in MemoryBrowser(source.store).stored("alice")}
    finally:
        source.close()
    header = json.loads(text.splitlines()[0])
    assert header["vectors"] == {"model": "hash-384", "dim": 384}
    path = tmp_path / "alice.jsonl"
    path.write_text(text, encoding="utf-8")
    target = make_service(tmp_path / "b")
    try:
        def refuse(*args: object, **kwargs: object) -> None:
            raise AssertionError("an import of an export with vectors embedded a text")

        monkeypatch.setattr(target.ingestor.vectors, "embed", refuse)
        monkeypatch.setattr(target.ingestor.vectors, "embed_with_tokens", refuse)
        summary = import_file(target, path)
        assert summary.stored == len(text.splitlines()) - 1 and summary.skipped == [] and summary.notes == []
        stored_after = {rec.id: (emb.tolist(), tokens) for rec, emb, tokens in MemoryBrowser(target.store).stored("alice")}
        assert stored_after == stored_before  # every embedding and token matrix, to the bit
        for q in QUERIES:
            after = target.recall(q, user_id="alice", reference_time=START + timedelta(days=90))
            assert [(i.id, i.score) for i in after.items] == [(i.id, i.score) for i in before[q].items], q
    finally:
        target.close()
    other = make_service(tmp_path / "c", embedding_model="hash:64")  # another model: the text is embedded again
    try:
        summary = import_file(other, path)
        assert summary.stored == len(text.splitlines()) - 1 and "embedded again" in summary.notes[0]
        assert other.recall("What is my dog called?", user_id="alice").items
    finally:
        other.close()


def test_export_and_import_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("MNEMOPLAN_EMBEDDING_MODEL", "hash")
    service = make_service(tmp_path / "a")
    try:
        fill(service)
    finally:
        service.close()
    out = tmp_path / "all.jsonl"
    assert main(["export", "--data-dir", str(tmp_path / "a"), "--all", "-o", str(out)]) == 0
    assert json.loads(out.read_text().splitlines()[0])["users"] == ["alice", "bob"]
    assert main(["export", "--data-dir", str(tmp_path / "a")]) == 2  # neither --user nor --all
    assert main(["import", "--data-dir", str(tmp_path / "b"), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "imported mnemoplan" in printed and "0 already in memory" in printed
    assert main(["import", "--data-dir", str(tmp_path / "b"), str(out)]) == 0
    assert " 0 stored" in capsys.readouterr().out
    assert main(["import", "--data-dir", str(tmp_path / "b"), str(tmp_path / "missing.json")]) == 2
    with_vectors = tmp_path / "vectors.jsonl"
    assert main(["export", "--data-dir", str(tmp_path / "a"), "--all", "--vectors", "-o", str(with_vectors)]) == 0
    rows = [json.loads(line) for line in with_vectors.read_text().splitlines()]
    assert rows[0]["vectors"]["dim"] == 384 and all(r["embedding"] for r in rows[1:])
    assert main(["import", "--data-dir", str(tmp_path / "c"), str(with_vectors)]) == 0
    assert "0 already in memory" in capsys.readouterr().out
