#!/usr/bin/env python3
"""Independent re-scoring of a bench run's rankings-*.jsonl, with no mnemoplan import.

    python bench/rescore.py --dataset ../shared/data/locomo10.json /tmp/b
    python bench/rescore.py --messages M.jsonl --questions Q.jsonl /tmp/b

Written separately from mnemoplan/bench/metrics.py (it parses the data itself), so a bug
in one is unlikely to hide in the other. Prints overall R@5/10/25, any@5/10, session_R@10
per rankings file, and exits non-zero if metrics.json disagrees by more than 0.1 point.
"""

import argparse
import json
import re
import sys
from pathlib import Path


def locomo_questions(path):
    data = json.loads(Path(path).read_text())
    questions, sessions = {}, {}
    for sample in data:
        conv = sample["sample_id"]
        for key, turns in sample["conversation"].items():
            m = re.fullmatch(r"session_(\d+)", key)
            if m:
                for t in turns:
                    sessions[(conv, t["dia_id"])] = int(m.group(1))
        for i, qa in enumerate(sample["qa"]):
            ev = []
            for raw in qa.get("evidence", []):
                for tok in re.split(r"[;,\s]+", str(raw)):
                    m = re.fullmatch(r"D:?(\d+):0*(\d+)", tok)
                    if m and f"D{int(m.group(1))}:{int(m.group(2))}" not in ev:
                        ev.append(f"D{int(m.group(1))}:{int(m.group(2))}")
            if ev:
                ev_sessions = {int(e[1:].split(":")[0]) for e in ev}
                questions[f"{conv}:{i}"] = (conv, ev, ev_sessions)
    return questions, sessions


def jsonl_questions(messages, questions_path):
    sessions = {}
    for line in Path(messages).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            sessions[(str(row["conv_id"]), str(row["dia_id"]))] = int(row["session"])
    questions = {}
    for line in Path(questions_path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            conv = str(row["conv_id"])
            ev = list(dict.fromkeys(str(e).strip() for e in row.get("evidence", []) if str(e).strip()))
            if ev:
                ev_sessions = {sessions[(conv, e)] for e in ev if (conv, e) in sessions}
                questions[str(row["qid"])] = (conv, ev, ev_sessions)
    return questions, sessions


def score(questions, sessions, rankings):
    totals = {"R@5": 0.0, "R@10": 0.0, "R@25": 0.0, "any@5": 0.0, "any@10": 0.0, "session_R@10": 0.0}
    for qid, (conv, ev, ev_sessions) in questions.items():
        ranked = []
        for dia in rankings.get(qid, []):
            if dia not in ranked:
                ranked.append(dia)
        for k in (5, 10, 25):
            found = sum(1 for e in ev if e in ranked[:k])
            totals[f"R@{k}"] += found / len(ev)
            if k in (5, 10):
                totals[f"any@{k}"] += 1.0 if found else 0.0
        seen = []
        for dia in ranked:
            s = sessions.get((conv, dia))
            if s is not None and s not in seen:
                seen.append(s)
            if len(seen) == 10:
                break
        if ev_sessions:
            totals["session_R@10"] += len(ev_sessions & set(seen)) / len(ev_sessions)
    return {k: 100 * v / len(questions) for k, v in totals.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset")
    ap.add_argument("--messages")
    ap.add_argument("--questions")
    ap.add_argument("run_dir")
    args = ap.parse_args()
    if args.dataset:
        questions, sessions = locomo_questions(args.dataset)
    else:
        questions, sessions = jsonl_questions(args.messages, args.questions)
    run = Path(args.run_dir)
    metrics = json.loads((run / "metrics.json").read_text()) if (run / "metrics.json").exists() else {}
    reported = metrics.get("modes", {})
    if metrics.get("conversation_ids"):  # a run limited to some conversations
        keep = set(metrics["conversation_ids"])
        questions = {qid: q for qid, q in questions.items() if q[0] in keep}
    worst = 0.0
    for path in sorted(run.glob("rankings-*.jsonl")):
        mode = path.stem.removeprefix("rankings-")
        rankings = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rankings[row["qid"]] = row["ranked"]
        mine = score(questions, sessions, rankings)
        theirs = reported.get(mode, {}).get("quality", {}).get("overall", {})
        diffs = {k: abs(mine[k] - theirs[k]) for k in mine if k in theirs}
        worst = max([worst, *diffs.values()])
        print(f"{mode:8s} n={len(questions)} " + " ".join(f"{k} {v:.1f}" for k, v in mine.items())
              + (f"  (max diff vs metrics.json {max(diffs.values()):.3f})" if diffs else ""))
    sys.exit(1 if worst > 0.1 else 0)


if __name__ == "__main__":
    main()
