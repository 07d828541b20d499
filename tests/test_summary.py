"""Extractive episode summaries of one conversation session."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from mnemoplan.extract.summary import EpisodeSummary, SessionTurn, summarize_session

SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)

CHAT = [
    ("Ana", "Hey Ben! Good to see you! How have you been?"),
    ("Ben", "Hi Ana! Great to see you too. What's new with you?"),
    ("Ana", "I started pottery classes at the community studio in Leeds last week."),
    ("Ben", "Wow, that's awesome! What did you make first?"),
    ("Ana", "My first pottery piece was a lopsided blue bowl, but the instructor Marta loved it."),
    ("Ben", "That's so cool. I've been training for the Bristol half marathon in September."),
    ("Ana", "How is the marathon training going?"),
    ("Ben", "The training plan has me running four mornings a week along the river."),
    ("Ana", "Thanks for sharing! Keep it up."),
    ("Ben", "My knee started hurting after the long runs, so my physio suggested new running shoes."),
    ("Ana", "Marta says the studio kiln fires every Friday, so my bowl will be glazed soon."),
    ("Ben", "Talk soon, Ana! Take care."),
]


def turns_of(chat: list[tuple[str, str]], when: datetime = SAID) -> list[SessionTurn]:
    return [SessionTurn(speaker, text, when + timedelta(minutes=i)) for i, (speaker, text) in enumerate(chat)]


def body(key_sentence: str) -> tuple[str, str]:
    speaker, _, text = key_sentence.partition(": ")
    return speaker, text


@pytest.fixture
def summary() -> EpisodeSummary:
    return summarize_session(turns_of(CHAT))


def test_header_gives_date_participants_and_message_count(summary: EpisodeSummary) -> None:
    assert summary.text.startswith("Session of 8 May 2023 (Ana, Ben; 12 messages).")
    assert summary.start == SAID and summary.end == SAID + timedelta(minutes=11)


def test_key_sentences_come_from_their_turns_in_conversation_order(summary: EpisodeSummary) -> None:
    turns = turns_of(CHAT)
    assert summary.key_sentences and len(summary.key_sentences) == len(summary.source_indexes)
    assert list(summary.source_indexes) == sorted(summary.source_indexes)
    for index, key_sentence in zip(summary.source_indexes, summary.key_sentences, strict=True):
        speaker, text = body(key_sentence)
        assert speaker == turns[index].speaker
        assert text.lower() in turns[index].text.lower()
        assert key_sentence in summary.text
    assert summary.text.index(summary.key_sentences[0]) < summary.text.index(summary.key_sentences[-1])


def test_source_indexes_point_at_the_informative_turns(summary: EpisodeSummary) -> None:
    assert 2 in summary.source_indexes  # pottery classes in Leeds
    assert 9 in summary.source_indexes  # knee, physio, running shoes
    assert len(summary.source_indexes) <= 6


def test_questions_greetings_and_small_talk_are_left_out(summary: EpisodeSummary) -> None:
    for key_sentence in summary.key_sentences:
        _, text = body(key_sentence)
        assert not text.endswith("?")
        assert not text.lower().startswith(("hey", "hi ", "thanks", "talk soon", "that's so cool"))
    assert not {0, 1, 3, 6, 8, 11} & set(summary.source_indexes)


def test_near_identical_sentences_are_picked_once() -> None:
    chat = [
        ("Ana", "I adopted a grey rescue cat named Pixel from the Leeds shelter yesterday."),
        ("Ben", "My brother moved to Lisbon for a new software engineering job."),
        ("Ana", "Yesterday I adopted a grey rescue cat named Pixel from the shelter in Leeds!"),
        ("Ben", "We are planning a canoe trip on the Wye river in August."),
    ]
    summary = summarize_session(turns_of(chat))
    assert len({0, 2} & set(summary.source_indexes)) == 1
    assert {1, 3} <= set(summary.source_indexes)
    assert sum("Pixel" in s for s in summary.key_sentences) == 1


def test_text_stays_within_max_chars_and_the_header_is_never_cut() -> None:
    turns = turns_of(CHAT)
    full = summarize_session(turns)
    header = full.text[: full.text.index(")") + 2].strip()
    for limit in (60, 120, 200, 300, 500):
        short = summarize_session(turns, max_chars=limit)
        assert short.text.startswith(header)
        assert len(short.text) <= max(limit, len(header))
        assert all(s in short.text or s.endswith("…") for s in short.key_sentences)
    assert summarize_session(turns, max_chars=10).text == header


def test_max_sentences_limits_the_key_points() -> None:
    summary = summarize_session(turns_of(CHAT), max_sentences=2)
    assert len(summary.key_sentences) == 2


def test_topics_are_lowercase_and_entities_start_with_the_participants(summary: EpisodeSummary) -> None:
    assert summary.topics and all(t == t.lower() for t in summary.topics)
    assert len(summary.topics) <= 6
    assert any("pottery" in t for t in summary.topics)
    assert summary.entities[:2] == ("Ana", "Ben")
    assert "Marta" in summary.entities
    assert "Topics: " in summary.text


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (datetime(2023, 5, 8, 9), datetime(2023, 5, 10, 22), "Session of 8-10 May 2023 "),
        (datetime(2023, 4, 30, 9), datetime(2023, 5, 2, 9), "Session of 30 April 2023 - 2 May 2023 "),
        (datetime(2022, 12, 31, 9), datetime(2023, 1, 1, 9), "Session of 31 December 2022 - 1 January 2023 "),
    ],
)
def test_a_session_over_several_days_shows_its_span(start: datetime, end: datetime, expected: str) -> None:
    turns = [
        SessionTurn("Ana", "I repainted the kitchen cabinets a deep green colour.", end),
        SessionTurn("Ben", "My sister bought a vintage camper van for the summer.", start),
    ]
    summary = summarize_session(turns)
    assert summary.text.startswith(expected)
    assert (summary.start, summary.end) == (start, end)


def test_naive_and_aware_times_mix_without_error() -> None:
    turns = [
        SessionTurn("Ana", "I repainted the kitchen cabinets a deep green colour.", datetime(2023, 5, 8, 9)),
        SessionTurn("Ben", "My sister bought a vintage camper van.", datetime(2023, 5, 9, 9, tzinfo=UTC)),
    ]
    assert summarize_session(turns).text.startswith("Session of 8-9 May 2023 (Ana, Ben; 2 messages).")


def test_same_input_gives_the_same_output(summary: EpisodeSummary) -> None:
    assert summarize_session(turns_of(CHAT)) == summary


def test_output_does_not_depend_on_the_hash_seed() -> None:
    # Set iteration order changes with PYTHONHASHSEED; the summary must not.
    script = (
        "from tests.test_summary import CHAT, turns_of\n"
        "from mnemoplan.extract.summary import summarize_session\n"
        "print(summarize_session(turns_of(CHAT)))\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2", "3")
    }  # fmt: skip
    assert len(outputs) == 1


def test_empty_session_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one turn"):
        summarize_session([])


def test_a_single_turn_is_summarised() -> None:
    summary = summarize_session([SessionTurn("Ana", "I adopted a dog named Rex from the shelter.", SAID)])
    assert summary.text.startswith("Session of 8 May 2023 (Ana; 1 message).")
    assert summary.source_indexes == (0,)
    assert summary.key_sentences == ("Ana: I adopted a dog named Rex from the shelter.",)


def test_a_session_of_only_small_talk_still_gets_a_header() -> None:
    summary = summarize_session(turns_of([("Ana", "Hi!"), ("Ben", "Hey 👋"), ("Ana", "...")]))
    assert summary.text.startswith("Session of 8 May 2023 (Ana, Ben; 3 messages).")


@pytest.mark.parametrize(
    "text",
    [
        "🎉🎉 I finally ran the Boston Marathon in under four hours!! 😍🏃‍♀️",
        "I bought\x00 a new\x07 car\u200b yesterday\x1b[31m and drove it to Denver.\r\nNext we go skiing.",
        "word " * 50_000,
        "I like hiking in the Alps with my cousin. " * 3_000,
        "",
        "   \n\t ",
        "?!?! ... --- :)",
    ],
)
def test_odd_turns_never_raise(text: str) -> None:
    turns = [SessionTurn("Ana", text, SAID), SessionTurn("", "My cat Pixel learned to open doors.", SAID)]
    summary = summarize_session(turns)
    assert summary.text.startswith("Session of 8 May 2023 (Ana; 2 messages).")
    assert len(summary.text) <= 900
    assert not any(ord(ch) < 32 or ch == "\x7f" for ch in summary.text)
