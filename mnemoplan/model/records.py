"""What is stored: the record in the log, and what callers send to store one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from mnemoplan.errors import InvalidInput, TooLarge

Kind = Literal["message", "fact", "procedure", "episode"]
# What the log holds: the kinds a caller stores, and passages of long messages (derived).
StoredKind = Literal["message", "fact", "procedure", "episode", "passage"]
METADATA_DEPTH = 32  # levels of nesting in a memory's metadata


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it nests at most METADATA_DEPTH levels: a memory's metadata comes back inside
    tool results, and a reply nested past the MCP SDK's JSON parser (200 levels) never reaches
    the caller."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > METADATA_DEPTH:
            raise ValueError(f"nested more than {METADATA_DEPTH} levels deep")
        inner = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in inner if isinstance(child, dict | list))
    return value


# Free-form JSON kept with a memory: JSON values only, so a model that forbids NaN and the
# infinities (allow_inf_nan=False) refuses them in it too, instead of storing them as null.
Metadata = Annotated[dict[str, JsonValue], AfterValidator(_shallow)]
KINDS: tuple[str, ...] = ("message", "fact", "procedure", "episode", "passage")

RECORD_ID_RE = re.compile(r"^[0-9a-f]{32}$")
# A question mark not followed by what continues a URL or a word ("?a=1"), or a full-width or
# Arabic one. Written so that Python's re and RE2 read it alike (no \s: RE2's is ASCII only):
# the log computes the same flag with pyarrow when it loads a user into memory.
QUESTION_PATTERN = "[？؟]|\\?([^A-Za-z0-9_/=&%#+-]|$)"
# Speakers whose questions are requests to an assistant: there the facts are in the question
# ("a gift for my sister, who loves pottery?"), not in the reply.
REQUESTING_ROLES = ("user", "human")
_QUESTION_RE = re.compile(QUESTION_PATTERN)
# A message longer than this many words carries its own context: it is indexed without the
# turn before it and inherits no neighbour's score (indexes.documents, planner.ranking). An
# assistant's replies run to a hundred words and more, and the short user turn before one would
# otherwise find it; chat between people rarely does (LoCoMo: median 20 words, 4 of 5,882 turns
# over 80). Chinese and Japanese characters count one word each (their words are not spaced).
STANDALONE_WORDS = 80
WORD_PATTERN = "[^ \t\n\r\f\v]+"  # read alike by Python's re and RE2 (the log's pyarrow)
UNSPACED_PATTERN = "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"  # kana and han
_WORD_RE, _UNSPACED_RE = re.compile(WORD_PATTERN), re.compile(UNSPACED_PATTERN)
# Scope names (user, project, session ids) are chosen by hosts; allow anything printable.
_SCOPE_MAX = 200
_BAD_CHARS_RE = re.compile(r"[\x00\ud800-\udfff]")
_SCOPE_BAD_RE = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def asks_question(kind: str, speaker: str, text: str) -> bool:
    """Whether a message asks something whose answer is in the reply: a question, not spoken
    in one of the ``REQUESTING_ROLES``."""
    return kind == "message" and speaker.lower() not in REQUESTING_ROLES and _QUESTION_RE.search(text) is not None


def requests(kind: str, speaker: str) -> bool:
    """Whether a message is a turn of one of the ``REQUESTING_ROLES``: a user asking an assistant."""
    return kind == "message" and speaker.lower() in REQUESTING_ROLES


def stands_alone(kind: str, text: str) -> bool:
    """Whether a message is long enough to be read without the turns around it."""
    return kind == "message" and len(_WORD_RE.findall(text)) + len(_UNSPACED_RE.findall(text)) > STANDALONE_WORDS


def as_utc(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime; naive values are taken to be UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


# A time a caller sends: one without an offset is UTC, wherever it enters (a tool's argument,
# a message, a time range, a plan), so that every path compares it with the log's aware times.
UtcDatetime = Annotated[datetime, AfterValidator(as_utc)]


def check_text(
    value: str, *, what: str, max_chars: int,
    hint: str = "Split it into several messages, or raise MNEMOPLAN_MAX_TEXT_CHARS.",
) -> str:  # fmt: skip
    """Validate free text that will be stored or searched (``hint``: what to do when it is too long).

    Raises:
        InvalidInput: empty text, a NUL character or an unpaired surrogate (not valid UTF-8).
        TooLarge: more than ``max_chars`` characters.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string.")
    if not value.strip():
        raise InvalidInput(f"{what} is empty.", hint=f"Send non-blank {what}.")
    if len(value) > max_chars:
        raise TooLarge(
            f"{what} has {len(value)} characters; the limit is {max_chars}.",
            hint=hint,
        )
    bad = _BAD_CHARS_RE.search(value)
    if bad:
        kind = "a NUL character" if bad.group() == "\x00" else "an unpaired UTF-16 surrogate (not valid UTF-8)"
        raise InvalidInput(
            f"{what} contains {kind} at position {bad.start()}.",
            hint="Send valid UTF-8 text without NUL characters.",
        )
    return value


