"""Ingestion: derived facts, supersede with history, per-user graph, LLM extraction that loses nothing."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemoplan.model import MessageIn, PlanStep, QueryPlan, RecallOptions
from mnemoplan.service.service import MemoryService
from tests.conftest import make_service
from tests.llm_server import LoopbackMessagesServer, Reply

SAID = datetime(2023, 5, 8, 14, 0, tzinfo=UTC)


def facts_of(service: MemoryService, user: str) -> list[dict[str, Any]]:
    """The user's facts read by the sentence rules (attribute facts have tests of their own: test_attributes)."""
    service.store.wait_for_writes(user)
    rows = service.store.log.select(f"user_id = '{user}' AND kind = 'fact'",
                                    ["id", "text", "superseded_by", "valid_to", "mention_count", "derived_from",
                                     "metadata"])  # fmt: skip
    return [r for r in rows if '"extractor": "attributes"' not in (r.pop("metadata") or "")]


def test_a_fact_is_read_from_a_message_with_its_resolved_date(service: MemoryService) -> None:
    ids = service.remember(messages=[MessageIn(content="I adopted a puppy named Max yesterday", speaker="Melanie",
                                               occurred_at=SAID)], user_id="u", session_id="s").ids  # fmt: skip
    facts = facts_of(service, "u")
    assert len(facts) == 1 and facts[0]["derived_from"] == ids
    assert "Melanie adopted a puppy named Max" in facts[0]["text"] and "7 May 2023" in facts[0]["text"]


def test_a_repeated_fact_is_reinforced_not_copied(service: MemoryService) -> None:
    for session in ("s1", "s2"):
        service.remember(messages=[MessageIn(content="I love pottery", speaker="Mel")], user_id="u", session_id=session)
    service.store.maintain()  # mention counts reach the log with the next upkeep
    facts = facts_of(service, "u")
    assert len(facts) == 1 and facts[0]["mention_count"] == 2


def test_supersede_keeps_history_and_recall_prefers_the_current_fact(service: MemoryService) -> None:
    service.remember(messages=[MessageIn(content="I live in Lyon", speaker="Zoe", occurred_at=SAID)],
                     user_id="u", session_id="s1")  # fmt: skip
    service.remember(messages=[MessageIn(content="I live in Porto", speaker="Zoe")], user_id="u", session_id="s2")
    facts = {f["text"]: f for f in facts_of(service, "u")}
    old = next(f for t, f in facts.items() if "Lyon" in t)
    new = next(f for t, f in facts.items() if "Porto" in t)
    assert old["superseded_by"] == new["id"] and old["valid_to"] is not None  # history kept
    assert not new["superseded_by"]
    found = service.recall("Where does Zoe live?", user_id="u")
    current = [i for i in found.items if i.kind == "fact"]
    assert current[0].text.startswith("Zoe lives in Porto") and current[0].current
    stale = next(i for i in found.items if i.kind == "fact" and "Lyon" in i.text)
    assert not stale.current and stale.score < current[0].score
    history = service.deep_search("Zoe lives", user_id="u", plan=QueryPlan(query="Zoe lives", steps=[
        PlanStep(step_id="f", index="fact_store", params={"include_superseded": True})]))  # fmt: skip
    assert {"Lyon", "Porto"} <= {w for i in history.items for w in ("Lyon", "Porto") if w in i.text}


def test_moving_somewhere_replaces_where_one_lives(service: MemoryService) -> None:
    service.remember(messages=[MessageIn(content="I live in Lyon", speaker="Zoe", occurred_at=SAID)],
                     user_id="u", session_id="s1")  # fmt: skip
    service.remember(messages=[MessageIn(content="I moved to Porto in March", speaker="Zoe")], user_id="u",
                     session_id="s2")  # fmt: skip
    facts = {f["text"]: f for f in facts_of(service, "u")}
    old = next(f for t, f in facts.items() if "Lyon" in t)
    new = next(f for t, f in facts.items() if "Porto" in t)
    assert old["superseded_by"] == new["id"] and not new["superseded_by"]
    found = service.recall("Where does Zoe live?", user_id="u")
    assert "Porto" in found.items[0].text  # the current place first, not the old one
    lines = found.context.splitlines()
    assert all(("(outdated)" in line) == ("Lyon" in line) for line in lines if line.startswith("- "))
    said = {i.text: i for i in found.items if i.kind == "message"}
    assert not said["I live in Lyon"].current and said["I moved to Porto in March"].current
    current = service.recall("Where does Zoe live?", user_id="u", options=RecallOptions(current_only=True))
    assert all("Lyon" not in i.text for i in current.items)


