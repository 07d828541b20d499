"""Importers on small fixtures shaped like each tool's real export: counts, times, speakers,
re-imports that add nothing, and bad records reported by position and skipped."""

from __future__ import annotations

import os
import shutil
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mnemoplan.errors import InvalidInput
from mnemoplan.model.scope import RecordFilter
from mnemoplan.service.browse import MemoryBrowser
from mnemoplan.service.service import MemoryService
from mnemoplan.transfer.importer import import_file
from mnemoplan.transfer.sources import sniff

FIXTURES = Path(__file__).parent / "fixtures" / "transfer"


def messages_of(service: MemoryService, user: str, session: str) -> list[dict]:
    return MemoryBrowser(service.store).messages(user, session).items


def test_chatgpt_export_follows_the_branch_the_user_saw(service: MemoryService) -> None:
    path = FIXTURES / "chatgpt_conversations.json"
    assert sniff(path) == "chatgpt"
    summary = import_file(service, path, user_id="u1")
    assert summary.conversations == 2  # the third record has no mapping
    assert any(s.startswith("conversation 1") and "mapping" in s for s in summary.skipped)
    assert any("message m2" in s and "time" in s for s in summary.skipped)  # a broken time: that message only
    trip = messages_of(service, "u1", "chatgpt:6630a1b2-0000-4000-8000-000000000001")
    assert [m["speaker"] for m in trip] == ["user", "assistant", "user", "assistant"]
    assert "regenerated" not in " ".join(m["text"] for m in trip)  # the abandoned branch is not imported
    assert trip[0]["occurred_at"] == datetime.fromtimestamp(1714557610.25, UTC).isoformat()
    assert trip[2]["text"] == "Here is our hotel; is it near the river?"  # the image part is left out
    assert trip[0]["source_id"] == "u-1"
    bread = messages_of(service, "u1", "chatgpt:6630a1b2-0000-4000-8000-000000000002")
    assert [m["source_id"] for m in bread] == ["m1", "m3"]
    assert summary.stored == 6 and summary.duplicates == 0

    again = import_file(service, path, user_id="u1")
    assert again.stored == 0 and again.duplicates == 6
    assert service.store.log.count(RecordFilter("u1", kinds=("message",))) == 6


def test_chatgpt_zip_is_read_in_place(service: MemoryService, tmp_path: Path) -> None:
    archive = tmp_path / "chatgpt-export.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(FIXTURES / "chatgpt_conversations.json", "conversations.json")
        z.writestr("chat.html", "<html></html>")
    assert sniff(archive) == "chatgpt"
    summary = import_file(service, archive, user_id="u1")
    assert summary.stored == 6


