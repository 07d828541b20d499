"""Attributes that change: statements read by rule, newer values superseding older ones (old
facts and the messages that stated them), endings, corrections, controls that change nothing,
facts stated by the agent, and questions about now and about before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mnemoplan.bench.updates import judge, load, mentions as label_mentions
from mnemoplan.errors import InvalidInput
from mnemoplan.extract.attributes import asked_attribute, attribute_statements, mentions
from mnemoplan.model import FactIn, MemoryItem, MessageIn, RecallOptions
from mnemoplan.service.service import MemoryService

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)


def said(text: str) -> list[tuple[str, str, bool, bool, str]]:
    return [(s.attribute, s.value, s.ending, s.adds, s.replaces) for s in attribute_statements(text)]


def values(text: str) -> dict[str, str]:
    return {s.attribute: s.value for s in attribute_statements(text) if s.value and not s.replaces}


# -- reading statements ------------------------------------------------------------------


def test_a_value_is_read_from_the_frame_of_its_cue() -> None:
    assert values("I work at Rakuten and the all-hands is in Japanese")["employer"] == "Rakuten"
    assert values("my first week at Siemens Healthineers went really well!")["employer"] == "Siemens Healthineers"
    assert values("our neighbours here in Portland are so sweet")["home_city"] == "Portland"
    assert values("my girlfriend Ingrid and I are going north")["partner"] == "Ingrid"
    got = values("I'm a support engineer at Atlassian in Sydney.")
    assert got["job_title"] == "support engineer" and got["employer"] == "Atlassian"
    assert values("my favourite band is Arctic Monkeys and I want to learn a song")["favourite_band"] == "Arctic Monkeys"


def test_someone_elses_value_a_hedge_or_a_visit_state_nothing_of_the_speaker() -> None:
    assert not values("my brother just moved to Galway for his new job")
    assert "partner" not in values("my sister introduced us to her new boyfriend Joris")
    assert not values("we might move to Porto one day, who knows")
    assert "employer" not in values("I'm thinking about applying to Adyen, a recruiter messaged me")
    assert not values("home from a week in Kraków, the trip was great")


def test_a_value_before_a_hedge_still_stands() -> None:
    assert values("my girlfriend Sofie and I want to do a winter cabin trip")["partner"] == "Sofie"


def test_endings_and_corrections_are_read() -> None:
    assert ("partner", "", True, False, "") in said("we broke up last week. four years.")
    corrected = [s for s in attribute_statements("wait no sorry, KPMG, not Deloitte.") if s.replaces]
    assert corrected and corrected[0].value == "KPMG" and corrected[0].replaces == "Deloitte"
    corrected = [s for s in attribute_statements("oops — program manager, not project manager!") if s.replaces]
    assert corrected and corrected[0].value == "program manager" and corrected[0].replaces == "project manager"


def test_a_name_says_what_it_is_without_a_cue_word() -> None:
    """A maker or product line types a name ("my Framework Laptop 13"), with its model number;
    "Dr." names a doctor; "my new iPhone 13" is the speaker's whoever else the sentence names."""
    assert values("upgraded the RAM on my Framework Laptop 13 myself")["laptop"] == "Framework Laptop 13"
    assert values("my Pixel 7 screen has a green line across it.")["phone"] == "Pixel 7"
    assert values("Dr. Moreau did my cleaning today, she's so gentle")["doctor"] == "Moreau"
    assert values("My son set up my new iPhone 13 for me yesterday.")["phone"] == "iPhone 13"
    assert values("finally sold the Civic and bought a Mazda CX-5, 2021, red.")["car"] == "Mazda CX-5"
    assert not values("my dad just bought a Lexus at 70 years old, he's so proud")
    assert not values("the pixel is at the repair shop so I'm using my mum's old iPhone SE in the meantime")


def test_lower_case_values_are_read_from_their_frames_and_classes() -> None:
    assert values("my usual is an oat flat white. is oat milk healthy?")["coffee_order"] == "oat flat white"
    assert values("gaming is my main hobby, I play like 20 hours a week")["hobbies"] == "gaming"
    assert values("I take the Overground to work and it's usually fine")["commute"] == "Overground"
    assert "commute" not in values("during the strike I had to take an Uber to work for three days")
    assert values("three weeks ago I started Arabic classes, the script is hard")["languages"] == "arabic"
    assert values("I'm officially 30 now, birthday was on saturday")["age"] == "30"


