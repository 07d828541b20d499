"""remember off the caller's path: accepted durably, findable at once, stored in order, nothing lost."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

from mnemoplan.model import MessageIn, Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.inbox import Inbox
from tests.conftest import make_service

SAID = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def test_what_remember_acknowledged_is_found_by_the_next_recall(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        ids = service.remember(content="The staging database lives on host kestrel-7", user_id="u").ids
        hits = service.recall("which host is the staging database on", user_id="u").items
        assert ids[0] in [h.id for h in hits]
    finally:
        service.close()


def test_a_retry_while_the_first_call_waits_is_a_repeat_and_stored_once(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        message = [MessageIn(content="I prefer window seats", speaker="user", occurred_at=SAID)]
        with service.store.writing("u"):  # the worker cannot store this user's calls meanwhile
            first = service.remember(messages=message, user_id="u", session_id="s")
            again = service.remember(messages=message, user_id="u", session_id="s")
            assert service.deferred is not None and service.deferred.pending("u") == 1
        assert again.ids == first.ids and again.duplicates == 1
        service.settle()
        stored = service.store.log.ids(RecordFilter("u", kinds=("message",)))
        assert stored == first.ids
    finally:
        service.close()


def test_calls_are_stored_in_the_order_they_were_accepted(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        ids = [service.remember(content=f"step {i} of the migration is done", user_id="u", session_id="s").ids[0]
               for i in range(12)]  # fmt: skip
        service.settle()
        records = service.store.log.get("u", ids)
        seqs = [records[i].seq for i in ids]
        assert seqs == sorted(seqs)
        assert [records[i].prev_id for i in ids[1:]] == ids[:-1]  # each turn leans on the one before
    finally:
        service.close()


def test_forget_reaches_a_message_still_waiting_to_be_stored(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        release = threading.Event()
        held = threading.Event()

        def hold() -> None:
            with service.store.writing("u"):
                held.set()
                release.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        rid = service.remember(content="my locker code is 4417", user_id="u").ids[0]
        release.set()  # forget waits for the accepted call, then deletes it
        receipt = service.forget(ids=[rid], user_id="u")
        holder.join()
        assert receipt.removed == 1
        assert service.recall("locker code", user_id="u").items == []
    finally:
        service.close()


def test_messages_accepted_before_a_crash_are_stored_at_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = make_service(data, remember_in_background=True)
    service.close()
    # What remember leaves when the process dies after acknowledging a call.
    record = Record(id="a" * 32, user_id="u", session_id="s", kind="message", speaker="user",
                    text="The offsite is booked at the Lisbon lighthouse hotel", occurred_at=SAID,
                    created_at=SAID, content_hash="h" * 64)  # fmt: skip
    Inbox(data / "inbox").put("u", "s", [record])
    service = make_service(data, remember_in_background=True)
    try:
        hits = service.recall("where is the offsite booked", user_id="u").items
        assert record.id in [h.id for h in hits]
        assert not list((data / "inbox").glob("*.json"))
    finally:
        service.close()


def test_a_forgotten_user_leaves_no_accepted_text_behind(tmp_path: Path) -> None:
    data = tmp_path / "data"
    service = make_service(data, remember_in_background=True)
    try:
        service.remember(content="my passport number is X1234567", user_id="u")
        service.forget(scope="user", user_id="u")
        assert not list((data / "inbox").glob("*"))
        assert service.recall("passport", user_id="u").items == []
    finally:
        service.close()