def test_claude_export(service: MemoryService) -> None:
    path = FIXTURES / "claude_conversations.json"
    assert sniff(path) == "claude"
    summary = import_file(service, path, user_id="u2")
    assert summary.conversations == 1
    assert any(s.startswith("conversation 1") for s in summary.skipped)
    assert any("message 2" in s and "sender" in s for s in summary.skipped)
    msgs = messages_of(service, "u2", "claude:0b7c1d2e-1111-4aaa-8bbb-000000000001")
    assert [m["speaker"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["text"].startswith("For 12 km")  # read from the content blocks when text is empty
    assert msgs[2]["occurred_at"] == "2024-03-12T18:00:00+00:00"
    assert import_file(service, path, user_id="u2").stored == 0


def test_mcp_memory_graph(service: MemoryService) -> None:
    path = FIXTURES / "mcp_memory.jsonl"
    assert sniff(path) == "mcp-memory"
    summary = import_file(service, path, user_id="u3")
    assert sorted(s.split(":")[0] for s in summary.skipped) == ["line 4", "line 5"]
    john = messages_of(service, "u3", "mcp-memory:John_Smith")
    assert {m["kind"] for m in john} == {"fact"}
    texts = sorted(m["text"] for m in john)
    assert texts == ["John Smith (person): Graduated in 2019", "John Smith (person): Speaks fluent Spanish",
                     "John Smith owns Rex", "John Smith works at Anthropic"]
    assert summary.stored == 5
    assert import_file(service, path, user_id="u3").stored == 0


def test_generic_jsonl(service: MemoryService) -> None:
    path = FIXTURES / "messages.jsonl"
    assert sniff(path) == "jsonl"
    summary = import_file(service, path, user_id="u4")
    assert summary.skipped == ["line 5: needs conv_id, session and text"]
    one = messages_of(service, "u4", "c1:1")
    assert [m["source_id"] for m in one] == ["D1:1", "D1:2", "D1:3"]
    assert one[2]["occurred_at"] == "2023-05-08T13:56:00+00:00"  # no timestamp: its session's first
    two = messages_of(service, "u4", "c1:2")
    assert two[0]["text"] == "Look at the bowl I made. [image: a blue ceramic bowl]"
    assert import_file(service, path, user_id="u4").stored == 0


def test_markdown_folder(service: MemoryService, tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    shutil.copytree(FIXTURES / "notes", folder)
    stamp = datetime(2024, 6, 1, 12, 0, tzinfo=UTC).timestamp()
    os.utime(folder / "projects" / "reading.md", (stamp, stamp))
    assert sniff(folder) == "markdown"
    summary = import_file(service, folder, user_id="u5")
    assert [s.split(":")[0] for s in summary.skipped] == ["broken.md"]
    garden = messages_of(service, "u5", "notes:garden.md")
    assert [m["text"].splitlines()[0] for m in garden] == ["# Tomatoes", "## Watering"]
    assert garden[0]["occurred_at"] == "2024-04-02T00:00:00+00:00"  # the front matter's date
    reading = messages_of(service, "u5", "notes:projects/reading.md")
    assert reading[0]["occurred_at"] == "2024-06-01T12:00:00+00:00"  # the file's modification time
    assert import_file(service, folder, user_id="u5").stored == 0


def test_a_long_message_is_stored_in_parts(service: MemoryService, tmp_path: Path) -> None:
    text = "\n\n".join(f"Paragraph {i} " + "word " * 200 for i in range(60))  # over the 32,000 characters
    path = tmp_path / "messages.jsonl"
    path.write_text('{"conv_id": "c", "session": 1, "dia_id": "x", "speaker": "A", "text": %s}\n'
                    % __import__("json").dumps(text))  # fmt: skip
    summary = import_file(service, path, user_id="u6")
    assert summary.skipped == [] and summary.stored >= 2
    parts = messages_of(service, "u6", "c:1")
    assert "".join(m["text"] for m in parts).replace("\n", "") == text.replace("\n", "")


def test_unknown_and_broken_files(service: MemoryService, tmp_path: Path) -> None:
    odd = tmp_path / "odd.json"
    odd.write_text('{"hello": 1}')
    with pytest.raises(InvalidInput):
        import_file(service, odd)
    broken = tmp_path / "conversations.json"
    broken.write_text('[{"title": "t", "mapping": {}}, {"title": ')
    with pytest.raises(InvalidInput, match="not valid JSON after element 0"):
        import_file(service, broken, fmt="chatgpt")


def test_the_import_command_prints_a_summary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from mnemoplan.cli.main import main

    monkeypatch.setenv("MNEMOPLAN_EMBEDDING_MODEL", "hash")
    data = str(tmp_path / "data")
    assert main(["import", "--data-dir", data, "--user", "me", str(FIXTURES / "claude_conversations.json")]) == 0
    out = capsys.readouterr().out
    assert "imported claude for user 'me': 1 conversation(s), 3 message(s)" in out
    assert "3 stored, 0 already in memory" in out
    assert "2 record(s) skipped:" in out and "conversation 1" in out
    assert main(["import", "--data-dir", data, "--user", "me", str(FIXTURES / "claude_conversations.json")]) == 0
    assert "0 stored, 3 already in memory" in capsys.readouterr().out
