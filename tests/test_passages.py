"""Long messages are searched by passage: a paragraph's match is found and shown as that passage."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemoplan.extract.passages import PASSAGE_MIN_CHARS, split_passages
from mnemoplan.model import MessageIn
from mnemoplan.model.scope import RecordFilter
from tests.conftest import make_service

FILLER = ("We compared several options for the weekly planning template and discussed how each one "
          "handles recurring tasks, reminders and shared calendars across the team. ")  # fmt: skip


def long_reply() -> str:
    paragraphs = [FILLER * 3 for _ in range(4)]
    paragraphs.insert(2, "For the backups, the cold storage bucket is named heron-archive-eu and rotates every 30 days.")
    return "\n\n".join(paragraphs)


def test_a_long_message_splits_into_passages_holding_all_its_words() -> None:
    text = long_reply()
    passages = split_passages(text)
    assert len(passages) > 1
    assert "".join(text.split()) == "".join("".join(passages).split())
    assert split_passages("short " * 10) == []
    assert len(text) >= PASSAGE_MIN_CHARS


def test_a_match_in_one_paragraph_is_shown_as_that_passage_with_its_message(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data")
    try:
        reply = long_reply()
        ids = service.remember(messages=[MessageIn(content="where do the backups go?", speaker="user", source_id="t1"),
                                         MessageIn(content=reply, speaker="assistant", source_id="t2")],
                               user_id="u", session_id="s").ids  # fmt: skip
        passages = service.store.log.select(RecordFilter("u", kinds=("passage",)), ["id", "derived_from"])
        assert len(passages) > 1 and all(list(p["derived_from"]) == [ids[1]] for p in passages)
        items = service.recall("heron-archive-eu cold storage bucket", user_id="u").items
        top = items[0]
        assert top.kind == "passage" and "heron-archive-eu" in top.text and len(top.text) < len(reply)
        assert top.derived_from == [ids[1]] and top.source_ids == ["t2"]
        # The message counts once: not the passage and the whole reply (or another passage) beside it.
        owners = [i.derived_from[0] if i.kind == "passage" else i.id for i in items]
        assert len(owners) == len(set(owners))
    finally:
        service.close()


def test_forgetting_a_long_message_forgets_its_passages(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data")
    try:
        rid = service.remember(content=long_reply(), speaker="assistant", user_id="u").ids[0]
        service.forget(ids=[rid], user_id="u")
        assert service.store.log.count(RecordFilter("u")) == 0
    finally:
        service.close()


@pytest.mark.slow
def test_passages_have_their_own_token_vectors(tmp_path: Path) -> None:
    """Token matching (and deep search's token rerank) reads stored tokens: a passage without
    them would leave the user's memories incomplete and every rerank embedding texts anew."""
    service = make_service(tmp_path / "data", embedding_model="all-MiniLM-L6-v2")
    try:
        service.remember(content=long_reply(), speaker="assistant", user_id="u")
        assert service.store.log.count(RecordFilter("u", kinds=("passage",))) > 1
        assert service.store.log.count_lacking_tokens("u") == 0
    finally:
        service.close()