def check_scope(value: str | None, *, what: str, required: bool = False) -> str:
    """Validate a user, project or session id; returns "" for an absent optional one.

    Raises:
        InvalidInput: blank when required, too long, or containing control characters.
    """
    if value is None or value == "":
        if required:
            raise InvalidInput(f"{what} is required.")
        return ""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-blank string.")
    if len(value) > _SCOPE_MAX:
        raise InvalidInput(f"{what} is longer than {_SCOPE_MAX} characters.")
    if _SCOPE_BAD_RE.search(value):
        raise InvalidInput(f"{what} contains control characters.", hint="Use printable characters only.")
    return value


def check_record_ids(ids: list[str]) -> list[str]:
    """Validate record ids (32 lowercase hex characters), dropping repeats.

    Raises:
        InvalidInput: an id of the wrong shape.
    """
    out: list[str] = []
    for rid in ids:
        if not isinstance(rid, str) or not RECORD_ID_RE.match(rid):
            shown = repr(rid)[:60]
            raise InvalidInput(
                f"{shown} is not a memory id.",
                hint="Ids are the 32-character hex strings returned by remember and recall.",
            )
        if rid not in out:
            out.append(rid)
    return out


class MessageIn(BaseModel):
    """One message or memory to store."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    content: str = Field(description="The text to remember, verbatim.")
    speaker: str | None = Field(None, description="Who said it ('user', a name).")
    occurred_at: UtcDatetime | None = Field(
        None, description="When (ISO-8601); default the call's, else now."
    )
    source_id: str | None = Field(
        None, description="The host's id for it: stored once per session.",
    )
    kind: Kind | None = Field(None, description="message (default), fact, procedure or episode.")
    metadata: Metadata | None = Field(None, description="Free-form JSON kept with the record.")


class FactIn(BaseModel):
    """A fact the calling agent read itself: an attribute of a person and its value. A newer value
    of the same attribute of the same person supersedes the older one (an attribute with several
    values at once, such as hobbies or languages, adds up instead)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    attribute: str = Field(description="e.g. employer, home_city, partner, diet (same name, same attribute).")
    value: str | None = Field(None, description="Its value now; omit with ended=true.")
    subject: str | None = Field(None, description="Whose; default 'user'.")
    ended: bool = Field(False, description="It ended with no new value ('I quit').")
    occurred_at: UtcDatetime | None = Field(None, description="Since when; default now.")


class TimeRange(BaseModel):
    """A window on when things happened. Either bound may be omitted."""

    model_config = ConfigDict(extra="forbid")

    after: UtcDatetime | None = Field(None, description="At or after this instant.")
    before: UtcDatetime | None = Field(None, description="Before this instant.")

    def checked(self) -> TimeRange:
        """Return self after checking the bounds are in order.

        Raises:
            InvalidInput: ``after`` is later than ``before``.
        """
        if self.after and self.before and self.after >= self.before:
            raise InvalidInput(
                f"time_range is inverted: after={self.after.isoformat()} is not before before={self.before.isoformat()}.",
                hint="Swap the bounds, or drop one of them.",
            )
        return self


