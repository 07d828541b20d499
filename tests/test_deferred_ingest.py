"""remember off the caller's path: accepted durably, findable at once, stored in order, nothing lost."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from mnemoplan.ingest.deferred import MAX_BATCH
from mnemoplan.model import MessageIn, Record
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.inbox import Inbox
from mnemoplan.service.service import MemoryService
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


def test_one_users_large_import_does_not_hold_up_another_users_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        order: list[tuple[str, int]] = []
        real = service.ingestor.store_prepared

        def store_prepared(user_id: str, fresh: list[Record], *args: Any, **kwargs: Any) -> Any:
            order.append((user_id, len(fresh)))
            return real(user_id, fresh, *args, **kwargs)

        monkeypatch.setattr(service.ingestor, "store_prepared", store_prepared)
        with service.store.locks.write:  # the worker takes the import's first batch, and waits here
            for part in range(3):  # a batch each (a batch holds whole calls, up to MAX_BATCH records)
                rows = [MessageIn(content=f"row {part}-{i} of the imported ledger: invoice {i} paid", speaker="user")
                        for i in range(MAX_BATCH)]  # fmt: skip
                service.remember(messages=rows, user_id="importer", session_id="import")
            service.remember(content="Pick up the dry cleaning on Thursday", user_id="other")
        assert service.deferred is not None
        service.deferred.wait(stored=True)
        assert order == [("importer", MAX_BATCH), ("other", 1), ("importer", MAX_BATCH), ("importer", MAX_BATCH)]
    finally:
        service.close()


def test_a_slow_accept_of_one_user_holds_up_no_other_users_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        real = service.ingestor.prepare
        inside, release, prepared = threading.Event(), threading.Event(), threading.Event()

        def prepare(user_id: str, *args: Any, **kwargs: Any) -> Any:
            if user_id == "slow":  # as a first call of a large user, reading its ledger from the log
                inside.set()
                release.wait(300)  # the bound only ends a wait that should not happen
                prepared.set()
            return real(user_id, *args, **kwargs)

        monkeypatch.setattr(service.ingestor, "prepare", prepare)
        slow = threading.Thread(target=service.remember, kwargs={"content": "Note from the slow one", "user_id": "slow"})
        slow.start()
        try:
            assert inside.wait(300)
            other = service.remember(content="The plumber comes at nine on Monday", user_id="other")
            found = service.recall("when does the plumber come", user_id="other")
            assert not prepared.is_set(), "the other user's calls waited for the slow one"
            assert other.ids[0] in [i.id for i in found.items]
        finally:
            release.set()
            slow.join()
        assert service.deferred is not None
        service.deferred.wait(stored=True)
        assert len(service.store.log.ids(RecordFilter("slow"))) == 1
    finally:
        service.close()


def test_close_stores_a_call_still_being_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    service = make_service(data, remember_in_background=True)
    assert service.deferred is not None
    inside, closing = threading.Event(), threading.Event()
    real_prepare, real_wait_idle = service.ingestor.prepare, service.deferred._accepting.wait_idle

    def prepare(*args: Any, **kwargs: Any) -> Any:
        inside.set()
        closing.wait(300)  # until close waits for this call (the bound only ends a wait that should not happen)
        return real_prepare(*args, **kwargs)

    def wait_idle() -> None:
        closing.set()
        real_wait_idle()

    monkeypatch.setattr(service.ingestor, "prepare", prepare)
    monkeypatch.setattr(service.deferred._accepting, "wait_idle", wait_idle)
    answers: list[Any] = []
    late = threading.Thread(target=lambda: answers.append(
        service.remember(content="The spare key is with the neighbour at number 12", user_id="u")))
    late.start()
    assert inside.wait(300)  # past the check that refuses calls once closing
    service.close()
    late.join()
    assert answers, "the call being accepted failed"
    again = make_service(data, remember_in_background=True)
    try:
        assert again.store.log.ids(RecordFilter("u")) == answers[0].ids  # stored before the close ended
        assert not list((data / "inbox").glob("*.json"))
    finally:
        again.close()


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
        service.settle()
        assert record.id in service.store.log.ids(RecordFilter("u"))
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


class HeldWorker:
    """Keeps the worker from storing a user's calls (it waits for the user's write lock) until released."""

    def __init__(self, service: MemoryService, user: str) -> None:
        self._held, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(service, user))

    def _hold(self, service: MemoryService, user: str) -> None:
        with service.store.writing(user):
            self._held.set()
            self._release.wait()

    def __enter__(self) -> HeldWorker:
        self._thread.start()
        self._held.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join()


def in_thread(call: Callable[[], Any]) -> Any:
    """``call()`` on another thread; its result, or a failure if it is still blocked after a minute
    (a call that waits for the held worker would never return)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert out, "the call waited for the worker"
    return out[0]


