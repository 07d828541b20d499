"""Time expressions, resolved to intervals against a reference time.

"yesterday", said on 8 May 2023, is [7 May 2023, 8 May 2023). Regexes find the spans
(dateparser's ``search_dates`` is slow on every sentence and reads dates into words like
"we" and "may"); then:

- Absolute dates ("7 May 2023", "May 7th, 2023", "2023-05-07", "May 2023", "May 7",
  and the month or year of "in May", "since 2016") are read by ``dateparser``. Its
  ``period`` is the date's precision (day, month, year) and sets the interval's width;
  its ``parts`` say whether the text gave a year. It runs against a fixed base, so its
  reading depends on the text alone and is cached by the text. A date said without a
  year is then put in the most recent year that fits: "May 7" is this year's unless
  that is more than 31 days after the reference ("in May": unless May is more than a
  month ahead), else last year's. dateparser has no such rule (it takes the current
  year, or strictly past or future ones), so it is written here. If dateparser reads
  nothing, or not the parts the pattern promised, the regex groups are used.
- Relative expressions ("last week", "three days ago", "next month", "last Friday",
  "yesterday", seasons) are resolved by calendar arithmetic here: each denotes a whole
  day, week, month or season around an anchor, while dateparser returns an instant
  ("next month", said on 8 May at 13:56, is 8 June at 13:56) and reads no seasons,
  weekends or "a couple of weeks ago".

Expressions like "before May 2023" or "since 2016" keep their relation so a query can
become an open window.
"""

from __future__ import annotations

import calendar
import functools
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

log = logging.getLogger(__name__)
Relation = Literal["within", "before", "after"]

_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_MON_ABBR = "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
_MONTH = rf"(?:{_MONTHS}|(?:{_MON_ABBR})\.?)"
_DAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_NUM_WORDS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a couple": 2,
    "couple of": 2, "a few": 3, "few": 3, "several": 3,
}  # fmt: skip
_NUM = r"(?:\d{1,3}|a couple of|a couple|couple of|a few|few|several|an|a|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve)"
_UNIT = r"(?:day|week|weekend|month|year|decade)s?"
_YEAR = r"(?:19|20)\d{2}"

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("iso", re.compile(rf"\b({_YEAR})-(\d{{2}})-(\d{{2}})\b")),
    ("day_month_year", re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH}),?\s+({_YEAR})\b", re.I)),
    ("month_day_year", re.compile(rf"\b({_MONTH})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+({_YEAR})\b", re.I)),
    ("month_year", re.compile(rf"\b({_MONTH}),?\s+(?:of\s+)?({_YEAR})\b", re.I)),
    ("day_month", re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH})\b", re.I)),
    ("month_day", re.compile(rf"\b({_MONTH})\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?!\s*(?:hours?|minutes?|%))", re.I)),
    ("ago", re.compile(rf"\b({_NUM})\s+({_UNIT})\s+ago\b", re.I)),
    ("in_n", re.compile(rf"\bin\s+({_NUM})\s+({_UNIT})\b", re.I)),
    ("rel_unit", re.compile(r"\b(last|this|next|past|coming|previous)\s+(week|weekend|month|year|summer|winter|spring|fall|autumn)\b", re.I)),
    ("rel_day", re.compile(r"\b(yesterday|today|tonight|tomorrow|last night|this morning|this afternoon|this evening)\b", re.I)),
    ("weekday", re.compile(rf"\b(last|this|next|on|past)?\s*({_DAYS})\b", re.I)),
    ("month", re.compile(rf"\b(?:in|during|since|before|after|until|last|this|next)\s+({_MONTHS})\b", re.I)),
    ("year", re.compile(rf"\b(?:in|since|before|after|until|of|during|back in)\s+({_YEAR})\b", re.I)),
]
_DAY_WITH_YEAR = {"iso", "day_month_year", "month_day_year"}
_DAY_WITHOUT_YEAR = {"day_month", "month_day"}
# "every Tuesday", "every other Friday", "each Monday": a habit, no one date (the last Tuesday
# made it one); not "each other on Friday" (one another), nor a weekday with its own "last", "on"...
_RECURRING = re.compile(  # what comes before the day ("every Tuesday and Thursday": both)
    rf"\b(?:every(?:\s+(?:other|second|third|fourth|single))?|each)\s+"
    rf"(?:(?:{_DAYS})(?:\s*,)?\s+(?:(?:and|or)\s+)?)*$",
    re.I,
)
_RELATION_BEFORE = re.compile(r"\b(before|until|till|prior to|earlier than|by)\s+$", re.I)
_RELATION_AFTER = re.compile(r"\b(after|since|from|later than)\s+$", re.I)
_SEASONS = {"spring": (3, 6), "summer": (6, 9), "fall": (9, 12), "autumn": (9, 12), "winter": (12, 15)}