class EntityMention(BaseModel):
    """An entity a record mentions (or, with role 'speaker', is said by)."""

    key: str
    name: str
    type: str = ""
    role: Literal["mention", "speaker", "subject", "object"] = "mention"


class Record(BaseModel):
    """A row of the log: the source of truth every index is derived from."""

    id: str
    user_id: str
    project_id: str = ""
    session_id: str = ""
    kind: StoredKind = "message"
    speaker: str = ""
    text: str
    occurred_at: datetime
    created_at: datetime
    source_id: str = ""
    content_hash: str = ""
    seq: int = 0
    prev_id: str = Field("", description="The message before this one in the same session, if any.")
    derived_from: list[str] = Field(default_factory=list, description="Source records of a derived memory.")
    metadata: dict[str, Any] = Field(default_factory=dict)
    importance: float = 0.5
    entities: list[EntityMention] = Field(default_factory=list, description="Entities the record mentions.")
    event_start: datetime | None = None
    event_end: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    superseded_by: str = ""
    mention_count: int = 1
    access_count: int = Field(0, description="How often retrieval returned it (as of the last upkeep).")
    last_accessed_at: datetime | None = None

    @property
    def asks(self) -> bool:
        """Whether this is a message that asks a question (see ``asks_question``)."""
        return asks_question(self.kind, self.speaker, self.text)

    @property
    def alone(self) -> bool:
        """Whether this is a message long enough to stand alone (see ``stands_alone``)."""
        return stands_alone(self.kind, self.text)

    @property
    def requests(self) -> bool:
        """Whether this is a user's turn to an assistant (see ``requests``)."""
        return requests(self.kind, self.speaker)

    def head(self) -> RecordHead:
        """What ranking reads of this record."""
        return RecordHead(id=self.id, project_id=self.project_id, session_id=self.session_id, seq=self.seq,
                          prev_id=self.prev_id, occurred_at=self.occurred_at, importance=self.importance,
                          superseded_by=self.superseded_by, access_count=self.access_count, asks=self.asks,
                          alone=self.alone, requests=self.requests)  # fmt: skip


@dataclass(frozen=True, slots=True)
class RecordHead:
    """What ranking reads of a record, without its text: the log's in-memory copy of a user
    answers it, so recall ranks its candidates and reads only the records it returns."""

    id: str
    project_id: str
    session_id: str
    seq: int
    prev_id: str
    occurred_at: datetime
    importance: float
    superseded_by: str
    access_count: int = 0  # not held in memory: rankings that use it read whole records
    asks: bool = False  # a message that asks a question (see ``asks_question``)
    alone: bool = False  # a message long enough to stand alone (see ``stands_alone``)
    requests: bool = False  # a user's turn to an assistant (see ``requests``)


@dataclass(frozen=True, slots=True)
class DocRecord:
    """What a record's BM25 document reads of it (``indexes.documents.bm25_doc``): the rebuild
    after each delete reads all of a user's records, too many to build a ``Record`` for each."""

    id: str
    user_id: str
    kind: str
    session_id: str
    project_id: str
    speaker: str
    text: str
    prev_id: str
    seq: int
    alone: bool = False  # a message long enough to stand alone (see ``stands_alone``)


@dataclass(frozen=True)
class BM25Doc:
    """What the BM25 overlay indexes for one record (``storage.documents.bm25_doc`` makes it)."""

    id: str
    user_id: str
    body: str
    kind: str = "message"
    session_id: str = ""
    project_id: str = ""


class Utterance(Protocol):
    """Something someone said: a record, what BM25 reads of one, a search result."""

    @property
    def speaker(self) -> str:
        """Who said it; empty when no one is named."""
        ...

    @property
    def text(self) -> str:
        """What was said."""
        ...


def spoken(rec: Utterance) -> str:
    """``speaker: text`` for a message with a speaker, else the text."""
    return f"{rec.speaker}: {rec.text}" if rec.speaker else rec.text
