"""``mnemoplan bench --suite updates``: does memory stay true when a life changes?

Each conversation of the suite (``suites/updates/conversations.jsonl``, described in its
README) is its own memory user. Its messages are stored in order, one ``remember`` call per
message, as an agent loop sends them; then each question is asked alone through
``recall(question, limit=5)``. Scored as the suite's README says:

1. current value first: the first item states the current value (an ending: no item stating
   the ended value comes first marked current);
2. outdated marked: of the returned items stating an outdated value, the share marked
   ``current: false`` (items are the unit);
3. false supersede (controls): an item stating the true value is returned marked not
   current, or the first item does not state it.

Every figure is given overall, per split (``dev``, ``heldout``) and per change kind, with
the counts behind it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mnemoplan.bench.progress import Progress
from mnemoplan.model import MemoryItem, MessageIn

if TYPE_CHECKING:
    from mnemoplan.service.service import MemoryService

SUITE = Path(__file__).parent / "suites" / "updates" / "conversations.jsonl"
LIMIT = 5
SPLITS = ("dev", "heldout")


def mentions(text: str, values: list[str]) -> bool:
    """Whether ``text`` names any of ``values`` as a whole word, case-insensitively (a plural
    such as "Octavias" counts, as the suite's README says)."""
    return any(re.search(rf"(?<!\w){re.escape(v)}(?:s|es)?(?!\w)", text, re.I) for v in values)


@dataclass
class Tally:
    """Counts behind one figure."""

    hits: int = 0
    total: int = 0

    def add(self, hit: bool) -> None:
        self.hits += int(hit)
        self.total += 1

    def share(self) -> float | None:
        return round(self.hits / self.total, 4) if self.total else None

    def as_dict(self) -> dict[str, Any]:
        return {"share": self.share(), "hits": self.hits, "total": self.total}


@dataclass
class Scores:
    """The suite's figures for one group of conversations."""

    current_first: Tally = field(default_factory=Tally)
    outdated_marked: Tally = field(default_factory=Tally)
    false_supersede: Tally = field(default_factory=Tally)
    history_found: Tally = field(default_factory=Tally)

    def as_dict(self) -> dict[str, Any]:
        return {"current_first": self.current_first.as_dict(), "outdated_marked": self.outdated_marked.as_dict(),
                "false_supersede": self.false_supersede.as_dict(), "history_found": self.history_found.as_dict()}


def load(path: Path = SUITE, split: str = "all") -> list[dict[str, Any]]:
    """The suite's conversations, of one split or all."""
    convs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [c for c in convs if split == "all" or c["split"] == split]


def store(service: MemoryService, conv: dict[str, Any]) -> None:
    """Remember a conversation one message per call, in order."""
    for msg in conv["messages"]:
        message = MessageIn(content=msg["text"], speaker=msg["speaker"],
                            occurred_at=datetime.fromisoformat(msg["timestamp"].replace("Z", "+00:00")))
        service.remember(messages=[message], user_id=conv["conv_id"], session_id=f"session_{msg['session']}")


def judge(conv: dict[str, Any], question: dict[str, Any], items: list[MemoryItem]) -> dict[str, Any]:
    """One question's verdicts (None where a figure does not apply to it)."""
    current, outdated = question["current"], question["outdated"]
    states_current = [mentions(i.text, current) for i in items]
    states_outdated = [mentions(i.text, outdated) and not c for i, c in zip(items, states_current, strict=True)]
    control = conv["change"].startswith("control")
    verdict: dict[str, Any] = {"current_first": None, "false_supersede": None, "history_found": None}
    if question["kind"] == "current" and not control:
        if current:
            verdict["current_first"] = bool(items) and states_current[0]
        else:  # an ending: the ended value must not come first as if still true
            verdict["current_first"] = not (items and states_outdated[0] and items[0].current)
    if question["kind"] == "current" and control:
        wrong = any(c and not i.current for i, c in zip(items, states_current, strict=True))
        verdict["false_supersede"] = wrong or not (items and states_current[0])
    if question["kind"] == "history":
        verdict["history_found"] = any(states_outdated)
    verdict["outdated_items"] = sum(states_outdated)
    verdict["outdated_marked"] = sum(1 for i, o in zip(items, states_outdated, strict=True) if o and not i.current)
    return verdict


def reference_time(conv: dict[str, Any]) -> datetime:
    """When the questions are asked: a day after the conversation's last message."""
    last = conv["messages"][-1]["timestamp"].replace("Z", "+00:00")
    return datetime.fromisoformat(last) + timedelta(days=1)


def run(service: MemoryService, convs: list[dict[str, Any]], details: Path) -> dict[str, Any]:
    """Store and question every conversation; the figures overall, per split and per change kind."""
    groups: dict[str, Scores] = defaultdict(Scores)
    n_messages = sum(len(c["messages"]) for c in convs)
    progress = Progress("updates", n_messages, unit="msg")
    started = time.perf_counter()
    with details.open("w", encoding="utf-8") as fh:
        for conv in convs:
            store(service, conv)
            service.settle()  # asked a day after the conversation (``reference_time``): all of it stored
            if service.extraction is not None:  # with an LLM: what it reads is in memory before the questions
                service.extraction.settle()
            progress.advance(len(conv["messages"]))
            for q in conv["questions"]:
                result = service.recall(q["question"], user_id=conv["conv_id"], limit=LIMIT,
                                        reference_time=reference_time(conv))
                v = judge(conv, q, result.items)
                for key in ("all", f"split:{conv['split']}", f"change:{conv['change']}",
                            f"{conv['split']}:{conv['change']}"):
                    s = groups[key]
                    for name in ("current_first", "false_supersede", "history_found"):
                        if v[name] is not None:
                            getattr(s, name).add(v[name])
                    s.outdated_marked.hits += v["outdated_marked"]
                    s.outdated_marked.total += v["outdated_items"]
                fh.write(json.dumps({
                    "qid": q["qid"], "split": conv["split"], "attribute": conv["attribute"], "change": conv["change"],
                    "question": q["question"], **v,
                    "items": [{"text": i.text[:160], "kind": i.kind, "current": i.current} for i in result.items],
                }) + "\n")
    progress.close()
    seconds = time.perf_counter() - started
    return {"conversations": len(convs), "messages": n_messages, "seconds": round(seconds, 1),
            "groups": {k: groups[k].as_dict() for k in sorted(groups)}}


def _pct(t: dict[str, Any]) -> str:
    return "–" if t["share"] is None else f"{100 * t['share']:.1f} % ({t['hits']}/{t['total']})"


def report(metrics: dict[str, Any]) -> str:
    """The figures as a Markdown table: overall, per split, per change kind."""
    lines = [f"# updates suite ({metrics['date']}, split {metrics['split']})", "",
             "| group | current first | outdated marked | false supersede | history found |",
             "|---|---|---|---|---|"]
    groups = metrics["groups"]
    order = ["all", *(f"split:{s}" for s in SPLITS)] + sorted(k for k in groups if k.startswith("change:"))
    for key in [k for k in order if k in groups]:
        g = groups[key]
        lines.append(f"| {key} | {_pct(g['current_first'])} | {_pct(g['outdated_marked'])} | "
                     f"{_pct(g['false_supersede'])} | {_pct(g['history_found'])} |")
    return "\n".join(lines) + "\n"


def run_from_args(args: argparse.Namespace, llm: dict[str, Any] | None = None) -> int:
    """``mnemoplan bench --suite updates``: writes metrics.json, report.md and questions.jsonl under --out.

    Without an LLM (whatever the environment configures), unless ``llm`` gives the Settings of one
    (``{}``: the environment's; ``bench --llm``)."""
    from mnemoplan.config import Settings
    from mnemoplan.runtime import configure
    from mnemoplan.service.bootstrap import build_service

    configure()
    convs = load(split=args.split)
    if args.limit_conversations:
        convs = convs[: args.limit_conversations]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="mnemoplan-updates-")) if temporary else args.data_dir
    print(f"bench: updates suite, split {args.split}, {len(convs)} conversations; data in {data_dir}", file=sys.stderr)
    offline = {"llm_provider": "none"} if llm is None else llm
    service = build_service(Settings(data_dir=data_dir, embedding_model=args.embedding_model, **offline))
    try:
        metrics = run(service, convs, out / "questions.jsonl")
    finally:
        service.close()
    metrics = {"suite": "updates", "split": args.split, "date": datetime.now().strftime("%Y-%m-%d"), **metrics}
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2), encoding="utf-8")
    text = report(metrics)
    (out / "report.md").write_text(text, encoding="utf-8")
    print(text, file=sys.stderr)
    if temporary and not args.keep_data:
        shutil.rmtree(data_dir, ignore_errors=True)
    return 0