def test_a_clause_before_a_question_states_but_the_question_does_not() -> None:
    assert values("my Skoda Octavia needs new winter tyres, what size should I look for?")["car"] == "Skoda Octavia"
    assert not values("should I move to Porto, is it nice?")


def test_a_change_names_what_it_ends() -> None:
    joined = attribute_statements("I cancelled McFit and joined John Reed Fitness, it's got a pool.")
    assert [(s.attribute, s.value, s.closes) for s in joined] == [("gym", "John Reed Fitness", "McFit")]
    instead = attribute_statements("I started Arabic classes instead of Spanish")
    assert [(s.value, s.closes) for s in instead] == [("arabic", "Spanish")]
    assert ("", "", True, False, "") in said("French is on hold.")
    fixed = attribute_statements("sorry no, macchiato! I always say cappuccino by accident.")
    assert [(s.attribute, s.value) for s in fixed] == [("coffee_order", "macchiato")]
    assert not attribute_statements("no worries!") and not attribute_statements("sorry, I didn't mean to be rude")
    assert not attribute_statements("No, Paris!")  # a bare name could correct anything: it corrects nothing
    assert not attribute_statements("My favourite is now the one you suggested")
    replaced = attribute_statements("I replaced the ThinkPad with a MacBook Air")
    assert [(s.value, s.closes) for s in replaced] == [("MacBook Air", "ThinkPad")]


def test_a_second_value_adds() -> None:
    adds = [s for s in attribute_statements("I also started doing weddings, I'm a wedding photographer on the side")
            if s.attribute == "job_title"]
    assert adds and adds[0].adds


def test_questions_name_the_attribute_they_ask_about_and_whether_the_past() -> None:
    assert asked_attribute("where do I live these days?") == ("home_city", False)
    assert asked_attribute("who do I work for now?") == ("employer", False)
    assert asked_attribute("what do I do for a job?")[0] == "job_title"
    assert asked_attribute("Where did I live before Rotterdam?") == ("home_city", True)
    assert asked_attribute("When did Caroline move to Sweden?") == ("", False)  # not the asker's


def test_a_long_message_that_names_an_attribute_in_passing_asks_about_none() -> None:
    """An agent's recall gets the user's whole turn: a cue word anywhere in it put the user's
    current home or employer first for half of such turns."""
    chatty = ("Hey mate, I'm feeling about 80% better after that flu, ready to get back into my training. "
              "The new place I live in has a gym downstairs, so let's plan the next block of sessions.")
    assert asked_attribute(chatty) == ("", False)
    assert asked_attribute("Thanks, that helps a lot! Remind me where I live these days?") == ("home_city", False)
    assert asked_attribute("Got it.\nWho do I work for now?") == ("employer", False)
    assert asked_attribute("remind me my email address")[0] == "email"
    assert asked_attribute("my employer") == ("employer", False)  # a short query is a question as a whole
    assert asked_attribute("Sure, sounds good. Could you tell me where I work") == ("employer", False)

def test_a_value_is_named_by_its_distinctive_words_only() -> None:
    assert mentions("the Civic needs a new converter", "Honda Civic")
    assert not mentions("I'm a project manager", "program manager", unlike="project manager")
    assert not mentions("I love the university library", "University of Melbourne")


# -- ingest and recall -------------------------------------------------------------------


def tell(service: MemoryService, user: str, turns: list[tuple[str, str]], start: datetime = T0) -> None:
    for i, (speaker, text) in enumerate(turns):
        message = MessageIn(content=text, speaker=speaker, occurred_at=start + timedelta(days=20 * i))
        service.remember(messages=[message], user_id=user, session_id=f"session_{i}")


def ask(service: MemoryService, user: str, query: str) -> list[MemoryItem]:
    return service.recall(query, user_id=user, limit=5).items