def test_a_move_from_one_place_to_another_replaces_the_first(service: MemoryService) -> None:
    service.remember(messages=[MessageIn(content="I live in Lyon", speaker="Zoe", occurred_at=SAID)],
                     user_id="u", session_id="s1")  # fmt: skip
    service.remember(messages=[MessageIn(content="I moved from Lyon to Porto in March", speaker="Zoe",
                                               occurred_at=SAID)],
                     user_id="u", session_id="s2")  # fmt: skip
    facts = {f["text"]: f for f in facts_of(service, "u")}
    assert set(facts) == {"Zoe lives in Lyon.", "Zoe moved from Lyon to Porto in March 2023, and lives in Porto."}
    old, new = facts["Zoe lives in Lyon."], facts["Zoe moved from Lyon to Porto in March 2023, and lives in Porto."]
    assert old["superseded_by"] == new["id"] and not new["superseded_by"]


def test_forgetting_what_replaced_a_fact_makes_it_current_again(service: MemoryService) -> None:
    service.remember(messages=[MessageIn(content="I live in Lyon", speaker="Zoe", occurred_at=SAID)],
                     user_id="u", session_id="s1")  # fmt: skip
    moved = service.remember(messages=[MessageIn(content="I moved to Porto", speaker="Zoe")], user_id="u",
                             session_id="s2").ids  # fmt: skip
    service.forget(ids=moved, user_id="u")
    rows = service.store.log.select("user_id = 'u'", ["text", "superseded_by", "valid_to"])
    assert rows and all(not r["superseded_by"] and r["valid_to"] is None for r in rows)
    found = service.recall("Where does Zoe live?", user_id="u", options=RecallOptions(current_only=True))
    assert "I live in Lyon" in [i.text for i in found.items]


def test_being_one_thing_does_not_replace_being_another(service: MemoryService) -> None:
    service.remember(messages=[MessageIn(content="I'm a shooting guard for the team", speaker="John",
                                         occurred_at=SAID)], user_id="u", session_id="s1")  # fmt: skip
    service.remember(messages=[MessageIn(content="I'm a total movie fan", speaker="John")], user_id="u",
                     session_id="s2")  # fmt: skip
    facts = facts_of(service, "u")
    assert len(facts) == 2 and not any(f["superseded_by"] for f in facts)


def test_a_denial_or_the_same_place_again_replaces_nothing(service: MemoryService) -> None:
    for i, text in enumerate(["I live in Lyon", "I don't live in Paris", "I moved to Porto", "I live in Porto"]):
        service.remember(messages=[MessageIn(content=text, speaker="Zoe")], user_id="u", session_id=f"s{i}")
    replaced = {f["text"].split(" in the week")[0]: bool(f["superseded_by"]) for f in facts_of(service, "u")}
    assert [t for t, gone in replaced.items() if gone] == [next(t for t in replaced if "Lyon" in t)]
    said = service.store.log.select("user_id = 'u' AND kind = 'message'", ["text", "superseded_by"])
    assert {r["text"] for r in said if r["superseded_by"]} == {"I live in Lyon"}


def test_a_denial_of_an_irregular_verb_contradicts_the_claim(service: MemoryService) -> None:
    for i, text in enumerate(["I have a red car", "I don't have a red car"]):
        service.remember(messages=[MessageIn(content=text, speaker="Zoe")], user_id="u", session_id=f"s{i}")
    claim, denial = sorted(service.store.log.records("user_id = 'u' AND kind = 'fact'"), key=lambda f: "not" in f.text)
    assert denial.metadata["contradicts"] == claim.id  # "does not have" is "has" denied, not "haves"


def test_a_hedged_move_does_not_replace_a_place_said_for_sure(service: MemoryService) -> None:
    texts = ["I live in Lyon", "I think I moved to Porto, not sure", "We moved to Paris"]
    for i, text in enumerate(texts):
        service.remember(messages=[MessageIn(content=text, speaker="Zoe")], user_id="u", session_id=f"s{i}")
    facts = {f["text"].split(",")[0].rstrip("."): f for f in facts_of(service, "u")}
    paris = facts["Zoe moved to Paris"]
    # The hedge left Lyon current; the move said for sure ("we" includes the speaker) replaces both.
    replaced_by = {facts[t]["superseded_by"] for t in ("Zoe lives in Lyon", "Perhaps Zoe moved to Porto")}
    assert replaced_by == {paris["id"]}
    assert not paris["superseded_by"]


