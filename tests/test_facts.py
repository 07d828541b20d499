"""Deterministic fact extraction from one chat message."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from mnemoplan.extract.facts import MAX_FACTS, FactCandidate, extract_facts, find_quantities
from mnemoplan.extract.names import entity_key

SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # a Monday


def facts(text: str, speaker: str = "Melanie", **kwargs: object) -> list[FactCandidate]:
    return extract_facts(text, speaker, SAID, **kwargs)  # type: ignore[arg-type]


def triples(text: str, speaker: str = "Melanie") -> list[tuple[str, str, str]]:
    return [(f.subject, f.predicate, f.object) for f in facts(text, speaker)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # copula
        ("I'm a software engineer.", ("Melanie", "is", "a software engineer")),
        ("I was a teacher for years", ("Melanie", "was", "a teacher for years")),
        ("I'm married.", ("Melanie", "is", "married")),
        ("I'm allergic to peanuts.", ("Melanie", "is allergic to", "peanuts")),
        ("I'm from Sweden.", ("Melanie", "is from", "Sweden")),
        ("I'm a big fan of jazz.", ("Melanie", "is a big fan of", "jazz")),
        ("I'm learning Spanish these days.", ("Melanie", "is learning", "Spanish")),
        # possession
        ("I have a dog named Max.", ("Melanie", "has", "a dog named Max")),
        ("I've got two cats.", ("Melanie", "has", "two cats")),
        ("We had a picnic by the lake.", ("Melanie", "had", "a picnic by the lake")),
        # preferences, with -ing objects and infinitives
        ("I love pottery!", ("Melanie", "loves", "pottery")),
        ("I really enjoy painting landscapes.", ("Melanie", "enjoys", "painting landscapes")),
        ("I hate waking up early.", ("Melanie", "hates", "waking up early")),
        ("I prefer tea.", ("Melanie", "prefers", "tea")),
        ("I like to paint with watercolors.", ("Melanie", "likes", "to paint with watercolors")),
        # places, work, study
        ("I live in Boston with my husband.", ("Melanie", "lives in", "Boston with Melanie's husband")),
        ("I moved to Denver.", ("Melanie", "moved to", "Denver")),
        ("I moved from Sweden.", ("Melanie", "moved from", "Sweden")),
        ("I work at a hospital.", ("Melanie", "works at", "a hospital")),
        ("I work as a nurse.", ("Melanie", "works as", "a nurse")),
        ("I study biology.", ("Melanie", "studies", "biology")),
        # past actions with an object
        ("I adopted a puppy named Max.", ("Melanie", "adopted", "a puppy named Max")),
        ("I bought a new car.", ("Melanie", "bought", "a new car")),
        ("I started a pottery class.", ("Melanie", "started", "a pottery class")),
        ("I visited my parents.", ("Melanie", "visited", "Melanie's parents")),
        ("I went to a concert.", ("Melanie", "went to", "a concert")),
        ("I've visited Japan twice.", ("Melanie", "has visited", "Japan twice")),
        # names: "called" and "named" are one slot
        ("My cat is called Miso.", ("Melanie's cat", "is named", "Miso")),
        ("I'm named Mel.", ("Melanie", "is named", "Mel")),
    ],
)
def test_each_pattern_gives_its_fact(text: str, expected: tuple[str, str, str]) -> None:
    assert triples(text)[0] == expected


@pytest.mark.parametrize(
    ("text", "subject", "text_out"),
    [
        ("I love pottery", "Melanie", "Melanie loves pottery."),
        ("My sister is a nurse.", "Melanie's sister", "Melanie's sister is a nurse."),
        ("My kids love painting.", "Melanie's kids", "Melanie's kids love painting."),
        ("My friend has finished the race.", "Melanie's friend", "Melanie's friend has finished the race."),  # "has": no noun
        ("Max is my dog.", "Max", "Max is Melanie's dog."),
        ("We went camping with the kids.", "Melanie", "Melanie went camping with the kids."),
        ("Adopted a kitten!", "Melanie", "Melanie adopted a kitten."),
    ],
)
def test_first_person_resolves_to_the_speaker(text: str, subject: str, text_out: str) -> None:
    fact = facts(text)[0]
    assert (fact.subject, fact.text) == (subject, text_out)
    assert fact.subject_key == entity_key(subject)


def test_we_and_guessed_names_are_less_certain_than_i() -> None:
    assert facts("I went camping.")[0].confidence == 0.9
    assert facts("We went camping.")[0].confidence == 0.6
    assert facts("Max is my dog.")[0].confidence < 0.9
    assert facts("Max is my dog.", known_names=["Max"])[0].confidence == 0.9


def test_third_person_names_are_subjects_only_when_they_look_like_names() -> None:
    assert triples("Yesterday, Caroline adopted a cat.") == [("Caroline", "adopted", "a cat")]
    assert triples("Pepper and Panda are Lab mixes.") == [("Pepper and Panda", "is", "Lab mixes")]
    assert facts("Pepper and Panda are Lab mixes.")[0].text == "Pepper and Panda are Lab mixes."
    # A capitalised common noun opening a sentence is not a person.
    assert facts("Nature has a way of calming me down.") == []
    assert facts("Painting is a great way to relax.") == []


@pytest.mark.parametrize(
    ("text", "predicate", "text_out"),
    [
        ("I don't like horror movies.", "does not like", "Caroline does not like horror movies."),
        ("I do not like horror movies.", "does not like", "Caroline does not like horror movies."),
        ("I never liked horror movies.", "did not like", "Caroline never liked horror movies."),
        ("I didn't enjoy the concert.", "did not enjoy", "Caroline did not enjoy the concert."),
        ("I've never been to Paris.", "has not been to", "Caroline has never been to Paris."),
        ("I'm not a fan of jazz.", "is not a fan of", "Caroline is not a fan of jazz."),
        ("I don't have a car.", "does not have", "Caroline does not have a car."),
        ("I have no siblings.", "does not have", "Caroline does not have siblings."),
    ],
)
def test_negations_are_marked(text: str, predicate: str, text_out: str) -> None:
    fact = facts(text, "Caroline")[0]
    assert (fact.predicate, fact.negated, fact.text) == (predicate, True, text_out)


def test_affirmative_facts_are_not_negated() -> None:
    assert [f.negated for f in facts("I love hiking. I do love hiking.")] == [False]


@pytest.mark.parametrize(
    "text",
    [
        "I think I love jazz.",
        "I think that I love jazz.",
        "Maybe I'm a fan of jazz.",
        "I guess I like jazz.",
        "I probably like jazz.",
    ],
)
def test_hedging_lowers_confidence(text: str) -> None:
    (fact,) = facts(text)
    assert fact.confidence == 0.6
    assert "jazz" in fact.object


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I paid $1,200 for the bike and €30 for the helmet.", ("$1,200", "€30")),
        ("It cost 50 dollars.", ("50 dollars",)),
        ("I have 3 kids and two dogs.", ("3 kids", "two dogs")),
        ("I've lived here for 10 years, six months in the old flat.", ("10 years", "six months")),
        ("I ran 5 long miles with two of my friends", ("5 long miles",)),
        ("One of them is 20% off.", ("20%",)),
        ("No numbers here.", ()),
    ],
)
def test_quantities(text: str, expected: tuple[str, ...]) -> None:
    assert find_quantities(text) == expected


def test_facts_carry_the_quantities_of_their_sentence() -> None:
    (fact,) = facts("I have 3 kids. I love them.")
    assert fact.quantities == ("3 kids",)
    assert facts("I paid $150 for a new bike.")[0].quantities == ("$150",)


@pytest.mark.parametrize(
    "text",
    [
        "Do you like dogs?",
        "Are you a nurse?",
        "Have you ever been to Paris? 😊",
        "Hey Mel! Good to see you!",
        "Thanks so much! See you soon!",
        "Congrats!",
        "Wow, that's awesome!",
        "That sounds great, I'm so happy for you.",
        "It was so much fun.",
        "I love it!",
        "I'd love to visit Paris someday.",
        "I will adopt a dog.",
        "You're amazing!",
        "I love your painting!",
        "She loves painting.",
        "I was called into the office.",
        "I was called Monday by the recruiter.",
        "",
        "   ",
    ],
)
def test_questions_small_talk_and_unresolved_statements_give_nothing(text: str) -> None:
    assert facts(text) == []


def test_time_expressions_attach_an_interval() -> None:
    (fact,) = facts("I adopted a puppy last week.")
    assert fact.when == (datetime(2023, 5, 1, tzinfo=UTC), datetime(2023, 5, 8, tzinfo=UTC))
    assert fact.object == "a puppy"
    assert fact.text == "Melanie adopted a puppy in the week of 1 May 2023."


@pytest.mark.parametrize(
    ("text", "start", "phrase"),
    [
        ("I went to a support group yesterday.", datetime(2023, 5, 7, tzinfo=UTC), "on 7 May 2023"),
        ("Last Friday I visited my grandma.", datetime(2023, 5, 5, tzinfo=UTC), "on 5 May 2023"),
        ("I moved to Denver in 2019.", datetime(2019, 1, 1, tzinfo=UTC), "in 2019, and lives in Denver"),
        ("I started a blog last month.", datetime(2023, 4, 1, tzinfo=UTC), "in April 2023"),
    ],
)
def test_relative_times_become_standalone(text: str, start: datetime, phrase: str) -> None:
    (fact,) = facts(text)
    assert fact.when is not None and fact.when[0] == start
    assert fact.text.endswith(f" {phrase}.")


def test_a_time_belongs_to_its_own_clause() -> None:
    adopted, loves = facts("I adopted a puppy yesterday, and I love hiking.")
    assert adopted.when is not None and loves.when is None


def test_facts_without_time_have_no_interval() -> None:
    assert facts("I love pottery.")[0].when is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I love hiking and camping.", "hiking"),
        ("I love pottery so much!", "pottery"),
        ("I bought a bike because mine broke.", "a bike"),
        ("I bought new headphones to improve my setup.", "new headphones"),
        ("I have a tasty and easy pasta recipe.", "a tasty and easy pasta recipe"),
        ("I usually play CS:GO with friends.", "CS:GO with friends"),
        ("I'm retired now.", "retired"),
    ],
)
def test_objects_stop_at_the_clause_and_drop_filler(text: str, expected: str) -> None:
    assert [f.object for f in facts(text)] == [expected]


def test_overlong_objects_are_rejected() -> None:
    assert facts("I bought " + " ".join(["a very big and very old"] * 4) + " house.") == []


def test_object_keys_link_names_and_short_things() -> None:
    assert facts("I adopted a puppy named Max.")[0].object_key == "max"
    assert facts("I don't like horror movies.")[0].object_key == "horror-movies"
    assert facts("I live in New York.")[0].object_key == "new-york"
    assert facts("I have a tasty and easy pasta recipe from my grandmother.")[0].object_key == ""


def test_several_facts_in_order_deduplicated_and_capped() -> None:
    got = facts("I love hiking. I love hiking! I moved to Denver. My sister is a nurse.")
    assert [f.text for f in got] == [
        "Melanie loves hiking.",
        "Melanie moved to Denver, and lives in Denver.",
        "Melanie's sister is a nurse.",
    ]
    many = " ".join(f"I adopted a dog named Rex{i}." for i in range(12))
    assert len(facts(many)) == MAX_FACTS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I relocated to Paris.", "Melanie relocated to Paris, and lives in Paris."),
        ("My parents moved back to Spain in 2019.", "Melanie's parents moved back to Spain in 2019, and live in Spain."),
        ("My best friend has moved to the Bay Area", "Melanie's best friend has moved to the Bay Area, and lives in the Bay Area."),
        ("My parents have moved back to Spain with the dog.", "Melanie's parents have moved back to Spain with the dog, and live in Spain."),
        # the last leg of a move is where one lives now, when it is a named place
        ("I moved to Paris in 2010 and to Rome in 2015.", "Melanie moved to Paris in 2010, then to Rome in 2015, and lives in Rome."),
        ("My sister moved to Oslo and then to Bergen.", "Melanie's sister moved to Oslo, then to Bergen, and lives in Bergen."),
        ("I moved to Paris and later to my new job.", "Melanie moved to Paris, and lives in Paris."),
        ("I moved to Paris and went to Rome.", "Melanie moved to Paris, and lives in Paris."),
        ("I moved to Paris and talked later to Sophie about it.", "Melanie moved to Paris, and lives in Paris."),
        # a move named by both its ends is a move to where it ended
        ("I moved from Lyon to Paris.", "Melanie moved from Lyon to Paris, and lives in Paris."),
        ("My parents moved back from Oslo to New York.", "Melanie's parents moved back from Oslo to New York, and live in New York."),
        ("I moved to Paris from Lyon.", "Melanie moved to Paris from Lyon, and lives in Paris."),
        ("I moved from Lyon to Paris in 2010 and then to Rome.", "Melanie moved from Lyon to Paris in 2010, then to Rome, and lives in Rome."),
        ("I moved from the city to the countryside.", "Melanie moved from the city to the countryside."),
        ("I moved from Lisbon to Porto for a new job.", "Melanie moved from Lisbon to Porto for a new job, and lives in Porto."),
        ("I moved from my old team to Stripe.", "Melanie moved from Melanie's old team to Stripe."),
        ("I moved from Lyon to my new flat.", "Melanie moved from Lyon to Melanie's new flat."),
        # not a person, not a place, not said for sure, not said at all
        ("My violin lesson moved to Thursdays.", "Melanie's violin lesson moved to Thursdays."),
        ("I moved to the night shift.", "Melanie moved to the night shift."),
        ("I moved to my new team.", "Melanie moved to Melanie's new team."),
        ("I moved to March.", "Melanie moved to March."),
        ("Maybe I moved to Paris, not sure.", "Perhaps Melanie moved to Paris."),
        ("I never moved to Paris.", "Melanie never moved to Paris."),
    ],
)
def test_a_move_says_where_one_lives_now(text: str, expected: str) -> None:
    # "Where do I live?" must find the move by its words; the move also replaces the old place.
    assert [f.text for f in facts(text)] == [expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I moved from Lyon to Paris.", ("moved to", "Paris", "paris")),
        ("I relocated to Paris from Lyon.", ("relocated to", "Paris", "paris")),
        ("I moved from Sweden.", ("moved from", "Sweden", "sweden")),
        ("I never moved from Lyon to Paris.", ("did not move from", "Lyon to Paris", "lyon")),
    ],
)
def test_a_move_is_about_where_it_ended(text: str, expected: tuple[str, str, str]) -> None:
    # Its object is the place one lives in, so it replaces (or reinforces) the place said before.
    (fact,) = facts(text)
    assert (fact.predicate, fact.object, fact.object_key) == expected


def test_a_later_leg_is_the_same_subjects() -> None:
    assert [f.text for f in facts("I moved to Paris and my sister moved to Lyon and then to Rome.")] == [
        "Melanie moved to Paris, and lives in Paris.",
        "Melanie's sister moved to Lyon, then to Rome, and lives in Rome.",
    ]


def test_a_move_in_legs_is_the_move_to_the_last_place() -> None:
    # The place one lives in is the fact's object, so a later "I live in Rome" reinforces it
    # and "I live in Paris" replaces it; each leg keeps its own time, the fact spans them all.
    (fact,) = facts("Last year I moved to Paris and then to Rome in March.")
    assert fact.text == "Melanie moved to Paris in 2022, then to Rome in March 2023, and lives in Rome."
    assert (fact.predicate, fact.object, fact.object_key) == ("moved to", "Rome", "rome")
    assert fact.when == (datetime(2022, 1, 1, tzinfo=UTC), datetime(2023, 4, 1, tzinfo=UTC))
    (fact,) = facts("I moved to Paris and later to my new job.")
    assert (fact.object, fact.when) == ("Paris", None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a leg's time is the phrase right after its place, not another clause's
        ("I moved to Paris and then to Rome and started a job there in 2019.",
         "Melanie moved to Paris, then to Rome, and lives in Rome."),
        ("I moved to Paris and later to Rome where I met Sam last week.",
         "Melanie moved to Paris, then to Rome, and lives in Rome."),
        ("I moved to Paris in 2010 and then to Rome in 2015 and my sister moved to Oslo in 2018.",
         "Melanie moved to Paris in 2010, then to Rome in 2015, and lives in Rome. | "
         "Melanie's sister moved to Oslo in 2018, and lives in Oslo."),
        # a hedged move keeps its legs, and says nothing of where one lives
        ("Maybe I moved to Paris in 2010 and to Rome in 2015.", "Perhaps Melanie moved to Paris in 2010, then to Rome in 2015."),
    ],
)  # fmt: skip
def test_each_leg_of_a_move_keeps_its_own_time(text: str, expected: str) -> None:
    assert " | ".join(f.text for f in facts(text)) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I moved to St. Louis. It is great.", "Melanie moved to St. Louis, and lives in St. Louis."),
        ("My sister lives in St. Paul.", "Melanie's sister lives in St. Paul."),
        ("I met Dr. Lee yesterday.", "Melanie met Dr. Lee on 7 May 2023."),
        ("I love sports, e.g. hiking.", "Melanie loves sports."),
        # ... unless a name ends there
        ("I live on Main St. My sister lives in Oslo.", "Melanie lives on Main St. | Melanie's sister lives in Oslo."),
        ("I met John Smith Jr. He is a doctor.", "Melanie met John Smith Jr."),
    ],
)
def test_an_abbreviation_ends_no_sentence(text: str, expected: str) -> None:
    assert " | ".join(f.text for f in facts(text)) == expected


def test_only_a_lowercase_us_is_the_speaker() -> None:
    assert [f.object for f in facts("I moved to the US.")] == ["the US"]


def test_known_names_are_trusted_as_subjects() -> None:
    assert facts("Bingo loves long walks.") == []
    assert triples_known("Bingo loves long walks.", ["Bingo"]) == [("Bingo", "loves", "long walks")]
    assert triples_known("Bingo loves long walks.", ["bingo"]) == [("Bingo", "loves", "long walks")]


def triples_known(text: str, known: list[str]) -> list[tuple[str, str, str]]:
    return [(f.subject, f.predicate, f.object) for f in facts(text, known_names=known)]


@pytest.mark.parametrize(
    "text",
    [
        "\x00\x01\x02 I love \x07 pottery \x1b[31m",
        "🎉🎉🎉 I adopted a puppy 🐶!!! 🎉",
        "I" * 5000,
        "My My My My My is is is",
        "I'm",
        "I am not",
        "...!!!???",
        "'s 's n't",
        "I have been been been to to to",
        "\ud800 lone surrogate, I love tea",
        "Max",
        "I love $",
    ],
)
def test_odd_input_never_raises(text: str) -> None:
    got = facts(text)
    assert len(got) <= MAX_FACTS
    assert all(isinstance(f, FactCandidate) and f.text.endswith(".") for f in got)


def test_a_naive_message_time_is_read_as_utc() -> None:
    (fact,) = extract_facts("I adopted a puppy yesterday.", "Melanie", datetime(2023, 5, 8, 13, 56))
    assert fact.when == (datetime(2023, 5, 7, tzinfo=UTC), datetime(2023, 5, 8, tzinfo=UTC))


def test_a_thousand_varied_messages_are_processed() -> None:
    rng = random.Random(7)
    openers = ["I", "We", "My sister", "Max", "Yeah, I", "I think I", "I don't", "Honestly I"]
    verbs = ["love", "adopted", "have", "am", "moved to", "went to", "bought", "never liked", "work as"]
    objects = ["a puppy named Max", "hiking", "Denver", "a nurse", "3 kids", "$150 shoes", "it", "you"]
    tails = ["", " last week", " yesterday", " because it rains", ", and it was great", "?", "!", " 🐶"]
    produced = 0
    for _ in range(1000):
        text = " ".join(
            f"{rng.choice(openers)} {rng.choice(verbs)} {rng.choice(objects)}{rng.choice(tails)}."
            for _ in range(rng.randint(1, 3))
        )
        got = facts(text, rng.choice(["Melanie", "Caroline", ""]))
        assert len(got) <= MAX_FACTS
        produced += len(got)
    assert produced > 500


def test_a_very_long_message_is_read_only_in_part() -> None:
    text = ("I adopted a puppy named Max last week and I love him. " * 400)[:20_000]
    got = facts(text)
    assert 1 <= len(got) <= MAX_FACTS
    unpunctuated = "and I love hiking " * 1200
    assert len(facts(unpunctuated)) <= MAX_FACTS