def test_a_new_value_supersedes_the_old_fact_and_the_messages_that_stated_it(service: MemoryService) -> None:
    tell(service, "u", [("user", "I work at Farfetch and I love the team"),
                        ("assistant", "Farfetch sounds like a great place to work!"),
                        ("user", "what's a good pasta recipe for two?"),
                        ("user", "big news: I left Farfetch and now I'm at Booking.com")])
    items = ask(service, "u", "Where do I work?")
    assert "Booking.com" in items[0].text and items[0].current
    old = [i for i in items if "Farfetch" in i.text and "Booking" not in i.text]
    assert old and all(not i.current for i in old)
    rows = service.store.log.select("user_id = 'u' AND superseded_by != ''", ["text", "valid_to"])
    assert rows and all(r["valid_to"] is not None for r in rows)  # kept, as history, with its end
    unrelated = service.store.log.select("user_id = 'u' AND text LIKE '%pasta%'", ["superseded_by"])
    assert unrelated and not unrelated[0]["superseded_by"]


def test_the_past_is_answered_from_history(service: MemoryService) -> None:
    tell(service, "u", [("user", "I live in Utrecht and the rent is wild"),
                        ("user", "update: we moved to Rotterdam! new place is near the park")])
    now = ask(service, "u", "where do I live these days?")
    assert "Rotterdam" in now[0].text and now[0].current
    before = ask(service, "u", "Where did I live before Rotterdam?")
    assert "Utrecht" in before[0].text and not before[0].current
    held = before[0].metadata  # with the interval it held
    assert held["valid_from"] == T0.isoformat() and held["valid_to"] == (T0 + timedelta(days=20)).isoformat()


def test_an_ending_closes_the_value_without_a_new_one(service: MemoryService) -> None:
    tell(service, "u", [("user", "my boyfriend Marco is cooking tonight"),
                        ("user", "we broke up last week. four years.")])
    items = ask(service, "u", "who is my boyfriend?")
    marco = [i for i in items if "Marco" in i.text]
    assert marco and all(not i.current for i in marco)


def test_controls_change_nothing(service: MemoryService) -> None:
    tell(service, "u", [("user", "I live in Cork and want to start sea swimming"),
                        ("user", "my brother just moved to Galway for his new job"),
                        ("user", "we could end up in Limerick one day, who knows"),
                        ("user", "home from Kraków, what a trip")])
    items = ask(service, "u", "remind me where I live")
    assert "Cork" in items[0].text
    assert all(i.current for i in items if "Cork" in i.text)


def doubted_by_the_first(items: list[MemoryItem], name: str) -> bool:
    """Whether items naming ``name`` are returned, each current and said, for this answer, to have
    possibly changed by the first item (precision first: only a statement of a change outdates)."""
    old = [i for i in items if name in i.text]
    return bool(old) and all(i.current and i.metadata["possibly_changed"]["by"] == items[0].id for i in old)


def test_a_value_the_asker_calls_new_comes_first_and_the_old_one_may_have_changed(
    service: MemoryService,
) -> None:
    tell(service, "u", [("user", "I drive a Honda Civic, it's old but fine"),
                        ("user", "the Kia EV6 charges in 20 minutes, best car for road trips"),
                        ("user", "the new Kia EV6 charges in 20 minutes, best car ever")])
    items = ask(service, "u", "what car do I drive?")
    assert "Kia EV6" in items[0].text  # a value the asker calls new, stored beside the Civic
    assert doubted_by_the_first(items, "Civic")
    # nothing is marked outdated, nor closed in the store: no statement says the Civic is gone
    assert all(i.current for i in items)
    assert not service.store.log.select("user_id = 'u' AND superseded_by != ''", ["id"])
    assert "(may have changed)" in service.recall("what car do I drive?", user_id="u", limit=5).context
    kept = service.recall("what car do I drive?", user_id="u", limit=5, options=RecallOptions(current_only=True))
    assert any("Civic" in i.text for i in kept.items)
    # a name of the kind the words do not give to the asker does not lead
    tell(service, "v", [("user", "I drive a Honda Civic, it's old but fine"),
                        ("user", "the Kia EV6 charges in 20 minutes, best car for road trips")])
    first = ask(service, "v", "what car do I drive?")[0]
    assert "Civic" in first.text and "possibly_changed" not in first.metadata