def test_a_hedge_said_again_for_sure_replaces_the_hedge_and_the_old_place(service: MemoryService) -> None:
    texts = ["I live in Lyon", "I think I moved to Porto, not sure", "I moved to Porto"]
    ids = [service.remember(messages=[MessageIn(content=text, speaker="Zoe")], user_id="u", session_id=f"s{i}").ids[0]
           for i, text in enumerate(texts)]  # fmt: skip
    facts = {tuple(f["derived_from"]): f for f in facts_of(service, "u")}
    sure = facts[(ids[2],)]
    assert {facts[(ids[0],)]["superseded_by"], facts[(ids[1],)]["superseded_by"]} == {sure["id"]}
    assert not sure["superseded_by"]


def test_a_move_in_legs_is_kept_by_its_last_place_and_replaced_by_another(service: MemoryService) -> None:
    texts = ["I moved to Paris in 2010 and to Rome in 2015", "I live in Rome", "I live in Paris"]
    ids = [service.remember(messages=[MessageIn(content=text, speaker="Zoe")], user_id="u", session_id=f"s{i}").ids[0]
           for i, text in enumerate(texts)]  # fmt: skip
    move, rome, paris = (next(f for f in facts_of(service, "u") if f["derived_from"] == [i]) for i in ids)
    # Rome is where the move ended: it replaces nothing; Paris again replaces both.
    assert (move["superseded_by"], rome["superseded_by"]) == (paris["id"], paris["id"])
    assert not paris["superseded_by"]


def test_forgetting_the_middle_of_a_chain_points_the_first_at_the_last(service: MemoryService) -> None:
    ids = [service.remember(messages=[MessageIn(content=f"I live in {city}", speaker="Zoe")], user_id="u",
                            session_id=f"s{i}").ids[0] for i, city in enumerate(["Lyon", "Porto", "Paris"])]  # fmt: skip
    service.forget(ids=[ids[1]], user_id="u")
    rows = {r["text"]: r for r in service.store.log.select("user_id = 'u'", ["id", "text", "superseded_by"])}
    paris_fact = next(r["id"] for t, r in rows.items() if "Paris" in t and t != "I live in Paris")
    assert rows["I live in Lyon"]["superseded_by"] == paris_fact and not rows["I live in Paris"]["superseded_by"]
    current = [f for f in facts_of(service, "u") if not f["superseded_by"]]
    assert len(current) == 1 and "Paris" in current[0]["text"]


def test_a_message_reopens_with_any_of_its_facts(service: MemoryService) -> None:
    first = service.remember(messages=[MessageIn(content="I live in Lyon and I work at Google", speaker="Zoe")],
                             user_id="u", session_id="s1").ids[0]  # fmt: skip
    moved = service.remember(messages=[MessageIn(content="I live in Porto", speaker="Zoe")], user_id="u",
                             session_id="s2").ids  # fmt: skip
    service.remember(messages=[MessageIn(content="I work at Apple", speaker="Zoe")], user_id="u", session_id="s3")
    assert service.store.log.get("u", [first])[first].superseded_by  # both its facts replaced
    service.forget(ids=moved, user_id="u")
    assert not service.store.log.get("u", [first])[first].superseded_by  # Lyon is where she lives again


def test_a_message_stays_current_while_any_fact_read_from_it_is(service: MemoryService) -> None:
    service.remember(messages=[MessageIn(content="I live in Lyon and I love sailing", speaker="Zoe",
                                         occurred_at=SAID)], user_id="u", session_id="s1")  # fmt: skip
    service.remember(messages=[MessageIn(content="I live in Porto", speaker="Zoe")], user_id="u", session_id="s2")
    facts = facts_of(service, "u")
    assert any("sailing" in f["text"] and not f["superseded_by"] for f in facts)
    first = service.store.log.select("user_id = 'u' AND kind = 'message'", ["text", "superseded_by"])
    assert {r["text"]: r["superseded_by"] for r in first}["I live in Lyon and I love sailing"] == ""


def test_the_entity_graph_is_per_user(service: MemoryService) -> None:
    service.remember(messages=[MessageIn(content="We went hiking with Bartholomew in Snowdonia", speaker="Ann")],
                     user_id="a", session_id="s")  # fmt: skip
    service.remember(messages=[MessageIn(content="Nothing much today", speaker="Bob")], user_id="b", session_id="s")
    service.store.wait_for_writes()
    plan = QueryPlan(query="x", steps=[PlanStep(step_id="g", index="entity_graph",
                                                params={"entities": ["Bartholomew", "Snowdonia"]})])  # fmt: skip
    assert service.deep_search("Bartholomew", user_id="a", plan=plan).items
    assert service.deep_search("Bartholomew", user_id="b", plan=plan).items == []
    assert "bartholomew" not in service.store.catalog("b").entities


