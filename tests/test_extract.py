"""Deterministic extraction: names and time expressions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mnemoplan.extract import times
from mnemoplan.extract.names import entity_key, extract_names, mentions_for
from mnemoplan.extract.times import find_times

SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)  # a Monday


def window(text: str, ref: datetime = SAID) -> tuple[str, str, str]:
    t = find_times(text, ref)[0]
    return t.start.date().isoformat(), t.end.date().isoformat(), t.relation


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I went to a support group yesterday", ("2023-05-07", "2023-05-08", "within")),
        ("we ran a charity race last Sunday", ("2023-05-07", "2023-05-08", "within")),
        ("I'm off camping next month", ("2023-06-01", "2023-07-01", "within")),
        ("she painted it last year", ("2022-01-01", "2023-01-01", "within")),
        ("it was three days ago", ("2023-05-05", "2023-05-06", "within")),
        ("a couple of weeks ago we met", ("2023-04-24", "2023-05-01", "within")),
        ("see you in 2 weeks", ("2023-05-22", "2023-05-29", "within")),
        ("last week was busy", ("2023-05-01", "2023-05-08", "within")),
        ("on 7 May 2023 it rained", ("2023-05-07", "2023-05-08", "within")),
        ("the gig on May 20th", ("2023-05-20", "2023-05-21", "within")),
        ("2023-01-02 was the date", ("2023-01-02", "2023-01-03", "within")),
        ("back in 2016 I moved", ("2016-01-01", "2017-01-01", "within")),
        ("what happened before June 2022", ("2022-06-01", "2022-07-01", "before")),
        ("since 2019 I've lived here", ("2019-01-01", "2020-01-01", "after")),
        ("in May", ("2023-05-01", "2023-06-01", "within")),
    ],
)
def test_time_expressions_resolve_against_the_message_time(text: str, expected: tuple[str, str, str]) -> None:
    assert window(text) == expected


def test_no_time_in_plain_text() -> None:
    assert find_times("I may have a cat and 2000 followers", SAID) == []


ABSOLUTE_DATES = [
    ("on 7 May 2023 it rained", ("2023-05-07", "2023-05-08", "day")),
    ("it was May 7th, 2023 I think", ("2023-05-07", "2023-05-08", "day")),
    ("the log says 2023-05-07", ("2023-05-07", "2023-05-08", "day")),
    ("we moved in May 2023", ("2023-05-01", "2023-06-01", "month")),  # month precision: the whole month
    ("the gig on the 7th of May", ("2023-05-07", "2023-05-08", "day")),
]


def span(text: str, ref: datetime = SAID) -> tuple[str, str, str]:
    t = find_times(text, ref)[0]
    return t.start.date().isoformat(), t.end.date().isoformat(), t.granularity


@pytest.mark.parametrize(
    "text",
    ["lessons every Tuesday", "yoga each Monday", "we meet every other Friday", "every Monday and Friday"],
)
def test_a_weekday_said_as_a_habit_is_no_date(text: str) -> None:
    # "every Tuesday" is no one Tuesday: read as the last one, it dated the fact wrongly
    assert find_times(text, SAID) == []
    assert [t.text for t in find_times(f"{text}, and I saw her last Friday", SAID)] == ["last Friday"]


@pytest.mark.parametrize(
    "text", ["saw each other last Tuesday", "see each other on Tuesday", "each other Tuesday"]
)
def test_each_other_on_a_weekday_is_a_date(text: str) -> None:
    assert [t.start.date().isoformat() for t in find_times(text, SAID)] == ["2023-05-02"]


@pytest.mark.parametrize(("text", "expected"), ABSOLUTE_DATES)
def test_absolute_dates_are_read_with_their_precision(text: str, expected: tuple[str, str, str]) -> None:
    assert span(text) == expected


def test_absolute_dates_are_read_by_dateparser() -> None:
    assert times._parse_date("may 7th, 2023") == ((2023, 5, 7), "day")
    assert times._parse_date("may 2023") == ((2023, 5, None), "month")
    assert times._parse_date("may 7") == ((None, 5, 7), "day")  # no year given: the reference picks it
    assert times._parse_date("2023-13-01") is None  # not 13 January


@pytest.mark.parametrize(("text", "expected"), ABSOLUTE_DATES)
def test_the_regex_groups_stand_in_when_dateparser_fails(
    monkeypatch: pytest.MonkeyPatch, text: str, expected: tuple[str, str, str]
) -> None:
    def broken() -> None:
        raise RuntimeError("no parser")

    for stand_in in (broken, lambda: None):  # parsing fails; the parser could not be built
        monkeypatch.setattr(times, "_date_parser", stand_in)
        times._parse_date.cache_clear()
        try:
            assert span(text) == expected
        finally:
            times._parse_date.cache_clear()


def test_a_date_without_a_year_is_the_most_recent_one() -> None:
    january = datetime(2024, 1, 15, 9, 0, tzinfo=UTC)
    assert span("the gig on May 7", january) == ("2023-05-07", "2023-05-08", "day")  # last May
    april = datetime(2024, 4, 20, 9, 0, tzinfo=UTC)
    assert span("the gig on May 7", april) == ("2024-05-07", "2024-05-08", "day")  # under a month ahead


def test_29_february_is_a_date_in_every_year() -> None:
    # Without a year it is the last 29 February there was; counting years from it lands on the 28th.
    assert span("born on Feb 29", SAID) == ("2020-02-29", "2020-03-01", "day")
    # With a year that has none, it is no day (the month is still read).
    assert [(t.text, t.granularity) for t in find_times("on Feb 29, 2023", SAID)] == []
    assert [(t.text, t.granularity) for t in find_times("on 29 February 2023", SAID)] == [("February 2023", "month")]
    leap_day = datetime(2024, 2, 29, 12, 0, tzinfo=UTC)
    assert span("a year ago", leap_day) == ("2023-01-01", "2024-01-01", "year")
    assert span("next year", leap_day) == ("2025-01-01", "2026-01-01", "year")


def test_an_impossible_date_is_skipped() -> None:
    # The day is dropped; "February 2023" inside it is still a month.
    found = [(t.text, t.granularity) for t in find_times("on 31 February 2023 we met", SAID)]
    assert found == [("February 2023", "month")]
    assert find_times("see 2023-13-01 and February 30", SAID) == []


def test_entity_keys_fold_case_accents_and_punctuation() -> None:
    assert entity_key("José García") == entity_key("jose garcia") == entity_key("José-García") == "jose-garcia"
    assert entity_key("Caroline's") == "caroline"


def test_names_are_found_and_sentence_openers_are_not() -> None:
    names = dict(extract_names("Yesterday I met José García at the Museum of Modern Art. Great talk!"))
    assert names == {"jose-garcia": "José García", "museum-of-modern-art": "Museum of Modern Art"}


def test_known_names_are_found_whatever_their_case() -> None:
    assert dict(extract_names("mel said hi", known=["mel"])) == {"mel": "mel"}


def test_the_speaker_is_an_entity() -> None:
    mentions = mentions_for("Hey Caroline!", "Melanie")
    assert [(m.key, m.role) for m in mentions] == [("melanie", "speaker"), ("caroline", "mention")]


def test_a_line_or_a_sentence_opening_on_a_common_word_gives_no_entity_of_it(tmp_path) -> None:
    """An agent's notes ("- Speaks Spanish", "Based in San Francisco") and a fact about "my starter"
    put words that are no names in the entity graph: "Speaks", "Based", "user's starter"."""
    from mnemoplan.service.browse import MemoryBrowser
    from mnemoplan.model import MessageIn
    from tests.conftest import make_service

    notes = ("About the user:\n- Speaks Spanish and some Portuguese\n- Graduated from Stanford in 2015\n"
             "- Based in San Francisco\n* Loves Ana's cooking\n1. Works at Google")
    assert {name for _, name in extract_names(notes)} == {"Spanish", "Portuguese", "Stanford", "San Francisco",
                                                          "Ana", "Google"}
    assert {name for _, name in extract_names("Speaks Spanish. Based in San Francisco.")} == {"Spanish",
                                                                                             "San Francisco"}
    # a name of several words that opens a sentence stays whole
    assert [name for _, name in extract_names("San Francisco was foggy. New York next.")] == ["San Francisco",
                                                                                            "New York"]
    service = make_service(tmp_path / "data")
    try:
        for speaker, text in (("assistant", notes), ("user", "My starter was the burrata and the main was risotto."),
                              ("user", "I met Ana at Google yesterday")):
            service.remember(messages=[MessageIn(content=text, speaker=speaker)], user_id="u")
        labels = {n["label"] for n in MemoryBrowser(service.store).graph("u").nodes}
        assert {"Spanish", "Stanford", "San Francisco", "Google", "Ana"} <= labels
        assert not labels & {"Speaks", "Speaks Spanish", "Graduated", "Based", "Loves", "Works", "user's starter"}, labels
    finally:
        service.close()
