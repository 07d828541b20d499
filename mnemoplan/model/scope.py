"""Which records a read or a search may see: one value, read three ways.

The log turns a ``RecordFilter`` into LanceDB's SQL (``storage/log/filters.py``), its in-memory
copy of a user into a row mask (the same module), and recall asks ``admits`` of each record it
ranks. A caller's scope (user, project, time window) is such a filter: ``Scope``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from mnemoplan.model.records import Record, RecordHead

TimeOf = Literal["said", "event", "said_or_event"]


@dataclass(frozen=True)
class RecordFilter:
    """Records of one user that pass every condition set (a condition left at its default passes all).

    Attributes:
        user_id: Whose records (every read is confined to one user).
        project_id: Only this project's records ("": every project).
        after: Only records of this time or later (see ``time_of``).
        before: Only records before this time (see ``time_of``).
        kinds: Only these kinds (empty: every kind).
        session_id: Only this session's records (None: every session).
        outside_session: Not this session's records (None: no session left out): a recall made
            from a session whose turns the host holds already.
        in_session: Only records said in some session (a non-empty ``session_id``).
        ids: Only these records (None: any; empty: none).
        follows: Only the turns that follow one of these (their ``prev_id``; None: any).
        replaced_by: Only records one of these replaced (their ``superseded_by``; None: any).
        current: Only records no newer one replaced (True), only replaced ones (False), or both (None).
        cites: Only records derived from this one ("": any).
        time_of: Which time ``after`` and ``before`` bound: when a record was said
            (``occurred_at``), the event it mentions (its ``[event_start, event_end)`` meets the
            window; undated records fail), or either.
    """

    user_id: str
    project_id: str = ""
    after: datetime | None = None
    before: datetime | None = None
    kinds: tuple[str, ...] = ()
    session_id: str | None = None
    outside_session: str | None = None
    in_session: bool = False
    ids: tuple[str, ...] | None = None
    follows: tuple[str, ...] | None = None
    replaced_by: tuple[str, ...] | None = None
    current: bool | None = None
    cites: str = ""
    time_of: TimeOf = "said"

    def admits(self, rec: Record | RecordHead) -> bool:
        """Whether a record passes the filter.

        A ``RecordHead`` (what the log holds in memory of a user's record) carries no user: it is
        read as the filter's user's. Nor does it carry a kind, event times or sources.

        Raises:
            ValueError: ``rec`` is a ``RecordHead`` and the filter has a condition it cannot answer.
        """
        if isinstance(rec, RecordHead):
            if self.kinds or self.cites or self.time_of != "said":
                raise ValueError("a record head has no kind, sources or event times to filter by")
        elif rec.user_id != self.user_id or (self.kinds and rec.kind not in self.kinds):
            return False
        elif self.cites and self.cites not in rec.derived_from:
            return False
        if self.project_id and rec.project_id != self.project_id:
            return False
        if (self.session_id is not None and rec.session_id != self.session_id) or (
            self.in_session and not rec.session_id
        ):
            return False
        if self.outside_session is not None and rec.session_id == self.outside_session:
            return False
        if self.ids is not None and rec.id not in self.ids:
            return False
        if self.follows is not None and rec.prev_id not in self.follows:
            return False
        if self.replaced_by is not None and rec.superseded_by not in self.replaced_by:
            return False
        if self.current is not None and self.current == bool(rec.superseded_by):
            return False
        return self._in_window(rec)

    def _in_window(self, rec: Record | RecordHead) -> bool:
        said = (self.after is None or rec.occurred_at >= self.after) and (
            self.before is None or rec.occurred_at < self.before
        )
        if self.time_of == "said":
            return said
        assert isinstance(rec, Record)
        start, end = rec.event_start, rec.event_end
        event = (
            start is not None
            and (self.after is None or (end is not None and end > self.after))
            and (self.before is None or start < self.before)
        )
        return event or (said and self.time_of == "said_or_event")


# A caller's scope: the user, and the project and time window a search is confined to.
Scope = RecordFilter