# The absolute kinds, read by dateparser: the parts of a date each one's text gives, and the
# group that holds the date ("in May" and "since 2016" give dateparser only "May", "2016").
_ABSOLUTE: dict[str, tuple[tuple[str, ...], int]] = {
    "iso": (("year", "month", "day"), 0),
    "day_month_year": (("year", "month", "day"), 0),
    "month_day_year": (("year", "month", "day"), 0),
    "month_year": (("year", "month"), 0),
    "day_month": (("month", "day"), 0),
    "month_day": (("month", "day"), 0),
    "month": (("month",), 1),
    "year": (("year",), 1),
}
_DATE_PARTS = ("year", "month", "day")
# year, month, day; None for a part the text leaves open
DateFields = tuple[int | None, int | None, int | None]


@dataclass(frozen=True)
class TimeMention:
    """A time expression and the interval [start, end) it denotes."""

    text: str
    start: datetime
    end: datetime
    granularity: str
    relation: Relation = "within"
    position: int = 0


def _number(word: str) -> int:
    word = word.lower()
    return int(word) if word.isdigit() else _NUM_WORDS.get(word, 1)


def _month_index(name: str) -> int:
    name = name.lower().rstrip(".")[:3]
    return [m[:3] for m in _MONTHS.split("|")].index(name) + 1


def _day(ref: datetime) -> datetime:
    return ref.replace(hour=0, minute=0, second=0, microsecond=0)


def _add_months(when: datetime, months: int) -> datetime:
    total = when.year * 12 + (when.month - 1) + months
    year, month = divmod(total, 12)
    day = min(when.day, calendar.monthrange(year, month + 1)[1])
    return when.replace(year=year, month=month + 1, day=day)


def _month_span(year: int, month: int, tz: datetime) -> tuple[datetime, datetime]:
    start = tz.replace(year=year, month=month, day=1, hour=0, minute=0, second=0, microsecond=0)
    return start, _add_months(start, 1)