def test_a_value_the_asker_mentions_as_theirs_without_a_change_stands_beside_the_held_one(
    service: MemoryService,
) -> None:
    tell(service, "u", [("user", "my work phone is a Pixel 7, how do I stop checking mail at night?"),
                        ("user", "my iPhone 14 screen cracked, is it worth repairing?")])
    rows = service.store.log.select("user_id = 'u' AND kind = 'fact' AND text LIKE '%phone is%'",
                                    ["text", "superseded_by"])
    assert {r["text"]: bool(r["superseded_by"]) for r in rows} == {"User's phone is Pixel 7.": False,
                                                                   "User's phone is iPhone 14.": False}
    items = ask(service, "u", "what phone do I have?")
    assert "iPhone 14" in items[0].text and all(i.current for i in items)
    assert doubted_by_the_first(items, "Pixel 7")


def test_company_and_names_in_passing_are_no_new_value(service: MemoryService) -> None:
    tell(service, "u", [("user", "my dog Bella is 14 now and she sleeps all day"),
                        ("user", "walked the dog with Emma this morning, so sunny"),
                        ("user", "my dog chewed my Nike shoes again, and she loves Central Park"),
                        ("user", "Watched Inception last night, still great")])
    items = ask(service, "u", "what's my dog's name?")
    assert "Bella" in items[0].text and all(i.current for i in items)


def test_an_older_message_naming_another_value_may_have_changed_by_the_fact(service: MemoryService) -> None:
    # the old value was said where no rule reads it, so the store has nothing to close
    tell(service, "u", [("user", "the tram was packed again this morning, stood the whole way to work"),
                        ("user", "I cycle to work now, 25 minutes door to door")])
    items = ask(service, "u", "how do I get to work?")
    assert "cycle" in items[0].text and items[0].kind == "fact"
    assert doubted_by_the_first(items, "tram")


def test_a_new_one_beside_a_cue_stands_beside_the_held_value_and_a_name_in_passing_changes_nothing(
    service: MemoryService,
) -> None:
    tell(service, "v", [("user", "my dog Rex is 12 and still loves the beach"),
                        ("user", "the groomer says Pepper, our new puppy, has lovely fur"),
                        ("user", "my dog chewed my Nike shoes again, and she loves Central Park"),
                        ("user", "the BMW from next door blocked my driveway again"),
                        ("user", "Dr. Seuss was my favourite as a kid")])
    rows = service.store.log.select("user_id = 'v' AND kind = 'fact' AND metadata LIKE '%attribute%'",
                                    ["text", "superseded_by"])
    # a new puppy is no sign that Rex is gone: both hold; no car, no doctor, no pet Nike
    assert {r["text"]: bool(r["superseded_by"]) for r in rows} == {"User's pet is Rex.": False,
                                                                   "User's pet is Pepper.": False}
    items = ask(service, "v", "what's my pet's name?")
    assert "Pepper" in items[0].text and all(i.current for i in items)
    assert doubted_by_the_first(items, "Rex")


def test_a_newer_message_about_someone_else_or_a_plan_does_not_lead(service: MemoryService) -> None:
    tell(service, "u", [("user", "my hair is black and I want a trim"),
                        ("user", "my daughter went blonde for prom, she's worried about damage"),
                        ("user", "thinking about going lilac this summer, not decided"),
                        ("user", "what's the cheapest way to get to Leeds from York")])
    assert "black" in ask(service, "u", "what colour is my hair?")[0].text


def test_a_correction_within_a_session_replaces_at_once(service: MemoryService) -> None:
    tell(service, "u", [("user", "I'm an auditor at Deloitte in Manchester"),
                        ("user", "wait no sorry, KPMG, not Deloitte. I'm at KPMG")], start=T0)
    items = ask(service, "u", "what company am I at?")
    assert "KPMG" in items[0].text
    assert all(not i.current for i in items if "Deloitte" in i.text and "KPMG" not in i.text)