def extraction_service(
    tmp_path: Path, server: LoopbackMessagesServer, llm_timeout_s: float = 60.0
) -> MemoryService:
    """A service whose LLM is the loopback server. The LLM timeout is generous: a reply the test
    scripts must never time out because the machine is busy (or a responder does real work, such
    as a forget); a test of the timeout itself scripts a reply that never comes."""
    return make_service(tmp_path / "data", ANTHROPIC_API_KEY="k", ANTHROPIC_BASE_URL=server.url,
                        llm_timeout_s=llm_timeout_s, llm_extraction_every=2)  # fmt: skip


def wait_until(condition: Any, timeout: float = 120.0) -> None:
    """Wait for background work to reach ``condition``; the bound only ends a test that hangs."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_llm_extraction_failures_lose_nothing_and_are_retried(tmp_path: Path) -> None:
    good = {"facts": [{"kind": "fact", "content": "Ivo plays the cello in a quartet", "subject": "Ivo",
                       "predicate": "plays", "object": "the cello", "entities": ["Ivo"], "confidence": 0.9,
                       "sources": [1]}]}  # fmt: skip
    with LoopbackMessagesServer() as server:
        # Garbage (and garbage again after the client's repair request), then a reply that never comes
        # (answered only when the server stops), then a good reply.
        server.script(Reply("lol no"), Reply("still no"), Reply("{}", delay_s=600), Reply(json.dumps(good)))
        svc = extraction_service(tmp_path, server, llm_timeout_s=3.0)
        try:
            msgs = [MessageIn(content="Rehearsal went long tonight", speaker="Ivo"),
                    MessageIn(content="The quartet needs me on cello again", speaker="Ivo")]  # fmt: skip
            stored = svc.remember(messages=msgs, user_id="u", session_id="s")
            assert stored.stored == 2  # remember never waits for the LLM
            svc.extraction.drain()
            assert svc.extraction.counters["failed"] == 1 and svc.extraction.pending  # still pending
            assert svc.store.log.count("user_id = 'u' AND kind = 'message'") == 2  # nothing lost
            svc.extraction.retry_now()
            svc.extraction.drain()
            assert svc.extraction.counters["failed"] == 2 and svc.extraction.pending  # the timeout
            svc.extraction.retry_now()
            svc.extraction.drain()
            assert not svc.extraction.pending and svc.extraction.counters["facts"] == 1
            llm_facts = [f for f in facts_of(svc, "u") if "cello" in f["text"]]
            assert llm_facts and llm_facts[0]["derived_from"] == [stored.ids[0]]
            # Forgetting the source message forgets the extracted fact too.
            svc.forget(ids=[stored.ids[0]], user_id="u")
            assert not [f for f in facts_of(svc, "u") if "cello" in f["text"]]
        finally:
            svc.close()


def test_the_llm_reads_attributes_the_rules_do_not_and_they_supersede_like_the_rules(tmp_path: Path) -> None:
    def respond(body: dict[str, Any]) -> Reply:
        prompt = json.dumps(body)
        facts = []
        if "Zalando" in prompt:  # a phrasing no rule reads; the LLM says what it means
            facts.append({"content": "The user works at Zalando", "subject": "user", "predicate": "works at",
                          "object": "Zalando", "sources": [1], "attribute": "employer", "value": "Zalando"})
        if "so long" in prompt:  # an ending naming what it ends is no value of it
            facts.append({"content": "The user left Zalando", "subject": "user", "predicate": "left",
                          "object": "Zalando", "sources": [1], "attribute": "employer", "value": "Zalando",
                          "ended": True})
        elif "Farfetch" in prompt:  # what the rules read too: the same value again, nothing new
            facts.append({"content": "The user works at Farfetch", "subject": "user", "predicate": "works at",
                          "object": "Farfetch", "sources": [1], "attribute": "employer", "value": "Farfetch"})
        return Reply(json.dumps({"facts": facts}))

    with LoopbackMessagesServer() as server:
        server.responder = respond
        svc = extraction_service(tmp_path, server)
        try:
            day = datetime(2025, 3, 1, tzinfo=UTC)
            for i, (session, text) in enumerate([("a", "I work at Farfetch and the team is lovely"),
                                                 ("a", "what should I cook tonight?"),
                                                 ("b", "first week with the Zalando crew went great!!"),
                                                 ("b", "any tips for a long commute?")]):
                svc.remember(messages=[MessageIn(content=text, speaker="user", occurred_at=day.replace(month=3 + i))],
                             user_id="u", session_id=session)
            wait_until(lambda: not svc.extraction.pending)
            svc.extraction.drain()
            items = svc.recall("where do I work?", user_id="u", limit=5).items
            assert "Zalando" in items[0].text and items[0].kind == "fact" and items[0].current
            assert items[0].metadata["extractor"] == "llm"
            assert all(not i.current for i in items if "Farfetch" in i.text)
            rows = svc.store.log.select("user_id = 'u' AND kind = 'fact'", ["text", "metadata", "superseded_by"])
            employer = sorted((json.loads(r["metadata"])["extractor"], r["text"], bool(r["superseded_by"]))
                              for r in rows if json.loads(r["metadata"]).get("attribute") == "employer")
            # one fact per value: the LLM's reading of Farfetch is the rules' again, and adds nothing
            assert employer == [("attributes", "User works at Farfetch.", True), ("llm", "User works at Zalando.", False)]
            for i, text in enumerate(["so long, crew: that was my final shift", "what's a good book for a flight?"]):
                svc.remember(messages=[MessageIn(content=text, speaker="user", occurred_at=day.replace(month=8 + i))],
                             user_id="u", session_id="c")
            wait_until(lambda: not svc.extraction.pending)
            svc.extraction.drain()
            rows = svc.store.log.select("user_id = 'u' AND kind = 'fact'", ["text", "superseded_by"])
            held = {r["text"]: bool(r["superseded_by"]) for r in rows}
            assert held["User works at Zalando."] and not held["User has no employer any more."]
        finally:
            svc.close()


def test_a_message_forgotten_while_the_llm_reads_its_batch_leaves_no_fact(tmp_path: Path) -> None:
    """The LLM reads a whole batch; a message of it forgotten before the facts are stored may be
    in any of them (whatever they cite): the facts are dropped and what is left is read again."""
    said = ["My bank PIN is 4812", "I adopted a cat named Miso"]
    calls: list[str] = []

    def fact(text: str) -> dict[str, Any]:
        return {"kind": "fact", "content": text, "subject": "Ann", "predicate": "has", "object": "x",
                "entities": ["Ann"], "confidence": 0.9, "sources": [1]}  # fmt: skip

    with LoopbackMessagesServer() as server:
        svc = extraction_service(tmp_path, server)

        def respond(body: dict[str, Any]) -> Reply:
            prompt = json.dumps(body)
            calls.append(prompt)
            if len(calls) == 1:  # the user forgets the PIN while the LLM reads it
                svc.forget(ids=[ids[0]], user_id="u")
                return Reply(json.dumps({"facts": [fact("Ann's cat is named Miso; her PIN is 4812")]}))
            return Reply(json.dumps({"facts": [fact("Ann has a cat named Miso")]}))

        server.responder = respond
        try:
            ids = svc.remember(messages=[MessageIn(content=t, speaker="Ann") for t in said], user_id="u",
                               session_id="s").ids  # fmt: skip
            wait_until(lambda: len(calls) == 2 and not svc.extraction.pending)
            svc.extraction.drain()
            assert "4812" in calls[0] and "4812" not in calls[1]  # read again without the forgotten one
            texts = [r["text"] for r in svc.store.log.select("user_id = 'u'", ["text"])]
            assert "Ann has a cat named Miso" in texts and not [t for t in texts if "4812" in t]
        finally:
            svc.close()


def test_pending_extraction_survives_a_restart(tmp_path: Path) -> None:
    with LoopbackMessagesServer() as server:
        server.script(Reply(status=500), Reply(status=500))
        svc = extraction_service(tmp_path, server)
        try:
            svc.remember(messages=[MessageIn(content="a", speaker="X"), MessageIn(content="b", speaker="X")],
                         user_id="u", session_id="s")  # fmt: skip
            svc.extraction.drain()
            assert svc.extraction.pending
        finally:
            svc.close()
        server.script(Reply(json.dumps({"facts": []})))
        svc = extraction_service(tmp_path, server)  # start-up retries what was pending
        try:
            wait_until(lambda: not svc.extraction.pending)
        finally:
            svc.close()
