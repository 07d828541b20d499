"""Servers sharing one log in object storage (moto's S3 on loopback): each sees what the others wrote
and forgot, from its first call of a user on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemoplan.model import MessageIn
from mnemoplan.model.scope import RecordFilter
from mnemoplan.service.service import MemoryService
from tests.conftest import make_service
from tests.s3 import Bucket, moto_server, new_bucket


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def bucket(endpoint: str) -> Bucket:
    return new_bucket(endpoint)


def replica(tmp_path: Path, name: str, bucket: Bucket) -> MemoryService:
    return make_service(tmp_path / name, storage_uri=bucket.uri, storage_options=bucket.options)


def test_what_one_server_remembers_or_forgets_the_others_see_at_their_next_call(
    tmp_path: Path, bucket: Bucket
) -> None:
    a, b = replica(tmp_path, "a", bucket), replica(tmp_path, "b", bucket)
    try:
        assert a.store.log.shared and a.deferred is None  # stored before remember answers
        said = a.remember(content="The staging database runs on host kestrel-7", user_id="u").ids
        assert [i.id for i in b.recall("which host runs the staging database", user_id="u").items] == said
        more = b.remember(messages=[MessageIn(content="The build server is called falconridge", speaker="ops")],
                          user_id="u").ids  # fmt: skip
        assert more[0] in [i.id for i in a.recall("what is the build server called", user_id="u").items]
        a.forget(ids=said, user_id="u")
        assert said[0] not in [i.id for i in b.recall("staging database host kestrel", user_id="u").items]
        assert b.store.log.ids(RecordFilter("u", ids=tuple(said))) == []
        assert a.store.replica is not None and a.store.replica.refreshes >= 1
    finally:
        a.close()
        b.close()


def test_a_server_started_on_a_shared_log_rebuilds_a_user_at_first_touch(tmp_path: Path, bucket: Bucket) -> None:
    a = replica(tmp_path, "a", bucket)
    try:
        rid = a.remember(content="My locker code is 4417", user_id="u").ids[0]
    finally:
        a.close()
    b = replica(tmp_path, "b", bucket)  # its own data directory: no BM25 index, no graph of "u"
    try:
        assert [i.id for i in b.recall("locker code", user_id="u").items] == [rid]
        assert b.store.bm25.ids("u") == {rid}
    finally:
        b.close()
    a = replica(tmp_path, "a", bucket)  # back, with indexes made before b wrote nothing new: still right
    try:
        assert [i.id for i in a.recall("locker code", user_id="u").items] == [rid]
    finally:
        a.close()


def test_a_forget_on_a_shared_log_is_purged_and_the_server_starts_again(tmp_path: Path, bucket: Bucket) -> None:
    """The purge after a forget drops the log's old versions in object storage too; it used to fail
    there (LanceDB's cleanup_old_versions needs pylance), leaving a purge intent that stopped the
    server's next start."""
    a = replica(tmp_path, "a", bucket)
    try:
        rid = a.remember(content="My old address was 12 Elm Street", user_id="u").ids[0]
        a.forget(ids=[rid], user_id="u")
        a.store.deleter.purge_pending()
    finally:
        a.close()
    a = replica(tmp_path, "a", bucket)  # repairs (finishes any purge) as it opens
    try:
        assert not [i for i in a.store.journal.pending() if "purge" in i.op]
        assert a.recall("old address Elm Street", user_id="u").items == []
    finally:
        a.close()


def test_a_server_killed_between_its_commit_and_its_head_leaves_no_other_server_stale(
    tmp_path: Path, bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit is announced (a pending head) before it is made: should the server die before it
    publishes the new head, the others do not keep caches that miss the commit — a memory forgotten
    there, or one whose retried remember another server acknowledges as a repeat."""
    a, b = replica(tmp_path, "a", bucket), replica(tmp_path, "b", bucket)
    try:
        pin = a.remember(content="My bank PIN is 2291", user_id="u").ids[0]
        assert [i.id for i in b.recall("bank PIN", user_id="u").items] == [pin]  # b's caches hold "u"
        assert a.store.replica is not None
        monkeypatch.setattr(a.store.replica, "published", lambda user_id: None)  # a dies after each commit
        a.forget(ids=[pin], user_id="u")
        assert b.recall("bank PIN", user_id="u").items == []
        locker = a.remember(content="My locker number is 14", user_id="u").ids
        assert b.remember(content="My locker number is 14", user_id="u").ids == locker  # the client's retry
        assert [i.id for i in b.recall("locker number", user_id="u").items] == locker
    finally:
        a.close()
        b.close()


def test_maintenance_drops_the_old_versions_of_the_side_tables(
    tmp_path: Path, bucket: Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write of a shared log adds a version to the heads table (and the first of a user to the
    keys table); every read lists the versions, so they must not pile up."""
    from datetime import timedelta

    from mnemoplan.storage.log import maintenance

    a = replica(tmp_path, "a", bucket)
    try:
        for i in range(6):
            a.remember(content=f"note number {i} about the garden", user_id=f"u{i % 2}")
        side = a.store.log.tables.side
        assert len(side) >= 2  # the keys and the heads, at least
        before = [len(t.list_versions()) for t in side]
        assert max(before) > 2
        monkeypatch.setattr(maintenance, "OLD_VERSIONS_KEPT", timedelta(0))
        a.store.maintain()
        after = [len(t.list_versions()) for t in side]
        assert all(n <= 2 for n in after), (before, after)
        assert [i.text for i in a.recall("note number 5 garden", user_id="u1").items][:1] == [
            "note number 5 about the garden"]  # fmt: skip
    finally:
        a.close()