def test_recall_does_not_wait_for_accepted_messages_and_finds_them_by_their_words(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        stored = service.remember(content="The build server is called falconridge", user_id="u", session_id="old").ids
        service.settle()
        with HeldWorker(service, "u"):
            said = service.remember(content="Our staging database runs on host kestrel-7", user_id="u",
                                    session_id="s1").ids  # fmt: skip
            assert service.deferred is not None and service.deferred.pending("u") == 1
            result = in_thread(lambda: service.recall("which host runs the staging database", user_id="u"))
            found = {i.id: i for i in result.items}
            assert said[0] in found and found[said[0]].text == "Our staging database runs on host kestrel-7"
            assert found[said[0]].session_id == "s1" and found[said[0]].confidence > 0.5  # its words match
            other = in_thread(lambda: service.recall("what is the build server called", user_id="u"))
            assert other.items[0].id == stored[0]  # what was stored is searched as ever
        service.settle()
        assert said[0] in service.store.log.ids(RecordFilter("u"))
    finally:
        service.close()


def test_the_callers_own_session_is_neither_waited_for_nor_returned(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        with HeldWorker(service, "u"):
            service.remember(content="The quarterly report goes to Nadia on Friday", user_id="u", session_id="now")
            result = in_thread(lambda: service.recall("who gets the quarterly report", user_id="u", session_id="now"))
            assert result.items == []
            result = in_thread(lambda: service.recall("who gets the quarterly report", user_id="u",
                                                      session_id="now", include_session=True))  # fmt: skip
            assert [i.text for i in result.items] == ["The quarterly report goes to Nadia on Friday"]
    finally:
        service.close()


def test_a_store_that_fails_is_retried_at_once_and_said_meanwhile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        real = service.ingestor.store_prepared
        failing = threading.Event()
        failing.set()
        tried = threading.Semaphore(0)

        def store_prepared(*args: Any, **kwargs: Any) -> Any:
            tried.release()
            if failing.is_set():
                raise OSError(28, "No space left on device")
            return real(*args, **kwargs)

        monkeypatch.setattr(service.ingestor, "store_prepared", store_prepared)
        message = [MessageIn(content="The wifi password at the cabin is larch-and-fern", speaker="user",
                             occurred_at=SAID)]  # fmt: skip
        first = service.remember(messages=message, user_id="u", session_id="s")
        tried.acquire()
        tried.acquire()  # failed, and tried again without a restart
        assert service.deferred is not None
        service.deferred.wait("u")  # a failed store waits for its retry: readers do not wait for it
        result = service.recall("what is the wifi password at the cabin", user_id="u")
        assert [i.id for i in result.items] == first.ids  # found by its words meanwhile
        assert any("not stored yet" in w for w in result.warnings)
        again = service.remember(messages=message, user_id="u", session_id="s")  # the client retries
        assert again.ids == first.ids and again.duplicates == 1
        assert any("not stored yet" in w for w in again.warnings)
        failing.clear()
        service.deferred.wait("u", stored=True)
        assert service.store.log.ids(RecordFilter("u", kinds=("message",))) == first.ids  # once
        assert not list((tmp_path / "data" / "inbox").glob("*.json"))
        assert service.recall("wifi password", user_id="u").warnings == []
    finally:
        service.close()


def test_forget_reaches_accepted_messages_whose_store_keeps_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    service = make_service(data, remember_in_background=True)
    try:
        tried = threading.Semaphore(0)

        def store_prepared(*args: Any, **kwargs: Any) -> Any:
            tried.release()
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(service.ingestor, "store_prepared", store_prepared)
        kept = service.remember(content="the alarm code is 2231", user_id="u", session_id="a").ids
        gone = service.remember(content="my bank PIN is 9044", user_id="u", session_id="b").ids
        tried.acquire()
        receipt = service.forget(ids=gone, user_id="u")
        assert receipt.ids == gone and receipt.removed == 1
        assert service.deferred is not None and [r.id for r in service.deferred.waiting("u")] == kept
        assert not any("9044" in p.read_text() for p in (data / "inbox").glob("*.json"))
        assert service.forget(scope="session", session_id="a", user_id="u").ids == kept
        assert service.recall("alarm code", user_id="u").items == []
    finally:
        service.close()


def test_a_question_about_the_askers_attribute_waits_for_what_may_change_it(tmp_path: Path) -> None:
    service = make_service(tmp_path / "data", remember_in_background=True)
    try:
        said = [MessageIn(content="I live in Utrecht and the rent is wild", speaker="user", occurred_at=SAID)]
        service.remember(messages=said, user_id="u", session_id="s1")
        service.settle()
        assert service.deferred is not None
        waits, real_wait = threading.Event(), service.deferred.wait

        def wait(*args: Any, **kwargs: Any) -> None:
            waits.set()
            real_wait(*args, **kwargs)

        service.deferred.wait = wait  # type: ignore[method-assign]
        with HeldWorker(service, "u"):
            moved = [MessageIn(content="update: we moved to Rotterdam! new place is near the park", speaker="user",
                               occurred_at=SAID.replace(month=6))]  # fmt: skip
            service.remember(messages=moved, user_id="u", session_id="s2")
            answer: list[Any] = []
            asking = threading.Thread(target=lambda: answer.append(service.recall("where do I live these days?",
                                                                                  user_id="u", limit=5)))  # fmt: skip
            asking.start()
            waits.wait()  # it waits for the worker, which the test holds
        asking.join()
        first = answer[0].items[0]
        assert "Rotterdam" in first.text and first.current
        assert all(not i.current for i in answer[0].items if "Utrecht" in i.text and "Rotterdam" not in i.text)
    finally:
        service.close()
