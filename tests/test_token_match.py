"""The token index: packed token vectors in the log, held per user, matched token by token."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mnemoplan.inference import int8_product
from mnemoplan.storage.log import token_cache as token_store
from mnemoplan.inference.token_vectors import DIM, project, projection
from mnemoplan.storage.log.token_cache import (
    TokenBlock,
    TokenCache,
    merge_small,
    pack,
    pack_parts,
    unpack,
)
from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.schema import KIND_CODES
from mnemoplan.service.service import MemoryService
from tests.conftest import make_service, server_env
from tests.test_store import say


def _unit(rng: np.random.Generator, n: int, width: int = 384) -> np.ndarray:
    m = rng.standard_normal((n, width)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_the_projection_is_fixed_so_stored_tokens_stay_readable() -> None:
    p = projection(384)
    assert p.shape == (384, DIM) and set(np.unique(p * np.sqrt(DIM)).round(6)) == {-1.0, 1.0}
    # The signs come from a hash, not a random generator whose stream could change with numpy.
    assert (p[0, :8] > 0).tolist() == (projection.__wrapped__(384)[0, :8] > 0).tolist()
    assert int((p > 0).sum()) == 24_774  # any change here makes every stored memory unreadable


def test_packing_keeps_each_tokens_direction() -> None:
    vectors = _unit(np.random.default_rng(0), 7)
    codes, scales = unpack(pack(vectors))
    restored = codes.astype(np.float32) * scales[:, None]
    exact = project(vectors)
    cosines = (restored * exact).sum(1) / np.linalg.norm(restored, axis=1)
    assert codes.shape == (7, DIM) and codes.dtype == np.int8 and cosines.min() > 0.999
    assert unpack(pack(np.zeros((0, 384), dtype=np.float32)))[0].shape == (0, DIM)


def test_the_integer_product_gives_the_float_products_cosines() -> None:
    rng = np.random.default_rng(5)
    codes, scales = unpack(pack(_unit(rng, 50)))
    query = project(_unit(rng, 4))
    query[3] = 0  # a query token of zeros scores 0
    exact = (query @ codes.T.astype(np.float32)) * scales
    got = int8_product.cosines(int8_product.as_unsigned(codes), scales, int8_product.split_query(query)).T
    assert got.shape == (4, 50) and np.allclose(got, exact, atol=1e-4) and not got[3].any()


def test_a_block_scores_each_memory_by_its_best_token_per_query_token() -> None:
    rng = np.random.default_rng(1)
    memories = [_unit(rng, n) for n in (3, 1, 5)]
    block = TokenBlock.build(["a", "b", "c"], [pack(m) for m in memories], [0, 0, 0], ["", "", ""], [0, 0, 0])
    query, weights = memories[2][[0, 4]], np.array([0.75, 0.25])  # two of c's own tokens
    scores = block.match(project(query), weights)
    assert scores.argmax() == 2 and abs(scores[2] - 1.0) < 0.01
    brute = [weights @ (project(query) @ project(m).T).max(axis=1) for m in memories]
    assert np.allclose(scores, brute, atol=0.02)
    joined = merge_small((block, block, block), most=2)
    assert len(joined) == 2 and np.allclose(np.concatenate([b.match(project(query), weights) for b in joined]),
                                            np.concatenate([scores] * 3), atol=1e-5)  # fmt: skip


def test_a_message_scored_from_its_passages_scores_as_if_it_held_their_tokens() -> None:
    rng = np.random.default_rng(4)
    first, second = _unit(rng, 4), _unit(rng, 6)
    ids = ["a" * 32, "b" * 32, "c" * 32]  # the message, then its two passages
    whole = TokenBlock.build(ids[:1], [pack(np.concatenate([first, second]))], [0], [""], [0])
    kinds = [KIND_CODES["message"], KIND_CODES["passage"], KIND_CODES["passage"]]
    parts = TokenBlock.build(ids, [pack_parts(ids[1:]), pack(first), pack(second)], kinds, [""] * 3, [0] * 3)
    assert parts.tokens == 10 and parts.ids == [ids[1], ids[2], ids[0]]  # each token held once
    query, weights = project(np.stack([first[1], second[2]])), np.array([0.5, 0.5])  # one word from each
    assert np.allclose(parts.match(query, weights)[2], whole.match(query, weights)[0], atol=1e-6)
    split = TokenBlock.build(ids[:1], [pack_parts(ids[1:])], [0], [""], [0])  # passages in another block
    assert split.match(query, weights)[0] == 0.0  # alone it has nothing to score...
    found = parts.part_columns(parts.best(query))
    assert np.allclose(split.match(query, weights, found)[0], whole.match(query, weights)[0], atol=1e-6)  # ...not so


def test_a_long_message_stores_its_tokens_once_and_is_matched_through_its_passages(service: MemoryService) -> None:
    reply = "\n\n".join(["We compared planners and calendars for the team at length. " * 14,
                          "The cold storage bucket heron-archive-eu rotates every thirty days. " * 2,
                          "Reminders and shared lists were discussed for a long while too. " * 14])  # fmt: skip
    rid = service.remember(content=reply, speaker="assistant", user_id="u").ids[0]
    rows = service.store.log.select(RecordFilter("u"), ["id", "kind", "tokens"])
    passages = [r["id"] for r in rows if r["kind"] == "passage"]
    message = next(r for r in rows if r["id"] == rid)
    assert len(passages) > 1 and token_store.parts_of(message["tokens"]) == passages
    hits = service.single_index_search("token_match", "heron archive bucket", user_id="u",
                                       params={"kinds": ["message"]})  # fmt: skip
    assert [h.id for h in hits] == [rid]  # scored through passages its step's filter leaves out


def test_a_block_scored_in_slices_scores_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    memories = [_unit(rng, n) for n in (3, 1, 5, 2, 6)]
    block = TokenBlock.build(list("abcde"), [pack(m) for m in memories], [0] * 5, [""] * 5, [0] * 5)
    query, weights = project(_unit(rng, 3)), np.array([0.5, 0.3, 0.2])
    whole = block.match(query, weights)
    monkeypatch.setattr(token_store, "MIN_CHUNK_TOKENS", 1)
    monkeypatch.setattr(token_store, "CHUNK_TOKENS", 4)  # slices of 3, 1, 5 (alone: larger than a slice), 2, 6
    assert np.allclose(block.match(query, weights), whole)


def test_the_cache_refuses_a_load_that_raced_a_change() -> None:
    cache = TokenCache()
    block = TokenBlock.build(["a"], [pack(_unit(np.random.default_rng(2), 2))], [0], [""], [0])
    generation = cache.generation("u")
    cache.invalidate("u")  # a delete while the load was reading
    cache.put("u", (block,), generation)
    assert cache.get("u") is None
    cache.put("u", (block,), cache.generation("u"))
    cache.extend("u", TokenBlock.build(["b"], [pack(_unit(np.random.default_rng(3), 1))], [0], [""], [0]))
    assert [rid for b in cache.get("u") or () for rid in b.ids] == ["a", "b"]


def _token_hits(svc: MemoryService, query: str, user: str = "u") -> list[str]:
    return [item.text for item in svc.single_index_search("token_match", query, user_id=user)]


def test_remembered_messages_are_matched_token_by_token_and_forgotten_everywhere(service: MemoryService) -> None:
    ids = say(service, "u", "s", ("Ann", "I took up kickboxing in March"), ("Ben", "the boiler needs a plumber"))
    say(service, "v", "s", ("Cy", "kickboxing every Tuesday"))
    log = service.store.log
    assert log.count("kind = 'message' AND tokens IS NOT NULL") == 3  # (and the facts read out of them)
    assert _token_hits(service, "kickboxing?")[0] == "I took up kickboxing in March"
    assert _token_hits(service, "kickboxing?", "v") == ["kickboxing every Tuesday"]  # each user their own
    recalled = service.recall("kickboxing", user_id="u", limit=5)
    assert "tokens" in recalled.trace.plan.steps[2].step_id and recalled.items[0].id == ids[0]
    assert "tokens" in recalled.items[0].provenance
    service.forget(ids=[ids[0]], user_id="u")
    assert "I took up kickboxing in March" not in _token_hits(service, "kickboxing?")
    assert log.count("user_id = 'u' AND tokens IS NOT NULL AND text LIKE '%kickboxing%'") == 0
    assert log.count("user_id = 'u' AND tokens IS NOT NULL") == log.count("user_id = 'u'") > 0
    service.forget(scope="user", user_id="v")
    assert log.count("user_id = 'v'") == 0 and _token_hits(service, "kickboxing?", "v") == []


def test_tokens_written_while_a_user_is_held_are_found_at_once(service: MemoryService) -> None:
    say(service, "u", "s", ("Ann", "the canoe is green"))
    assert _token_hits(service, "canoe") == ["the canoe is green"]  # now held in memory
    say(service, "u", "s", ("Ben", "my kayak is red"))
    assert _token_hits(service, "kayak") == ["my kayak is red"]


def test_a_log_written_before_token_vectors_gains_the_column_and_works(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    say(svc, "u", "s", ("Ann", "the canoe is green"))
    svc.store.log.tables.records.drop_columns(["tokens"])  # the older schema
    svc.close()
    svc = make_service(tmp_path)
    try:
        assert _token_hits(svc, "canoe") == []  # what was written before has no tokens...
        assert svc.recall("canoe", user_id="u").items[0].text == "the canoe is green"  # ...and is found anyway
        say(svc, "u", "s", ("Ben", "my kayak is red"))
        assert _token_hits(svc, "kayak") == ["my kayak is red"]
        heard: list[tuple[int, int]] = []
        assert svc.ingestor.backfill_tokens("u", lambda done, total: heard.append((done, total))) >= 1
        assert heard and heard[-1][0] == heard[-1][1]
        assert _token_hits(svc, "canoe") == ["the canoe is green"]
        assert svc.ingestor.backfill_tokens("u") == 0
    finally:
        svc.close()


def test_reindex_gives_token_vectors_to_what_was_written_before_them(tmp_path: Path) -> None:
    svc = make_service(tmp_path)
    say(svc, "u", "s", ("Ann", "the canoe is green"))
    svc.store.log.tables.records.drop_columns(["tokens"])
    svc.close()
    done = subprocess.run([sys.executable, "-m", "mnemoplan", "reindex"], capture_output=True, text=True,
                          env=server_env(tmp_path), timeout=300, check=True)  # fmt: skip
    assert "u: 1 records given token vectors" in done.stderr
    svc = make_service(tmp_path)
    try:
        assert _token_hits(svc, "canoe") == ["the canoe is green"]
    finally:
        svc.close()


def test_a_user_too_large_to_hold_is_scanned_only_when_the_step_asks(service: MemoryService) -> None:
    say(service, "u", "s", ("Ann", "the canoe is green"), ("Ben", "my kayak is red"))
    service.store.log.token_cache.max_user_tokens = 1
    assert _token_hits(service, "kayak") == []
    found = service.single_index_search("token_match", "kayak", user_id="u", params={"scan_log": True})
    assert found[0].text == "my kayak is red"
    assert service.store.log.token_cache.get("u") is None


def test_a_too_large_verdict_survives_appends_but_not_a_delete_during_or_after_the_read() -> None:
    cache = TokenCache(max_user_tokens=1)
    block = TokenBlock.build(["a"], [pack(_unit(np.random.default_rng(2), 3))], [0], [""], [0])
    stamp = cache.size_stamp("u")
    cache.extend("u", block)  # appended while the user was being read: still too large
    cache.mark_too_large("u", stamp)
    assert cache.too_large("u") and not cache.too_large("v")
    cache.invalidate("u")  # a delete: measure again
    assert not cache.too_large("u")
    for drop in ("u", None):  # a delete, or everyone's invalidation, while the user was being read
        stamp = cache.size_stamp("u")
        cache.invalidate(drop)
        cache.mark_too_large("u", stamp)
        assert not cache.too_large("u")
    cache.mark_too_large("u", cache.size_stamp("u"))
    cache.invalidate()
    assert not cache.too_large("u")


def test_completeness_is_counted_once_per_change_and_follows_every_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc = make_service(tmp_path)
    say(svc, "u", "s", ("Ann", "the canoe is green"))
    svc.store.log.tables.records.drop_columns(["tokens"])  # what was written before token vectors
    svc.close()
    svc = make_service(tmp_path)
    index = svc.registry.get("token_match")
    counts: list[str] = []
    count = svc.store.log.count
    monkeypatch.setattr(svc.store.log, "count", lambda where: counts.append(where) or count(where))
    try:
        assert not index.complete("u") and not index.complete("u") and len(counts) == 1
        assert index.complete("v")  # nothing to lack
        say(svc, "u", "s", ("Ben", "my kayak is red"))  # a write: counted again, still incomplete
        assert not index.complete("u") and len(counts) == 3
        assert svc.ingestor.backfill_tokens("u") >= 1
        assert index.complete("u") and index.complete("u") and len(counts) == 4
    finally:
        svc.close()


def test_a_user_found_too_large_is_not_read_again_until_their_memories_shrink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = make_service(tmp_path, token_cache_tokens=5)  # the setting reaches the cache
    log = service.store.log
    try:
        say(service, "u", "s", ("Ann", "the canoe is green"), ("Ben", "my kayak is red"))
        assert _token_hits(service, "kayak") == [] and log.token_cache.too_large("u")
        reads: list[str] = []
        newest = log.tables.newest  # what every read of the log opens
        monkeypatch.setattr(log.tables, "newest", lambda *a, **k: reads.append("read") or newest(*a, **k))
        assert _token_hits(service, "kayak") == [] and not reads  # known too large: the log is not read
        say(service, "u", "s", ("Ann", "a third boat"))
        assert _token_hits(service, "kayak") == [] and not reads  # an append only makes them larger
        service.forget(scope="session", user_id="u", session_id="s")
        say(service, "u", "t", ("Ben", "my kayak is red"))
        assert not log.token_cache.too_large("u")  # the delete voided the verdict...
        assert _token_hits(service, "kayak") == ["my kayak is red"] and reads  # ...so they are read and fit
    finally:
        service.close()


def test_recall_leaves_token_matching_to_deep_search_past_its_size_limit(service: MemoryService) -> None:
    say(service, "u", "s", ("Ann", "the canoe is green"), ("Ben", "my kayak is red"))
    assert service.single_index_search("token_match", "kayak", user_id="u", params={"max_memories": 1}) == []
    assert _token_hits(service, "kayak") == ["my kayak is red"]
    deep = service.deep_search("kayak", user_id="u")
    [step] = [s for s in deep.plans[0].steps if s.index == "token_match"]
    assert step.params["scan_log"] is True and step.params["max_memories"] == 0


def test_a_delete_takes_its_memories_out_of_a_held_user_without_reading_them_again() -> None:
    rng = np.random.default_rng(4)
    a, b, c, d = (ch * 32 for ch in "abcd")  # ids as stored: a memory's parts are packed by id
    cache = TokenCache()
    first = TokenBlock.build([a, b], [pack(_unit(rng, 2)), pack(_unit(rng, 3))], [0, 0], ["", ""], [1, 2])
    second = TokenBlock.build([c, d], [pack(_unit(rng, 1)), pack_parts([c])], [0, 0], ["", "p"], [3, 4])
    cache.put("u", (first, second), cache.generation("u"))
    generation = cache.generation("u")
    cache.drop_rows("u", [a])
    kept = cache.get("u")
    assert kept is not None and [rid for b in kept for rid in b.ids] == [b, c, d]
    query = project(_unit(np.random.default_rng(5), 2))
    expected = np.concatenate([first.best(query)[:, 1:], second.best(query)], axis=1)
    assert np.allclose(np.concatenate([b.best(query) for b in kept], axis=1), expected)  # the same scores, "a" gone
    cache.put("u", (first,), generation)  # a load that began before the delete is refused
    assert cache.get("u") is kept
    cache.drop_rows("u", [c])  # "d" is scored from "c"'s tokens: read the user again
    assert cache.get("u") is None


def test_a_delete_or_a_new_neighbour_changes_a_held_users_vectors_in_place() -> None:
    from mnemoplan.storage.log.vector_cache import UserVectors, VectorCache

    rng = np.random.default_rng(6)
    matrix = rng.standard_normal((3, 4)).astype(np.float32)
    cache = VectorCache()
    cache.put("u", UserVectors.build(["a", "b", "c"], matrix, {"prev_id": ["", "a", "b"]}), cache.generation("u"))
    cache.drop_rows("u", ["b"])
    held = cache.get("u")
    assert held is not None and held.ids == ["a", "c"] and np.array_equal(held.matrix, matrix[[0, 2]])
    new = np.ones(4, dtype=np.float32)
    cache.patch_rows("u", {"c": ("a", new)})
    patched = cache.get("u")
    assert patched is not None and np.array_equal(patched.matrix[1], new) and list(patched.prev_ids) == ["", "a"]
    assert np.array_equal(held.matrix[1], matrix[2])  # a search holding the old snapshot sees it unchanged
    cache.patch_rows("u", {"b": ("a", new)})  # a row it does not hold: read the user again
    assert cache.get("u") is None
