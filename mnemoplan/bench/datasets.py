"""Benchmark data: LoCoMo's own JSON and the generic JSONL pair, loaded into one shape.

The loaders handle the data's quirks openly (malformed evidence is split and
normalised, never "fixed"), and nothing downstream knows which dataset it runs on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


@dataclass
class Turn:
    """One message of a conversation."""

    conv_id: str
    session: int
    dia_id: str
    speaker: str
    text: str
    timestamp: datetime | None


@dataclass
class Question:
    """One question with its evidence turns."""

    qid: str
    conv_id: str
    question: str
    category: str
    evidence: list[str]
    evidence_sessions: list[int] = field(default_factory=list)
    asked_at: str | None = None  # the dia_id of the turn that asks it: only earlier turns are in memory


@dataclass
class Dataset:
    """Conversations (turns in order) and the questions about them."""

    name: str
    turns: dict[str, list[Turn]]
    questions: list[Question]
    category_names: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def n_turns(self) -> int:
        """Messages across every conversation."""
        return sum(len(t) for t in self.turns.values())


def turn_text(text: str, caption: str | None) -> str:
    """The stored text of a turn: its words, plus the caption of a shared image."""
    return f"{text} [image: {caption}]" if caption else text


# -- LoCoMo -----------------------------------------------------------------------------

LOCOMO_CATEGORIES = {"1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial"}
_LOCOMO_EVIDENCE = re.compile(r"^D:?(\d+):0*(\d+)$")


def normalise_locomo_evidence(raw: list[str]) -> list[str]:
    """Split and normalise LoCoMo evidence ids ('D8:6; D9:17', 'D:11:26', 'D30:05'); drop unusable ones."""
    out: list[str] = []
    for entry in raw:
        for part in re.split(r"[;,\s]+", str(entry).strip()):
            m = _LOCOMO_EVIDENCE.match(part)
            if m:
                dia = f"D{int(m.group(1))}:{int(m.group(2))}"
                if dia not in out:
                    out.append(dia)
    return out


def load_locomo(path: Path) -> Dataset:
    """LoCoMo's ``locomo10.json``: one conversation per sample, sessions dated, questions with evidence."""
    data = json.loads(path.read_text(encoding="utf-8"))
    turns: dict[str, list[Turn]] = {}
    questions: list[Question] = []
    excluded = 0
    for sample in data:
        conv_id = sample["sample_id"]
        conv = sample["conversation"]
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        conv_turns = []
        for n in numbers:
            stamp = conv.get(f"session_{n}_date_time")
            when = datetime.strptime(stamp, "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC) if stamp else None
            for t in conv[f"session_{n}"]:
                text = turn_text(t["text"], t.get("blip_caption"))
                conv_turns.append(Turn(conv_id, n, t["dia_id"], t["speaker"], text, when))
        turns[conv_id] = conv_turns
        for i, qa in enumerate(sample["qa"]):
            evidence = normalise_locomo_evidence(qa.get("evidence", []))
            if not evidence:
                excluded += 1
                continue
            sessions = sorted({int(e[1:].split(":")[0]) for e in evidence})
            questions.append(
                Question(f"{conv_id}:{i}", conv_id, qa["question"], str(qa["category"]), evidence, sessions)
            )
    return Dataset(
        name=path.name,
        turns=turns,
        questions=questions,
        category_names=LOCOMO_CATEGORIES,
        notes=[f"{excluded} question(s) without usable evidence excluded from scoring"],
    )


def load_directory(path: Path) -> Dataset:
    """A directory holding the generic pair as ``messages.jsonl`` and ``questions.jsonl``."""
    messages, questions = path / "messages.jsonl", path / "questions.jsonl"
    if not (messages.is_file() and questions.is_file()):
        raise ValueError(f"{path}: a dataset directory holds messages.jsonl and questions.jsonl")
    dataset = load_jsonl(messages, questions)
    dataset.name = path.name
    return dataset


# -- generic JSONL ----------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
    return rows


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def load_jsonl(messages: Path, questions: Path) -> Dataset:
    """The generic pair: messages (conv_id, session, dia_id, speaker, text, timestamp) and questions."""
    turns: dict[str, list[Turn]] = {}
    first_stamp: dict[tuple[str, int], datetime] = {}
    for row in _read_jsonl(messages):
        conv, session = str(row["conv_id"]), int(row["session"])
        when = _when(row.get("timestamp"))
        if when and (conv, session) not in first_stamp:
            first_stamp[(conv, session)] = when
        text = turn_text(row["text"], row.get("blip_caption"))
        turns.setdefault(conv, []).append(Turn(conv, session, str(row["dia_id"]), row.get("speaker", ""), text, when))
    for conv_turns in turns.values():  # a message without a timestamp takes its session's first one
        for t in conv_turns:
            if t.timestamp is None:
                t.timestamp = first_stamp.get((t.conv_id, t.session))
    session_of = {(t.conv_id, t.dia_id): t.session for ts in turns.values() for t in ts}
    out: list[Question] = []
    excluded = 0
    for row in _read_jsonl(questions):
        conv = str(row["conv_id"])
        evidence = list(dict.fromkeys(str(e).strip() for e in row.get("evidence", []) if str(e).strip()))
        if not evidence:
            excluded += 1
            continue
        sessions = sorted({session_of[(conv, e)] for e in evidence if (conv, e) in session_of})
        asked = str(row["asked_at"]) if row.get("asked_at") else None
        out.append(Question(str(row["qid"]), conv, row["question"], str(row.get("category", "")), evidence, sessions,
                            asked))  # fmt: skip
    return Dataset(
        name=messages.name,
        turns=turns,
        questions=out,
        notes=[f"{excluded} question(s) without evidence excluded from scoring"] if excluded else [],
    )
