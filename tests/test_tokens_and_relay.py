"""Tokens on disk, the `token` and `users` commands, and the relay to a data directory's holder."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from mnemoplan.cli.main import main
from mnemoplan.errors import Forbidden, InvalidInput, NotFound
from mnemoplan.service.share import RemoteService, ShareServer, open_shared, socket_path
from mnemoplan.storage.tokens import TokenStore
from tests.conftest import make_service


def test_tokens_are_stored_hashed_private_and_revoked_at_once(tmp_path: Path) -> None:
    store = TokenStore(tmp_path)
    secret, info = store.create(user_id="alice")
    text = store.path.read_text()
    assert secret not in text and secret[4:] not in text
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    verifier = TokenStore(tmp_path)  # another process's view of the same file
    assert verifier.verify(secret) == info
    assert verifier.verify(secret + "x") is None and verifier.verify("junk") is None
    store.revoke(info.id)
    assert verifier.verify(secret) is None
    with pytest.raises(NotFound):
        store.revoke(info.id)
    with pytest.raises(InvalidInput):
        store.create(user_id=None)
    assert [t.id for t in store.list()] == []


def test_token_commands_never_show_the_secret_again(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = str(tmp_path / "data")
    assert main(["token", "create", "--user", "alice", "--data-dir", data, "--note", "laptop"]) == 0
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("mnp_")
    assert main(["token", "create", "--admin", "--read-only", "--data-dir", data]) == 0
    capsys.readouterr()
    assert main(["token", "list", "--data-dir", data]) == 0
    listing = capsys.readouterr().out
    assert "user=alice" in listing and "admin read-only" in listing and "laptop" in listing
    assert secret not in listing
    token_id = listing.split()[0]
    assert main(["token", "revoke", token_id, "--data-dir", data]) == 0
    assert main(["token", "create", "--data-dir", data]) == 2  # neither --user nor --admin
    assert TokenStore(tmp_path / "data").verify(secret) is None


def test_the_relay_answers_as_the_service_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    service = make_service(data)
    server = ShareServer(service, socket_path(data))
    try:
        remote = open_shared(data, lambda: make_service(data), "alice", wait_s=5.0)  # locked: it relays
        assert isinstance(remote, RemoteService)
        stored = remote.remember(content="Mei plays the oboe", session_id="s")  # the relay's default user
        assert stored.stored == 1
        found = remote.recall("What does Mei play?")
        assert found.user_id == "alice" and found.items[0].text == "Mei plays the oboe"
        assert service.recall("oboe", user_id="alice").items  # written in the holder's store
        plan = remote.explain_plan("oboe")
        assert plan.user_id == "alice" and plan.recall_plan.name == service.explain_plan("oboe", user_id="alice").recall_plan.name
        assert remote.deep_search("oboe").items
        with pytest.raises(InvalidInput) as bad:
            remote.recall("   ")
        assert bad.value.code == "invalid_input"
        assert [(u.user_id, u.records, u.sessions) for u in remote.users()][0][:1] == ("alice",)
        assert main(["users", "--data-dir", str(data)]) == 0
        assert "alice" in capsys.readouterr().out
        receipt = remote.forget(scope="user")
        assert receipt.removed >= 1 and not service.recall("oboe", user_id="alice").items
    finally:
        server.close()
        service.close()
    assert not socket_path(data).exists()


def test_forbidden_is_an_expected_failure() -> None:
    assert Forbidden("x").code == "forbidden" and not Forbidden("x").retryable


def test_without_unix_sockets_the_relay_uses_loopback_tcp_and_a_private_secret(tmp_path: Path) -> None:
    """Windows' fallback, run here by naming the port file instead of the socket."""
    import json
    import socket

    from mnemoplan.service.share import PORT_FILE

    data = tmp_path / "data"
    service = make_service(data)
    where = data / PORT_FILE
    server = ShareServer(service, where)
    try:
        assert stat.S_IMODE(where.stat().st_mode) == 0o600
        remote = RemoteService(where, "alice")
        assert remote.remember(content="Kofi rows on Sundays").stored == 1
        assert remote.recall("Who rows?").items[0].text == "Kofi rows on Sundays"
        port = json.loads(where.read_text())["port"]
        with socket.create_connection(("127.0.0.1", port)) as sock:  # without the secret: no answer
            sock.sendall(json.dumps({"method": "users", "secret": "guess"}).encode() + b"\n")
            assert sock.makefile("rb").readline() == b""
    finally:
        server.close()
        service.close()
    assert not where.exists()
