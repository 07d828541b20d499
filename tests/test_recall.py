"""Recall's plan and ranking: small talk, entities, time windows and anchors, lists, follow-ups, options."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from mnemoplan.errors import InvalidInput
from mnemoplan.model import MessageIn, RecallOptions
from mnemoplan.service.service import MemoryService


def say(svc: MemoryService, session: str, when: datetime, *turns: tuple[str, str]) -> list[str]:
    msgs = [MessageIn(content=text, speaker=who, occurred_at=when) for who, text in turns]
    return svc.remember(messages=msgs, user_id="u", session_id=session).ids


def texts(result) -> list[str]:  # noqa: ANN001
    return [i.text for i in result.items]


def test_small_talk_skips_retrieval(service: MemoryService) -> None:
    say(service, "s", datetime(2024, 1, 1, tzinfo=UTC), ("Ann", "hello"))
    result = service.recall("Hi there, thanks!", user_id="u")
    assert result.skipped_retrieval and result.items == [] and result.trace.signals == []


def test_entities_resolve_whatever_the_case_or_accents(service: MemoryService) -> None:
    say(service, "s", datetime(2024, 1, 1, tzinfo=UTC), ("Ann", "I had lunch with José García at the Museum"))
    for query in ("what did I do with jose garcia", "Lunch with JOSÉ GARCÍA?", "josé-garcía lunch"):
        analysis = service.recall(query, user_id="u").analysis
        assert [e.key for e in analysis.entities if e.known] == ["jose-garcia"], query


def test_a_named_day_window_finds_what_happened_that_day(service: MemoryService) -> None:
    target = say(service, "s1", datetime(2023, 3, 17, 15, tzinfo=UTC),
                 ("Jim", "Yesterday I went bowling and got two strikes"))[0]  # fmt: skip
    say(service, "s2", datetime(2023, 3, 1, 15, tzinfo=UTC), ("Jim", "I love bowling, and chess too"))
    for i in range(8):
        say(service, f"x{i}", datetime(2023, 4, 1 + i, tzinfo=UTC), ("Jim", f"Some other activity number {i} today"))
    result = service.recall("What activity was Jim doing on March 16, 2023?", user_id="u")
    window = result.analysis.time_window
    assert window.start == datetime(2023, 3, 16, tzinfo=UTC) and window.end == datetime(2023, 3, 17, tzinfo=UTC)
    top = result.items[0]  # the message, or the fact read from it ("Jim went bowling on 16 March 2023.")
    assert top.id == target or top.derived_from == [target]
    assert any(s.name == "time" and s.count >= 1 for s in result.trace.signals)


def test_before_an_anchor_event(service: MemoryService) -> None:
    say(service, "s1", datetime(2022, 5, 1, tzinfo=UTC), ("Eve", "We booked a trip to Crete for the summer"))
    say(service, "s2", datetime(2022, 9, 10, tzinfo=UTC), ("Eve", "The wedding was beautiful, we danced all night"))
    say(service, "s3", datetime(2023, 2, 1, tzinfo=UTC), ("Eve", "We booked a trip to Oslo in winter"))
    result = service.recall("What trip did we book before the wedding?", user_id="u")
    assert result.analysis.time_window.anchor == "the wedding"
    steps = {s.step_id: s.index for s in result.trace.plan.steps}
    assert steps.get("anchor") == "bm25" and steps.get("time") == "temporal"
    ranked = texts(result)
    assert ranked.index("We booked a trip to Crete for the summer") < ranked.index("We booked a trip to Oslo in winter")


def test_who_are_my_friends_looks_up_people(service: MemoryService) -> None:
    when = datetime(2024, 1, 1, tzinfo=UTC)
    say(service, "s1", when, ("Kai", "My friend Priya is coming over"), ("Kai", "My best friend Tomas called"))
    say(service, "s2", when, ("Kai", "The weather in Porto was grey"))
    result = service.recall("Who are my friends?", user_id="u")
    assert result.analysis.intent == "aggregation" and result.analysis.entity_type == "person"
    assert "of_type" in [s.step_id for s in result.trace.plan.steps]
    top = texts(result)[:2]
    assert set(top) == {"My friend Priya is coming over", "My best friend Tomas called"}


def test_a_complete_question_is_searched_alone_whatever_the_history(service: MemoryService) -> None:
    from mnemoplan.planner.analyzer import is_follow_up
    from mnemoplan.planner.recall import history_context

    complete = ["What car do I have?", "Where do I live?", "When is my birthday?", "What am I allergic to?"]
    assert not any(is_follow_up(q) for q in complete)
    assert all(is_follow_up(q) for q in ["how much?", "what brand?", "and her sister?", "When did we get her?"])
    when = datetime(2024, 1, 1, tzinfo=UTC)
    say(service, "s1", when, ("user", "I drive an old green Volvo estate"), ("user", "My sister visits in May"))
    reply = "Lovely! " + "Visits from family are a great time to plan trips, meals and walks together. " * 12
    found = service.recall("What car do I have?", user_id="u", history=["Ingrid is coming to visit", reply])
    # the car, first: the message, or the attribute fact read from it ("User drives Volvo.")
    assert "Volvo" in texts(found)[0] and "I drive an old green Volvo estate" in texts(found)[:2]
    assert not any("follow-up" in n for n in found.trace.notes)
    assert len(history_context(["Ingrid is coming to visit", reply]).split()) == 40


def test_a_follow_up_searches_with_the_conversation(service: MemoryService) -> None:
    when = datetime(2024, 1, 1, tzinfo=UTC)
    say(service, "s1", when, ("Lia", "The new road bike cost 1400 euros"), ("Lia", "The piano lessons are weekly"))
    plain = service.recall("how much?", user_id="u")
    followed = service.recall("how much?", user_id="u", history=["I finally bought the road bike"])
    assert plain.skipped_retrieval  # alone, "how much?" carries nothing to look up
    assert texts(followed)[0] == "The new road bike cost 1400 euros"
    assert any("follow-up" in n for n in followed.trace.notes)


def test_per_call_options(service: MemoryService) -> None:
    when = datetime(2024, 1, 1, tzinfo=UTC)
    say(service, "s1", when, ("Ola", "I live in Lyon"))
    say(service, "s2", when, ("Ola", "I live in Porto"))
    everything = service.recall("Where does Ola live?", user_id="u")
    assert any(i.kind == "fact" and not i.current for i in everything.items)
    current = service.recall("Where does Ola live?", user_id="u", options=RecallOptions(current_only=True))
    assert {i.text for i in current.items} == {"Ola lives in Porto.", "I live in Porto"}  # Lyon's are outdated
    assert all(i.current for i in current.items)
    only_facts = service.recall("Where does Ola live?", user_id="u", options=RecallOptions(kinds=["fact"]))
    assert {i.kind for i in only_facts.items} == {"fact"}
    short = service.recall("Where does Ola live?", user_id="u", options=RecallOptions(token_budget=50))
    assert len(short.context) <= 50 * 4
    with pytest.raises(InvalidInput, match="telepathy"):
        service.recall("x", user_id="u", options=RecallOptions(weights={"telepathy": 1.0}))
    with pytest.raises(InvalidInput, match="bm25 outside 0-5"):
        service.recall("x", user_id="u", options=RecallOptions(weights={"bm25": 99.0}))
    lexical = service.recall("Where does Ola live?", user_id="u", options=RecallOptions(weights={"semantic": 0.0}))
    assert {"Ola lives in Porto.", "I live in Porto"} <= {i.text for i in lexical.items}
    assert lexical.items[0].scores["bm25"] == 1.0  # the first is the keyword step's best, the vectors weigh nothing


def test_the_context_budget_counts_other_scripts_at_their_cost() -> None:
    from mnemoplan.model import MemoryItem
    from mnemoplan.planner.formatter import estimate_tokens, format_context

    assert estimate_tokens("a" * 400) == 100 and estimate_tokens("犬" * 100) == 100
    assert estimate_tokens("д" * 100) == 50 and estimate_tokens("café " * 20) == 25
    when = datetime(2024, 1, 1, tzinfo=UTC)
    texts = ["妹の犬のポチは毎朝公園を走り回っていて、近所の子供たちにとても人気があります。" * 4, "a short note"]
    items = [MemoryItem(id=f"{i:032x}", kind="message", text=t, occurred_at=when, score=1.0, speaker="Kim")
             for i, t in enumerate(texts)]  # fmt: skip
    for budget in (30, 50, 200):
        context = format_context(items, budget)
        assert context and estimate_tokens(context) <= budget + 2  # +2: the newlines between lines


def test_every_item_carries_its_score_breakdown_and_the_trace_its_timings(service: MemoryService) -> None:
    say(service, "s", datetime(2024, 1, 1, tzinfo=UTC), ("Ann", "The lighthouse keeper painted the door blue"),
        ("Ben", "Blue is a good colour for a door"))  # fmt: skip
    result = service.recall("What colour is the lighthouse door?", user_id="u")
    assert result.items and all(i.scores for i in result.items)
    assert {"analyze", "signals", "rank", "format"} <= set(result.trace.timings_ms)
    assert {s.name for s in result.trace.signals} >= {"bm25", "semantic"}
    assert "Relevant conversation:" in result.context and "[2024-01-01]" in result.context


def test_use_counts_in_ranking_only_when_weighted() -> None:
    from mnemoplan.model import Record
    from mnemoplan.planner.fusion import Candidate
    from mnemoplan.planner.ranking import RankingConfig, rank

    now = datetime(2024, 1, 1, tzinfo=UTC)

    def rec(rid: str, seq: int, uses: int) -> Record:
        return Record(id=rid, user_id="u", session_id=rid, kind="message", text=rid, occurred_at=now,
                      created_at=now, seq=seq, access_count=uses)  # fmt: skip

    records = {"often": rec("often", 1, 40), "never": rec("never", 2, 0)}

    def order(config: RankingConfig) -> list[str]:
        cands = {rid: Candidate(rid, 1.0) for rid in records}
        return [c.id for c in rank(cands, records, config, now)]

    assert order(RankingConfig()) == ["never", "often"]  # ties go to the later turn
    ranked = order(RankingConfig(use_weight=0.1))
    assert ranked == ["often", "never"]


def test_a_question_passes_part_of_its_score_to_its_reply() -> None:
    from mnemoplan.model import Record
    from mnemoplan.planner.fusion import Candidate
    from mnemoplan.planner.ranking import RankingConfig, rank

    now = datetime(2024, 1, 1, tzinfo=UTC)
    turns = [("q", "", "Where did you go on holiday?"), ("a", "q", "Lisbon, with my sister."),
             ("other", "", "I like trains.")]  # fmt: skip
    records = {rid: Record(id=rid, user_id="u", session_id="s", text=text, occurred_at=now, created_at=now,
                           seq=i, prev_id=prev) for i, (rid, prev, text) in enumerate(turns)}  # fmt: skip
    scores = {"q": 1.0, "a": 0.7, "other": 0.75}

    def ranked(share: float) -> list[Candidate]:
        cands = {rid: Candidate(rid, s) for rid, s in scores.items()}
        config = RankingConfig(reply_share=share, context_propagation=0.0, session_weight=0.0)
        return rank(cands, records, config, now)

    assert [c.id for c in ranked(0.0)] == ["q", "other", "a"]
    after = {c.id: c for c in ranked(0.2)}
    assert [c.id for c in ranked(0.2)] == ["a", "q", "other"]
    assert after["q"].score == pytest.approx(0.8) and after["q"].scores["asks"] == pytest.approx(-0.2)
    assert after["a"].score == pytest.approx(0.9) and after["a"].scores["reply"] == pytest.approx(0.2)
    assert after["other"].score == pytest.approx(0.75) and "reply" not in after["other"].scores


def test_the_current_fact_ranks_above_what_it_replaced_through_a_chain_and_a_reply() -> None:
    from mnemoplan.model import Record
    from mnemoplan.planner.fusion import Candidate
    from mnemoplan.planner.ranking import RankingConfig, rank

    now = datetime(2024, 1, 1, tzinfo=UTC)
    # Lyon -> Porto -> Paris; "Where do you live?" asked, "I live in Lyon" the reply.
    rows = [("ask", "message", "", "", "Where do you live?"), ("lyon", "message", "ask", "porto", "I live in Lyon"),
            ("porto", "fact", "", "paris", "Ola lives in Porto."), ("paris", "fact", "", "", "Ola lives in Paris."),
            ("other", "message", "", "", "I like trains.")]  # fmt: skip
    records = {rid: Record(id=rid, user_id="u", session_id="s", kind=kind, text=text, occurred_at=now,
                           created_at=now, seq=i, prev_id=prev, superseded_by=by)
               for i, (rid, kind, prev, by, text) in enumerate(rows)}  # fmt: skip
    scores = {"ask": 1.0, "lyon": 1.0, "porto": 0.2, "paris": 0.3, "other": 0.6}
    config = RankingConfig(context_propagation=0.0, session_weight=0.0, reply_share=0.2)
    ranked = rank({rid: Candidate(rid, s) for rid, s in scores.items()}, records, config, now)
    by_id = {c.id: c for c in ranked}
    assert ranked[0].id == "paris" and by_id["paris"].scores["replaces"] > 0
    assert by_id["paris"].score == pytest.approx(1.0)  # Lyon's score before its demotion
    assert by_id["lyon"].score == pytest.approx(0.5 + 0.2)  # halved, then its question's share
    assert by_id["porto"].score == pytest.approx(0.1) and "replaces" not in by_id["porto"].scores
    assert by_id["other"].score == pytest.approx(0.6)
    del records["porto"]  # a broken chain passes nothing on
    ranked = rank({rid: Candidate(rid, s) for rid, s in scores.items() if rid != "porto"}, records, config, now)
    assert {c.id: c.score for c in ranked}["paris"] == pytest.approx(0.3)


ASKING = [  # (kind, speaker, text, asks)
    ("message", "Ann", "Have you been?", True), ("message", "Ann", "Really? Yes, twice.", True),
    ("message", "Ann", "Really?!", True), ("message", "Ann", "**Why?**", True), ("message", "Ann", "行く？", True),
    ("message", "Ann", "لماذا؟", True), ("message", "Ann", "Really?\u00a0Yes", True),
    ("message", "Ann", "Why?\u3000ok", True), ("message", "Ann", 'She said "why?" and left', True),
    ("message", "Ann", "See https://x.org/?a=1 for it", False), ("message", "Ann", "I went.", False),
    ("fact", "", "Is it true? Ann lives in Lyon.", False),
    ("message", "user", "Any gift ideas for my sister, who loves pottery?", False),  # a request to an assistant
    ("message", "Human", "Where should I go?", False), ("message", "assistant", "What is your budget?", True),
]  # fmt: skip


def test_what_counts_as_asking_is_the_same_in_memory_and_in_records() -> None:
    import pyarrow as pa

    from mnemoplan.storage.log.schema import asks as _asks
    from mnemoplan.model.records import asks_question

    assert [asks_question(k, who, text) for k, who, text, _ in ASKING] == [asks for *_, asks in ASKING]
    table = pa.table({"kind": [k for k, *_ in ASKING] + ["message", None],
                      "speaker": [who for _, who, *_ in ASKING] + [None, "Ann"],
                      "text": [text for _, _, text, _ in ASKING] + ["Why?", None]})  # fmt: skip
    assert _asks(table).tolist() == [asks for *_, asks in ASKING] + [True, False]  # the log's own, on load


def test_what_counts_as_standing_alone_is_the_same_in_memory_and_in_records() -> None:
    import pyarrow as pa

    from mnemoplan.storage.log.schema import alone as _alone
    from mnemoplan.model.records import STANDALONE_WORDS, stands_alone

    n = STANDALONE_WORDS
    rows = [("message", "w " * n), ("message", " w\u00a0w " * (n // 2) + " w"), ("message", "w\tw\n" * n),
            ("fact", "w " * (n + 1)), ("message", ""), (None, "w " * (n + 1)), ("message", None),
            ("message", "猫" * n), ("message", "ねこ" * n), ("message", "고양이 " * n),
            ("message", "w " * n + "w"), ("message", "猫" * (n - 1))]  # fmt: skip
    expected = [False, False, True, False, False, False, False, True, True, False, True, False]
    assert [stands_alone(k or "", t or "") for k, t in rows] == expected
    assert _alone(pa.table({"kind": [k for k, _ in rows], "text": [t for _, t in rows]})).tolist() == expected


def test_words_are_counted_from_the_bytes_as_the_pattern_counts_them() -> None:
    import random

    import pyarrow as pa

    from mnemoplan.model.records import WORD_PATTERN
    from mnemoplan.storage.log.schema import word_counts

    rng = random.Random(3)
    pieces = ["w", "word", " ", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "\u00a0", "\u3000", "猫", "é",
              "x\u2028y", "\x00"]  # fmt: skip
    texts = ["", " ", "a", " a ", "\t\n"]
    texts += ["".join(rng.choices(pieces, k=rng.randint(0, 40))) for _ in range(300)]
    counted = [len(re.findall(WORD_PATTERN, t)) for t in texts]
    array = pa.array(texts)
    assert word_counts(array).tolist() == counted
    assert word_counts(pa.array(texts, pa.large_string())).tolist() == counted
    assert word_counts(array.slice(7, 50)).tolist() == counted[7:57]  # offsets that do not start at 0
    assert word_counts(pa.chunked_array([array.slice(0, 100), array.slice(100)])).tolist() == counted
    assert word_counts(pa.array(["", ""])).tolist() == [0, 0]


def test_the_bm25_records_are_read_in_their_fields_order() -> None:
    from dataclasses import fields

    from mnemoplan.model.records import DocRecord
    from mnemoplan.storage.log.schema import DOC_COLUMNS

    assert [f.name for f in fields(DocRecord)] == [*DOC_COLUMNS, "alone"]  # built positionally from them


def test_a_long_reply_is_found_by_its_own_words_not_by_the_turn_before_it(service: MemoryService) -> None:
    # An assistant's long reply used to take the words, the vector and the score of the short
    # user turn before it, and crowd the user's own turns out of the results.
    reply = ("Lovely! The harbour market opens at six. " + "Planning ahead always helps, and reviews are worth a read. " * 8
             + "Shall I book a table at the noodle bar?")  # fmt: skip
    ids = say(service, "s1", datetime(2024, 1, 1, tzinfo=UTC), ("user", "I'm allergic to peanuts"),
              ("assistant", reply), ("user", "Yes please"), ("assistant", "Anything else about peanuts?"),
              ("user", "No"))  # fmt: skip
    found = {i.id: i for i in service.recall("peanuts allergy", user_id="u").items}
    assert found[ids[0]].scores.get("bm25")
    long_reply = found.get(ids[1])
    assert long_reply is None or not {"bm25", "context"} & set(long_reply.scores)
    # a user's short answer takes the share of the assistant's question it answers (not a neighbour's score)
    assert found[ids[4]].scores.get("reply") and not found[ids[4]].scores.get("context")
    # The reply is found by its own words; the short turn after it by the reply's end only.
    market = {i.id: i for i in service.recall("harbour market", user_id="u").items}
    assert market[ids[1]].scores.get("bm25")
    assert ids[2] not in market or "bm25" not in market[ids[2]].scores
    booked = {i.id: i for i in service.recall("noodle bar table", user_id="u").items}
    assert booked[ids[2]].scores.get("bm25")


def test_a_question_without_its_reply_among_the_candidates_still_gives_up_its_share() -> None:
    from mnemoplan.model import Record
    from mnemoplan.planner.fusion import Candidate
    from mnemoplan.planner.ranking import RankingConfig, rank

    now = datetime(2024, 1, 1, tzinfo=UTC)
    turns = [("q1", "", "Did you go?"), ("q2", "q1", "Go where?"), ("a", "q2", "To Lisbon.")]
    records = {rid: Record(id=rid, user_id="u", session_id="s", speaker="Ann", text=text, occurred_at=now,
                           created_at=now, seq=i, prev_id=prev) for i, (rid, prev, text) in enumerate(turns)}  # fmt: skip
    config = RankingConfig(reply_share=0.5, context_propagation=0.0, session_weight=0.0)
    ranked = {c.id: c for c in rank({"q1": Candidate("q1", 1.0), "q2": Candidate("q2", 0.4)}, records, config, now)}
    # q2 replies to q1 and asks in turn: it gains from q1's score as it was, and gives up half
    # of its own (its reply is not a candidate); nothing cascades.
    assert ranked["q1"].score == pytest.approx(0.5)
    assert ranked["q2"].score == pytest.approx(0.4 - 0.2 + 0.5)


def test_the_reply_share_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from mnemoplan.config import Settings
    from mnemoplan.service.bootstrap import recall_config

    assert recall_config(Settings()).ranking.reply_share == 0.2
    monkeypatch.setenv("MNEMOPLAN_REPLY_SHARE", "0")
    assert recall_config(Settings()).ranking.reply_share == 0.0


def test_ranking_from_memory_returns_what_ranking_the_records_does(service: MemoryService) -> None:
    # Recall ranks on what the log holds in memory of a user and reads only the records it
    # returns; reading every candidate must give the same items, scores and order.
    when = datetime(2024, 1, 1, tzinfo=UTC)
    say(service, "s1", when, ("Ola", "I live in Lyon"), ("Kim", "Lyon has great food"), ("Ola", "The market!"))
    say(service, "s2", datetime(2024, 2, 1, tzinfo=UTC), ("Ola", "I moved to Porto"), ("Kim", "Do you miss Lyon?"))
    service.recall("Lyon", user_id="u")  # the user is now held in memory: later changes must reach it
    say(service, "s3", datetime(2024, 3, 1, tzinfo=UTC), ("Ola", "I live in Porto now"), ("Kim", "By the sea?"))
    queries = [("Where does Ola live?", None), ("What did Kim say about food?", None),
               ("What happened in February 2024?", None), ("Where does Ola live?", RecallOptions(kinds=["fact"]))]  # fmt: skip
    log = service.store.log

    def run() -> list[list[tuple[str, float, bool]]]:
        return [[(i.id, i.score, i.current) for i in service.recall(q, user_id="u", options=o).items]
                for q, o in queries]  # fmt: skip

    from_memory = run()
    assert log.heads("u", [from_memory[0][0][0]])  # the first path really ran
    held = log.heads("u", [i for items in from_memory for i, _, _ in items])
    records = log.get("u", list(held))
    asking = {records[rid].text for rid, head in held.items() if head.asks}
    assert asking == {"Do you miss Lyon?", "By the sea?"}  # loaded, then appended: both flagged in memory
    assert asking == {rec.text for rec in records.values() if rec.asks}
    real = log.heads
    log.heads = lambda user_id, ids: None  # type: ignore[method-assign]
    try:
        assert run() == from_memory
    finally:
        log.heads = real  # type: ignore[method-assign]
    assert any(not current for items in from_memory for _, _, current in items)  # a superseded fact ranked


def test_a_record_forgotten_between_ranking_and_reading_makes_room_for_the_next(service: MemoryService) -> None:
    say(service, "s1", datetime(2024, 1, 1, tzinfo=UTC), ("Ola", "I live in Lyon"), ("Kim", "Lyon has great food"),
        ("Ola", "The market in Lyon!"), ("Kim", "Lyon again?"))  # fmt: skip
    before = [i.id for i in service.recall("Lyon", user_id="u", limit=3).items]
    log = service.store.log
    real = log.get
    log.get = lambda user_id, ids: {k: v for k, v in real(user_id, ids).items() if k != before[0]}  # type: ignore[method-assign]
    try:
        after = [i.id for i in service.recall("Lyon", user_id="u", limit=3).items]
    finally:
        log.get = real  # type: ignore[method-assign]
    assert after[:2] == before[1:] and len(after) == 3


def test_an_items_metadata_is_the_callers_own_copy(service: MemoryService) -> None:
    msg = MessageIn(content="I keep bees on the roof", speaker="Ann", metadata={"tags": ["hobby"]})
    service.remember(messages=[msg], user_id="u", session_id="s")
    first = service.recall("bees on the roof", user_id="u").items[0]
    first.metadata["tags"].append("edited")
    assert service.recall("bees on the roof", user_id="u").items[0].metadata == {"tags": ["hobby"]}


@pytest.mark.parametrize("when", [datetime(9999, 12, 30, tzinfo=UTC), datetime(1, 1, 3, tzinfo=UTC)])
def test_a_time_said_at_the_ends_of_the_calendar_is_kept_without_its_relative_dates(
    service: MemoryService, when: datetime
) -> None:
    """"Next week" on 30 December 9999 and "last week" on 3 January of year 1 name no date a
    datetime can hold: the message is stored and found, the time left unresolved."""
    said = "See you next week, and last week was great; next year too, and in the last decade."
    stored = service.remember(messages=[MessageIn(content=said, speaker="Ann", occurred_at=when)], user_id="u",
                              session_id="s").ids  # fmt: skip
    for query in ("What happened last week?", "What is planned for next week?"):
        found = service.recall(query, user_id="u", reference_time=when)
        assert stored[0] in [i.id for i in found.items] and not found.warnings
        deep = service.deep_search(query, user_id="u", reference_time=when)
        assert stored[0] in [i.id for i in deep.items]
        assert not [s.error for s in deep.steps if s.error]


def test_a_verbose_turn_leans_less_on_its_keywords(service: MemoryService) -> None:
    """An agent passes the user's whole turn: BM25 over twenty keywords ranks whatever shares a
    handful of common ones; the keyword step of such a query weighs less, a question's does not."""
    say(service, "s", datetime(2024, 1, 1, tzinfo=UTC), ("user", "The WhatsApp tool must transcribe voice notes"))
    weight = lambda result: next(s.weight for s in result.trace.plan.steps if s.step_id == "bm25")  # noqa: E731
    assert weight(service.recall("What must the WhatsApp tool do?", user_id="u")) == 0.5
    verbose = ("Regarding the WhatsApp project tool from last time, I already gave you the details about voice "
               "notes, customers, payments and the remittance business. What do you need from me to move forward "
               "with the plan this week?")
    assert 0 < weight(service.recall(verbose, user_id="u")) < 0.5


def test_turns_take_their_neighbours_score_between_people_not_from_a_user_to_an_assistant(
    service: MemoryService,
) -> None:
    """Between two people "Yes, last Friday!" means what the turn before asked; a user's request
    to an assistant says what it is about, and lifted by a matching reply next to it, the
    user's turns took the places of the answers."""
    when = datetime(2024, 1, 1, tzinfo=UTC)
    people = say(service, "s1", when, ("Ann", "Did you go to the pottery class?"), ("Bob", "Yes, last Friday!"))
    agent = say(service, "s2", when, ("user", "Plan my week please"),
                ("assistant", "Your pottery class is on Friday at six."), ("user", "Thanks, and groceries?"))  # fmt: skip
    found = {i.id: i for i in service.recall("pottery class", user_id="u", limit=10).items}
    assert found[people[1]].scores.get("context")
    assert found[people[0]].scores.get("bm25")
    for rid in (agent[0], agent[2]):
        assert rid not in found or not found[rid].scores.get("context")