def _year_span(year: int, ref: datetime) -> tuple[datetime, datetime]:
    start = ref.replace(year=year, month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    return start, start.replace(year=year + 1)


def _unit_span(anchor: datetime, unit: str) -> tuple[datetime, datetime, str]:
    unit = unit.lower().rstrip("s")
    day = _day(anchor)
    if unit == "day":
        return day, day + timedelta(days=1), "day"
    if unit in ("week", "weekend"):
        monday = day - timedelta(days=day.weekday())
        if unit == "weekend":
            return monday + timedelta(days=5), monday + timedelta(days=7), "day"
        return monday, monday + timedelta(days=7), "week"
    if unit == "month":
        start, end = _month_span(day.year, day.month, day)
        return start, end, "month"
    if unit == "decade":
        start, _ = _year_span(day.year - 5, day)
        return start, start.replace(year=start.year + 10), "year"
    start, end = _year_span(day.year, day)
    return start, end, "year"


@functools.cache
def _date_parser() -> Any:
    """dateparser's parser, built on first use (importing dateparser costs time most callers never need).
    None when it cannot be built (an installed dateparser older than pyproject allows): the regex groups
    are read instead, and the failure is logged once rather than met on every new date string."""
    try:
        from dateparser.date import DateDataParser

        return DateDataParser(
            languages=["en"],
            settings={
                "PARSERS": ["absolute-time"],  # relative expressions never get here
                # A fixed base (a leap year, for "Feb 29"): the answer depends on the text alone, so it is
                # cached by the text; the year of a yearless date is chosen afterwards by _absolute_span.
                "RELATIVE_BASE": datetime(2000, 1, 1),
                "PREFER_DAY_OF_MONTH": "first",  # "May 2023" starts on 1 May
                "PREFER_MONTH_OF_YEAR": "first",  # "2016" starts in January
                "DATE_ORDER": "DMY",
                "STRICT_DATE_ORDER": "all",  # "2023-13-01" is no date, not 13 January
                "TIMEZONE": "UTC",
                "RETURN_AS_TIMEZONE_AWARE": False,
            },
        )
    except Exception:  # noqa: BLE001 - dates are still read, by the regex groups
        log.warning("dateparser is unavailable; absolute dates are read by regex rules alone", exc_info=True)
        return None


@functools.lru_cache(maxsize=4096)
def _parse_date(text: str) -> tuple[DateFields, str] | None:
    """The year, month and day that dateparser reads in ``text`` (None for a part it leaves open), and
    its precision ("day", "month", "year"); None when it reads no date."""
    try:
        parser = _date_parser()
        data = parser.get_date_data(text) if parser is not None else None
    except Exception:  # noqa: BLE001 - a parser failure only means the regex groups are used instead
        return None
    if data is None or data.date_obj is None:
        return None
    d, parts = data.date_obj, data.parts
    fields = (
        d.year if "year" in parts else None,
        d.month if "month" in parts else None,
        d.day if "day" in parts else None,
    )
    return fields, data.period


def warm_up() -> None:
    """Import dateparser and load its English data now, once, not in the first call that meets a date."""
    _parse_date("7 May 2023")


def _fields_from_groups(kind: str, g: tuple[str, ...]) -> DateFields:
    """The date parts straight from the regex groups: the fallback when dateparser reads nothing."""
    if kind == "iso":
        return int(g[0]), int(g[1]), int(g[2])
    if kind in ("day_month_year", "day_month"):
        return (int(g[2]) if len(g) > 2 else None), _month_index(g[1]), int(g[0])
    if kind in ("month_day_year", "month_day"):
        return (int(g[2]) if len(g) > 2 else None), _month_index(g[0]), int(g[1])
    if kind == "month_year":
        return int(g[1]), _month_index(g[0]), None
    if kind == "month":
        return None, _month_index(g[0]), None
    return int(g[0]), None, None


def _date_fields(kind: str, m: re.Match[str]) -> tuple[DateFields, str]:
    """The date an absolute match names and its precision: dateparser's reading when it gives the parts
    the pattern promises, else the regex groups'."""
    parts, group = _ABSOLUTE[kind]
    parsed = _parse_date(" ".join(m.group(group).lower().split()))
    if parsed is not None:
        fields, period = parsed
        given = tuple(part for part, value in zip(_DATE_PARTS, fields, strict=True) if value is not None)
        if given == parts and period == parts[-1]:
            return fields, period
    return _fields_from_groups(kind, m.groups()), parts[-1]


def _absolute_span(fields: DateFields, precision: str, day: datetime) -> tuple[datetime, datetime, str]:
    """The interval of a date as precise as ``precision``; a date without a year is the most recent one."""
    year, month, dom = fields
    if precision == "year":
        start, end = _year_span(year, day)
        return start, end, "year"
    if precision == "month":
        if year is None:  # "in May": this year's unless that is more than a month ahead
            year = day.year if month <= day.month + 1 else day.year - 1
        start, end = _month_span(year, month, day)
        return start, end, "month"
    start = day.replace(year=year, month=month, day=dom) if year is not None else _last_date(month, dom, day)
    return start, start + timedelta(days=1), "day"


def _last_date(month: int, dom: int, day: datetime) -> datetime:
    """The most recent ``month``/``dom`` up to a month ahead of ``day`` ("May 7" said in January is
    probably last May; "Feb 29" is the last 29 February there was).

    Raises:
        ValueError: No year has that date.
    """
    for year in range(day.year, day.year - 9, -1):
        try:
            start = day.replace(year=year, month=month, day=dom)
        except ValueError:  # 29 February in a common year
            continue
        if start <= day + timedelta(days=31):
            return start
    raise ValueError(f"no year has day {dom} of month {month}")


def _resolve(kind: str, m: re.Match[str], ref: datetime) -> tuple[datetime, datetime, str] | None:
    g = m.groups()
    day = _day(ref)
    if kind in _ABSOLUTE:
        return _absolute_span(*_date_fields(kind, m), day)
    if kind in ("ago", "in_n"):
        n = _number(g[0]) * (-1 if kind == "ago" else 1)
        unit = g[1].lower().rstrip("s")
        if unit == "day":
            anchor = day + timedelta(days=n)
        elif unit in ("week", "weekend"):
            anchor = day + timedelta(weeks=n)
        elif unit == "month":
            anchor = _add_months(day, n)
        elif unit == "decade":
            anchor = _add_months(day, 120 * n)  # from 29 February, to the 28th of a common year
        else:
            anchor = _add_months(day, 12 * n)
        return _unit_span(anchor, unit)
    if kind == "rel_unit":
        which, unit = g[0].lower(), g[1].lower()
        step = {"last": -1, "past": -1, "previous": -1, "this": 0, "next": 1, "coming": 1}[which]
        if unit in _SEASONS:
            first, last = _SEASONS[unit]
            year = day.year + step
            start = _month_span(year, first, day)[0]
            return start, _add_months(start, last - first), "season"
        if unit in ("week", "weekend"):
            return _unit_span(day + timedelta(weeks=step), unit)
        if unit == "month":
            return _unit_span(_add_months(day, step), unit)
        return _unit_span(_add_months(day, 12 * step), unit)
    if kind == "rel_day":
        word = g[0].lower()
        offset = {"yesterday": -1, "last night": -1, "tomorrow": 1}.get(word, 0)
        start = day + timedelta(days=offset)
        return start, start + timedelta(days=1), "day"
    if kind == "weekday":
        which = (g[0] or "").lower()
        target = _DAYS.split("|").index(g[1].lower())
        delta = (day.weekday() - target) % 7
        if which == "next":
            start = day + timedelta(days=(target - day.weekday()) % 7 or 7)
        elif which == "this" and delta:
            start = day + timedelta(days=(target - day.weekday()) % 7)
        else:  # "last Friday", "on Friday", "Friday": the most recent one
            start = day - timedelta(days=delta or (7 if which in ("last", "past") else 0))
        return start, start + timedelta(days=1), "day"
    return None


def _overlaps(span: tuple[int, int], spans: list[tuple[int, int]]) -> bool:
    return any(a < span[1] and span[0] < b for a, b in spans)


def find_times(text: str, reference: datetime) -> list[TimeMention]:
    """Every time expression in ``text``, resolved against ``reference``, in order.

    Overlapping matches keep the most specific (the earliest pattern in the list).
    """
    ref = reference if reference.tzinfo else reference.replace(tzinfo=UTC)
    taken: list[tuple[int, int]] = []
    impossible: list[tuple[int, int]] = []  # dates with a year that has no such day
    out: list[TimeMention] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            span = (m.start(), m.end())
            if _overlaps(span, taken):
                continue
            if kind in _DAY_WITHOUT_YEAR and _overlaps(span, impossible):
                continue  # "Feb 29" inside "Feb 29, 2023" is not the last 29 February there was
            if kind == "weekday" and not m.group(1):
                day = m.start(2)
                if _RECURRING.search(text, max(0, day - 40), day):
                    continue
            try:
                resolved = _resolve(kind, m, ref)
            except OverflowError:  # "next week" said on 30 December 9999: no such time
                continue
            except (ValueError, IndexError):
                if kind in _DAY_WITH_YEAR:
                    impossible.append(span)
                continue
            if resolved is None:
                continue
            start, end, granularity = resolved
            before = text[: m.start()]
            lead = m.group(0).split(None, 1)[0].lower()
            relation: Relation = "within"
            if _RELATION_BEFORE.search(before) or lead in ("before", "until"):
                relation = "before"
            elif _RELATION_AFTER.search(before) or lead in ("after", "since"):
                relation = "after"
            taken.append(span)
            out.append(TimeMention(m.group(0).strip(), start, end, granularity, relation, m.start()))
    out.sort(key=lambda t: t.position)
    return out


def event_span(mentions: list[TimeMention]) -> tuple[datetime | None, datetime | None]:
    """The smallest interval covering every mention (None, None when there is none)."""
    if not mentions:
        return None, None
    return min(t.start for t in mentions), max(t.end for t in mentions)