def test_a_typed_name_replaces_the_old_one_and_closes_what_named_it(service: MemoryService) -> None:
    tell(service, "u", [("user", "my ThinkPad T480 is getting slow. is it worth upgrading the RAM?"),
                        ("assistant", "A RAM upgrade helps a T480 a lot, and the ThinkPad is easy to open."),
                        ("user", "ok I replaced the ThinkPad with a MacBook Air M3. it's silent!")])
    items = ask(service, "u", "what laptop do I have?")
    assert "MacBook Air" in items[0].text and items[0].current
    assert all(not i.current for i in items if "ThinkPad" in i.text and "MacBook" not in i.text)


def test_an_unheld_old_value_named_by_the_change_is_closed(service: MemoryService) -> None:
    tell(service, "u", [("user", "the McFit near me is packed at 6pm, best times to go?"),
                        ("user", "I cancelled McFit and joined John Reed Fitness, it's got a pool")])
    items = ask(service, "u", "which gym do I go to?")
    assert "John Reed" in items[0].text
    assert all(not i.current for i in items if "McFit" in i.text and "John Reed" not in i.text)


def test_an_agent_states_a_fact_and_it_supersedes_like_a_message(service: MemoryService) -> None:
    tell(service, "u", [("user", "I drive a Honda Civic, it's old but fine")])
    receipt = service.remember(fact=FactIn(attribute="car", value="Mazda CX-5", occurred_at=T0 + timedelta(days=90)),
                               user_id="u")
    assert receipt.stored == 1
    again = service.remember(fact=FactIn(attribute="car", value="Mazda CX-5"), user_id="u")
    assert again.stored == 0 and again.duplicates == 1
    items = ask(service, "u", "what car do I drive?")
    assert "Mazda" in items[0].text and items[0].current
    assert all(not i.current for i in items if "Civic" in i.text)
    service.remember(fact=FactIn(attribute="car", ended=True), user_id="u")
    mazda = [i for i in ask(service, "u", "what car do I drive?") if "Mazda" in i.text]
    assert mazda and all(not i.current for i in mazda)


def test_a_value_said_before_the_held_one_is_history_not_a_change(service: MemoryService) -> None:
    tell(service, "u", [("user", "I drive a Mazda CX-5 now, so much space")], start=T0 + timedelta(days=90))
    late = service.remember(fact=FactIn(attribute="car", value="Honda Civic", occurred_at=T0), user_id="u")
    assert late.stored == 0  # dated before the Mazda: it cannot replace it
    items = ask(service, "u", "what car do I drive?")
    assert "Mazda" in items[0].text and items[0].current


def test_an_ending_naming_no_attribute_is_not_held_back_by_another_attributes_newer_value(
    service: MemoryService,
) -> None:
    tell(service, "u", [("user", "I work at Rakuten, the office is huge")])
    service.remember(fact=FactIn(attribute="pet", value="Miso", occurred_at=T0 + timedelta(days=200)), user_id="u")
    tell(service, "u", [("user", "I left Rakuten last week")], start=T0 + timedelta(days=100))
    rows = service.store.log.select("user_id = 'u' AND kind = 'fact' AND text LIKE '%Rakuten%'", ["superseded_by"])
    assert rows and all(r["superseded_by"] for r in rows)


def test_a_new_phone_number_replaces_the_old_one(service: MemoryService) -> None:
    tell(service, "u", [("user", "my phone number is 0612 345 678, in case you need it for the booking"),
                        ("assistant", "Got it, I'll use 0612 345 678 for the booking."),
                        ("user", "what's a good pasta recipe"),
                        ("user", "my number is now +31 687 111 222, I switched carriers")])
    for question in ("what's my phone number?", "what is my number?"):
        items = ask(service, "u", question)
        assert "687 111 222" in items[0].text and items[0].current, question
        old = [i for i in items if "345 678" in i.text]
        assert old and all(not i.current for i in old), question
    assert values("call me on 020 7946 0958 any time") == {"phone_number": "020 7946 0958"}
    assert not values("my order number is 88123456, it never arrived")
    assert not values("my mum's number is 0612 999 888")


def test_a_stated_fact_with_a_naive_time_is_taken_as_utc(service: MemoryService) -> None:
    tell(service, "u", [("user", "I drive a Mazda CX-5 now, so much space")], start=T0 + timedelta(days=90))
    late = service.remember(fact=FactIn(attribute="car", value="Honda Civic", occurred_at=datetime(2000, 1, 1)),
                            user_id="u")
    assert late.stored == 0


