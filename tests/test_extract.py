"""Deterministic extraction: names and time expressions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

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
