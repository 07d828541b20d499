"""Session summaries (episodes) made on the write path: a long session is summarised stretch
by stretch, so a summary's cost does not grow with the session, and every message belongs to
one summary."""

from __future__ import annotations

import json

import pytest

from mnemoplan.ingest.pipeline import IngestConfig
from mnemoplan.storage.ledger import Summary, UserLedger
from mnemoplan.model import MessageIn
from mnemoplan.service.service import MemoryService


def ledger_of(session: str, n: int, *summaries: Summary) -> UserLedger:
    ledger = UserLedger()
    ledger.session_messages[session] = [(i, f"m{i}") for i in range(n)]
    ledger.summaries[session] = {s.id: s for s in summaries}
    return ledger


def spans(stretches: list[tuple[int, list[str]]]) -> list[tuple[int, int]]:
    """Each stretch as [first, last + 1) in message numbers (ids are m<number>)."""
    for place, ids in stretches:
        assert ids[0] == f"m{place}"
    return [(int(ids[0][1:]), int(ids[-1][1:]) + 1) for _, ids in stretches]


def new(start: int, n: int) -> list[str]:
    return [f"m{i}" for i in range(start, start + n)]


def test_the_newest_stretch_is_summarised_again_until_it_is_full() -> None:
    ledger = ledger_of("s", 30, Summary("e", "m0", "m29", 30))
    assert ledger.to_summarise("s", new(30, 9), every=10, span=100) == ([], [])  # 9 new: not yet
    stretches, replaced = ledger.to_summarise("s", new(30, 10), every=10, span=100)
    assert spans(stretches) == [(0, 40)] and replaced == ["e"]


def test_a_full_stretch_stays_and_the_next_one_begins_after_it() -> None:
    ledger = ledger_of("s", 100, Summary("e", "m0", "m99", 100))
    stretches, replaced = ledger.to_summarise("s", new(100, 10), every=10, span=100)
    assert spans(stretches) == [(100, 110)] and replaced == []


def test_many_messages_at_once_are_summarised_in_stretches() -> None:
    ledger = ledger_of("s", 0)
    stretches, replaced = ledger.to_summarise("s", new(0, 250), every=10, span=100)
    assert spans(stretches) == [(0, 100), (100, 200), (200, 250)] and replaced == []


def test_a_stretch_left_without_a_summary_is_summarised_again() -> None:
    """A forget deletes the summary of the stretch it touched; the rest of that stretch is
    summarised anew with the next summary of the session."""
    ledger = ledger_of("s", 150, Summary("b", "m100", "m149", 50))  # m0-m99 lost theirs
    stretches, replaced = ledger.to_summarise("s", new(150, 10), every=10, span=100)
    assert spans(stretches) == [(0, 100), (100, 160)] and replaced == ["b"]
    ledger = ledger_of("s", 280, Summary("a", "m0", "m99", 100), Summary("c", "m250", "m279", 30))
    stretches, replaced = ledger.to_summarise("s", new(280, 10), every=10, span=100)  # m100-m249 lost theirs
    assert spans(stretches) == [(100, 200), (200, 250), (250, 290)] and replaced == ["c"]


def test_a_summary_from_before_stretches_covers_the_start_of_its_session() -> None:
    ledger = ledger_of("s", 150, Summary("old", "", "", 150))  # no first or last: the first 150
    stretches, replaced = ledger.to_summarise("s", new(150, 10), every=10, span=100)
    assert spans(stretches) == [(150, 160)] and replaced == []
    ledger = ledger_of("s", 40, Summary("old", "", "", 40))
    stretches, replaced = ledger.to_summarise("s", new(40, 10), every=10, span=100)
    assert spans(stretches) == [(0, 50)] and replaced == ["old"]


# -- through the service, on real stores ----------------------------------------------------


