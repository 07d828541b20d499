"""Time expressions, resolved to intervals against a reference time.

"yesterday", said on 8 May 2023, is [7 May 2023, 8 May 2023). Relative expressions
("last week", "three days ago", "next month", "last Friday") are resolved by calendar
arithmetic; absolute dates in their many spellings ("7 May 2023", "May 7th",
"2023-05-07") are parsed by ``dateparser``; a date's precision (day, month, year)
sets the interval's width. Expressions like "before May 2023" or "since 2016" keep
their relation so a query can become an open window.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

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
    ("rel_unit", re.compile(rf"\b(last|this|next|past|coming|previous)\s+(week|weekend|month|year|summer|winter|spring|fall|autumn)\b", re.I)),
    ("rel_day", re.compile(r"\b(yesterday|today|tonight|tomorrow|last night|this morning|this afternoon|this evening)\b", re.I)),
    ("weekday", re.compile(rf"\b(last|this|next|on|past)?\s*({_DAYS})\b", re.I)),
    ("month", re.compile(rf"\b(?:in|during|since|before|after|until|last|this|next)\s+({_MONTHS})\b", re.I)),
    ("year", re.compile(rf"\b(?:in|since|before|after|until|of|during|back in)\s+({_YEAR})\b", re.I)),
]
_RELATION_BEFORE = re.compile(r"\b(before|until|till|prior to|earlier than|by)\s+$", re.I)
_RELATION_AFTER = re.compile(r"\b(after|since|from|later than)\s+$", re.I)
_SEASONS = {"spring": (3, 6), "summer": (6, 9), "fall": (9, 12), "autumn": (9, 12), "winter": (12, 15)}


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


def _resolve(kind: str, m: re.Match[str], ref: datetime) -> tuple[datetime, datetime, str] | None:
    g = m.groups()
    day = _day(ref)
    if kind == "iso":
        start = day.replace(year=int(g[0]), month=int(g[1]), day=int(g[2]))
        return start, start + timedelta(days=1), "day"
    if kind in ("day_month_year", "month_day_year", "day_month", "month_day"):
        if kind.startswith("day"):
            dd, mm, yy = g[0], g[1], (g[2] if len(g) > 2 else None)
        else:
            mm, dd, yy = g[0], g[1], (g[2] if len(g) > 2 else None)
        month = _month_index(mm)
        year = int(yy) if yy else day.year
        start = day.replace(year=year, month=month, day=int(dd))
        if not yy and start > day + timedelta(days=31):
            start = start.replace(year=year - 1)  # "May 7" said in January is probably last May
        return start, start + timedelta(days=1), "day"
    if kind == "month_year":
        start, end = _month_span(int(g[1]), _month_index(g[0]), day)
        return start, end, "month"
    if kind == "month":
        month = _month_index(g[0])
        year = day.year if month <= day.month + 1 else day.year - 1
        start, end = _month_span(year, month, day)
        return start, end, "month"
    if kind == "year":
        year = int(g[0])
        start, end = _year_span(year, day)
        return start, end, "year"
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
            anchor = day.replace(year=day.year + 10 * n)
        else:
            anchor = day.replace(year=day.year + n)
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
        return _unit_span(day.replace(year=day.year + step), unit)
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


def find_times(text: str, reference: datetime) -> list[TimeMention]:
    """Every time expression in ``text``, resolved against ``reference``, in order.

    Overlapping matches keep the most specific (the earliest pattern in the list).
    """
    ref = reference if reference.tzinfo else reference.replace(tzinfo=UTC)
    taken: list[tuple[int, int]] = []
    out: list[TimeMention] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            span = (m.start(), m.end())
            if any(a < span[1] and span[0] < b for a, b in taken):
                continue
            try:
                resolved = _resolve(kind, m, ref)
            except (ValueError, IndexError):
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
