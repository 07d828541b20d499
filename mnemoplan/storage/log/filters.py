"""A ``RecordFilter`` as LanceDB's SQL, and as a mask over a user's rows in memory.

The only module that writes filter SQL: every other reads the log through a ``RecordFilter``
or one of the log's verbs. The mask answers the same filter for the vector and token caches,
so a search gives the same records from memory as from LanceDB.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypeVar

import numpy as np

from mnemoplan.model.scope import RecordFilter
from mnemoplan.storage.log.schema import NO_EVENT, kind_codes, micros

Column = TypeVar("Column", np.ndarray, list[str])
# A filter in LanceDB's SQL, or a RecordFilter the log translates (``sql``).
Where = RecordFilter | str

# Written before the column; summaries never have them.
LACKS_TOKENS = "tokens IS NULL AND kind != 'episode'"
HAS_TOKENS = "tokens IS NOT NULL"


def sql_str(value: str) -> str:
    """Quote a string literal for a LanceDB filter."""
    return "'" + value.replace("'", "''") + "'"


def sql_in(column: str, values: list[str] | tuple[str, ...]) -> str:
    """``column IN (...)`` with quoted literals (``FALSE`` when empty)."""
    if not values:
        return "FALSE"
    return f"{column} IN ({', '.join(sql_str(v) for v in values)})"


def sql_ts(value: datetime) -> str:
    """A timestamp literal for a LanceDB filter (a year of four digits: strftime gives "1" for 0001)."""
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+02:00 is before the first UTC instant there is
        value = datetime.min if value.year == 1 else datetime.max
    return f"CAST('{value.replace(tzinfo=None).isoformat(timespec='microseconds')}' AS TIMESTAMP)"


def of_user(user_id: str, *more: str) -> str:
    """The user's rows that pass every condition in ``more`` (SQL, each already parenthesised
    where it needs to be)."""
    return " AND ".join([f"user_id = {sql_str(user_id)}", *more])


def sql(flt: Where) -> str:
    """The filter as LanceDB's SQL (a string is taken as SQL already)."""
    if isinstance(flt, str):
        return flt
    parts: list[str] = []
    if flt.kinds:
        parts.append(f"kind = {sql_str(flt.kinds[0])}" if len(flt.kinds) == 1 else sql_in("kind", flt.kinds))
    if flt.cites:
        parts.append(f"array_has(derived_from, {sql_str(flt.cites)})")
    if flt.session_id is not None:
        parts.append(f"session_id = {sql_str(flt.session_id)}")
    if flt.in_session:
        parts.append("session_id != ''")
    if flt.outside_session is not None:
        parts.append(f"session_id != {sql_str(flt.outside_session)}")
    if flt.current is not None:
        parts.append("superseded_by = ''" if flt.current else "superseded_by != ''")
    parts.extend(_window(flt))
    if flt.project_id:
        parts.append(f"project_id = {sql_str(flt.project_id)}")
    for column, values in (("id", flt.ids), ("prev_id", flt.follows), ("superseded_by", flt.replaced_by)):
        if values is not None:
            parts.append(sql_in(column, values))
    return of_user(flt.user_id, *parts)


def _window(flt: RecordFilter) -> list[str]:
    """The time window's conditions."""
    said = []
    if flt.after is not None:
        said.append(f"occurred_at >= {sql_ts(flt.after)}")
    if flt.before is not None:
        said.append(f"occurred_at < {sql_ts(flt.before)}")
    if flt.time_of == "said":
        return said
    event = ["event_start IS NOT NULL"]
    if flt.after is not None:
        event.append(f"event_end > {sql_ts(flt.after)}")
    if flt.before is not None:
        event.append(f"event_start < {sql_ts(flt.before)}")
    said_q = "FALSE" if flt.time_of == "event" else " AND ".join(said) or "TRUE"
    return [f"(({' AND '.join(event)}) OR ({said_q}))"]


def mask(
    flt: RecordFilter, *, kinds: np.ndarray, projects: np.ndarray, occurred: np.ndarray,
    sessions: np.ndarray | None = None, superseded: np.ndarray | None = None, ids: list[str] | None = None,
    events: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:  # fmt: skip
    """Which of a user's rows pass the filter, from their columns in memory: kind codes
    (``schema.KIND_CODES``), projects, times (``micros``) and, when given, sessions, what
    replaced each, ids, and event (start, end) times (``micros``, ``NO_EVENT`` for none). The
    user is not checked: the rows are the filter's user's. The time window as ``sql`` has it.

    Raises:
        ValueError: The filter has a condition these columns cannot answer (sources, a turn's
            predecessor, or a column not given).
    """
    if flt.cites or flt.follows is not None:
        raise ValueError("the rows in memory hold no sources or predecessors to filter by")
    out = np.ones(len(kinds), dtype=bool)
    if flt.kinds:
        out &= np.isin(kinds, kind_codes(list(flt.kinds)))
    if flt.project_id:
        out &= projects == flt.project_id
    said = np.ones(len(kinds), dtype=bool)
    if flt.after is not None:
        said &= occurred >= micros(flt.after)
    if flt.before is not None:
        said &= occurred < micros(flt.before)
    if flt.time_of == "said":
        out &= said
    else:
        start, end = _needed(events, "event times")
        event = start != NO_EVENT
        if flt.after is not None:
            event &= (end != NO_EVENT) & (end > micros(flt.after))
        if flt.before is not None:
            event &= start < micros(flt.before)
        out &= event if flt.time_of == "event" else event | said
    if flt.session_id is not None or flt.in_session:
        column = _needed(sessions, "sessions")
        out &= column == flt.session_id if flt.session_id is not None else column != ""
    if flt.outside_session is not None:
        out &= _needed(sessions, "sessions") != flt.outside_session
    if flt.current is not None or flt.replaced_by is not None:
        column = _needed(superseded, "superseded")
        if flt.current is not None:
            out &= (column == "") if flt.current else (column != "")
        if flt.replaced_by is not None:
            out &= np.isin(column, list(flt.replaced_by))
    if flt.ids is not None:
        wanted = set(flt.ids)
        out &= np.fromiter((rid in wanted for rid in _needed(ids, "ids")), dtype=bool, count=len(out))
    return out


Given = TypeVar("Given")


def _needed(column: Given | None, name: str) -> Given:
    if column is None:
        raise ValueError(f"this filter needs the rows' {name}, which were not given")
    return column