def test_a_stated_fact_is_checked(service: MemoryService) -> None:
    with pytest.raises(InvalidInput):
        service.remember(fact=FactIn(attribute="car"), user_id="u")
    with pytest.raises(InvalidInput):
        service.remember(fact=FactIn(attribute=" ", value="x"), user_id="u")
    with pytest.raises(InvalidInput):
        service.remember(content="hi", fact=FactIn(attribute="car", value="x"), user_id="u")


def test_multi_valued_attributes_accumulate(service: MemoryService) -> None:
    service.remember(fact=FactIn(attribute="languages", value="Spanish"), user_id="u")
    service.remember(fact=FactIn(attribute="languages", value="Portuguese"), user_id="u")
    rows = service.store.log.select("user_id = 'u' AND kind = 'fact'", ["text", "superseded_by"])
    assert len(rows) == 2 and all(not r["superseded_by"] for r in rows)


def test_ending_one_value_leaves_the_attribute(service: MemoryService) -> None:
    # a value of a multi-valued or a lasting attribute ends; the attribute does not
    for attribute, value in (("hobbies", "climbing"), ("hobbies", "chess"), ("favourite_food", "sushi")):
        service.remember(fact=FactIn(attribute=attribute, value=value, occurred_at=T0), user_id="u")
    tell(service, "u", [("user", "I gave up climbing after my shoulder injury"),
                        ("user", "sushi is not my favourite food anymore")], start=T0 + timedelta(days=1))
    rows = service.store.log.select("user_id = 'u' AND kind = 'fact'", ["text", "superseded_by"])
    held = {r["text"]: bool(r["superseded_by"]) for r in rows}
    assert held["User's hobby is climbing."] and not held["User's hobby is chess."]
    assert held["User's favourite food is sushi."]
    assert not any("any more" in text for text in held)  # no "User has no hobbies any more"


# -- the suite ---------------------------------------------------------------------------


def test_the_suite_loads_with_both_splits_and_scores_as_its_readme_says() -> None:
    convs = load()
    assert len(convs) >= 250 and {c["split"] for c in convs} == {"dev", "heldout"}
    assert len({c["attribute"] for c in convs}) >= 20
    conv = {"change": "explicit"}
    q = {"kind": "current", "current": ["Mercari"], "outdated": ["Rakuten"]}
    at = datetime(2024, 1, 1, tzinfo=UTC)
    items = [MemoryItem(id="a", kind="fact", text="User works at Mercari.", occurred_at=at, score=1.0),
             MemoryItem(id="b", kind="message", text="I work at Rakuten", occurred_at=at, score=0.5, current=False),
             MemoryItem(id="c", kind="message", text="Rakuten has a template", occurred_at=at, score=0.4)]
    v = judge(conv, q, items)
    assert v["current_first"] is True and v["outdated_items"] == 2 and v["outdated_marked"] == 1
    control = judge({"change": "control_same"}, {**q, "outdated": []}, items[1:])
    assert control["false_supersede"] is True
    assert label_mentions("two Octavias", ["Octavia"]) and not label_mentions("thinking", ["ing"])


def test_bench_suite_command_runs_a_slice(tmp_path: Path) -> None:
    from mnemoplan.cli.main import main

    out = tmp_path / "out"
    code = main(["bench", "--suite", "updates", "--split", "heldout", "--limit-conversations", "2",
                 "--embedding-model", "hash", "--out", str(out)])
    assert code == 0
    assert (out / "metrics.json").exists() and (out / "report.md").exists() and (out / "questions.jsonl").exists()


def test_between_named_people_only_the_sentence_rules_replace(service: MemoryService) -> None:
    tell(service, "u", [("Zoe", "I live in Lyon and I love sailing"), ("Zoe", "I moved to Porto last month")])
    rows = service.store.log.select("user_id = 'u'", ["kind", "text", "superseded_by", "metadata"])
    assert not [r for r in rows if '"extractor": "attributes"' in (r["metadata"] or "")]
    lyon = next(r for r in rows if r["kind"] == "message" and "Lyon" in r["text"])
    assert lyon["superseded_by"] == ""  # its sailing fact still holds