def summaries(svc: MemoryService, user: str = "u") -> list[dict]:
    """The session summaries the write path made, in session order of their first message."""
    log = svc.store.log
    rows = log.select(f"user_id = '{user}' AND kind = 'episode'", ["id", "text", "derived_from", "metadata"])
    made = [r for r in rows if json.loads(r["metadata"]).get("summarizer")]
    order = {r["id"]: r["seq"] for r in log.select(f"user_id = '{user}' AND kind = 'message'", ["id", "seq"])}
    return sorted(made, key=lambda r: order[r["derived_from"][0]])


def messages(svc: MemoryService, user: str = "u") -> list[str]:
    rows = svc.store.log.select(f"user_id = '{user}' AND kind = 'message'", ["id", "seq"])
    return [r["id"] for r in sorted(rows, key=lambda r: r["seq"])]


def say(svc: MemoryService, first: int, n: int) -> list[str]:
    ids = []
    for i in range(first, first + n):  # one per call, as an agent loop writes them
        turn = MessageIn(content=f"Note {i}: the garden needs {i} more tulips.", speaker="Ann")
        ids += svc.remember(messages=[turn], user_id="u", session_id="s").ids
    return ids


@pytest.fixture
def small_stretches(service: MemoryService) -> MemoryService:
    service.ingestor.config = IngestConfig(episode_every=5, episode_span=20)
    return service


def test_a_long_session_is_summarised_in_stretches_that_cover_each_message_once(
    small_stretches: MemoryService,
) -> None:
    svc = small_stretches
    say(svc, 0, 57)
    made = summaries(svc)
    assert [len(r["derived_from"]) for r in made] == [20, 20, 15]  # 56 and 57 wait for the next
    assert [rid for r in made for rid in r["derived_from"]] == messages(svc)[:55]
    assert "(Ann; 20 messages)" in made[0]["text"] and "(Ann; messages 21-40)" in made[1]["text"]


def test_a_forget_inside_a_finished_stretch_is_summarised_again_later(small_stretches: MemoryService) -> None:
    svc = small_stretches
    ids = say(svc, 0, 45)
    svc.forget(ids=[ids[3]], user_id="u")
    assert [len(r["derived_from"]) for r in summaries(svc)] == [20, 5]  # the first stretch's summary went
    say(svc, 45, 5)
    made = summaries(svc)
    assert [rid for r in made for rid in r["derived_from"]] == messages(svc)
    assert ids[3] not in {rid for r in made for rid in r["derived_from"]}


def test_messages_stored_after_the_ledger_was_dropped_are_listed_once(
    small_stretches: MemoryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget drops the write path's ledger; a remember that read it before, and appends
    after, leaves the reload to list its messages (noting them as well listed them twice, and
    the next summary held a message twice)."""
    svc = small_stretches
    say(svc, 0, 7)
    append = svc.store.append

    def after_a_forget(*args: object, **kwargs: object) -> object:
        svc.store.drop_ledger("u")  # as a forget does
        return append(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(svc.store, "append", after_a_forget)
    svc.remember(messages=[MessageIn(content="Two more tulips.", speaker="Ann"),
                           MessageIn(content="And a rose.", speaker="Ann")], user_id="u", session_id="s")  # fmt: skip
    monkeypatch.setattr(svc.store, "append", append)
    listed = [rid for _, rid in svc.store.ledger("u").session_messages["s"]]
    assert listed == messages(svc)
    say(svc, 9, 1)
    assert [rid for r in summaries(svc) for rid in r["derived_from"]] == messages(svc)


def test_a_users_own_episode_is_not_replaced_by_a_summary(service: MemoryService) -> None:
    own = service.remember(content="Our Lisbon trip, as I would sum it up.", kind="episode", user_id="u",
                           session_id="s", metadata={"summarizer": "me"}).ids  # fmt: skip
    say(service, 0, 12)
    texts = [r["text"] for r in service.store.log.select("user_id = 'u' AND kind = 'episode'", ["text"])]
    assert service.store.log.count(f"id = '{own[0]}'") == 1 and len(texts) == 2
