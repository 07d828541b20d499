"""A store moved with its vectors: export with vectors, import into an empty data directory (timed),
then every question of the dataset recalled from both, rankings compared.

    python -m mnemoplan.bench.restore --data-dir KEPT_BENCH_STORE --dataset ../shared/data/locomo10.json --out OUT

``KEPT_BENCH_STORE``: a data directory ``mnemoplan bench --keep-data --data-dir`` filled (one user per
conversation). Writes ``restore.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mnemoplan.bench.datasets import load_directory, load_locomo
from mnemoplan.bench.progress import Progress
from mnemoplan.runtime import configure


def rankings(service: Any, questions: list[Any]) -> dict[str, list[tuple[str, float]]]:
    """Each question's recall (limit 50): ids and scores, in order."""
    out = {}
    progress = Progress("recall", len(questions), unit="q")
    for q in questions:
        result = service.recall(q.question, user_id=q.conv_id, limit=50)
        out[q.qid] = [(i.id, i.score) for i in result.items]
        progress.advance()
    progress.close()
    return out


def main(argv: list[str] | None = None) -> int:
    configure()
    p = argparse.ArgumentParser(prog="python -m mnemoplan.bench.restore", description=__doc__)
    p.add_argument("--data-dir", type=Path, required=True, help="a kept bench store (read, never changed)")
    p.add_argument("--dataset", type=Path, required=True, help="the dataset that store holds")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from mnemoplan.config import Settings
    from mnemoplan.service.bootstrap import build_service
    from mnemoplan.transfer.export import export_users, restore_export, write_export

    dataset = load_locomo(args.dataset) if args.dataset.suffix == ".json" else load_directory(args.dataset)
    args.out.mkdir(parents=True, exist_ok=True)
    export = args.out / "export-with-vectors.jsonl"
    source = build_service(Settings(data_dir=args.data_dir))
    try:
        started = time.perf_counter()
        with export.open("w", encoding="utf-8") as fh:
            records = write_export(source, fh, export_users(source, None), vectors=True)
        export_s = time.perf_counter() - started
        before = rankings(source, dataset.questions)
    finally:
        source.close()
    target_dir = Path(tempfile.mkdtemp(prefix="mnemoplan-restore-")) / "data"
    target = build_service(Settings(data_dir=target_dir))
    try:
        started = time.perf_counter()
        restored = restore_export(target, export)
        target.settle()
        import_s = time.perf_counter() - started
        after = rankings(target, dataset.questions)
    finally:
        target.close()
    # The original's BM25 statistics still count documents it deleted (summaries it replaced: Tantivy
    # keeps their terms until their segment merges); the restored index holds none. The original
    # with its BM25 indexes rebuilt from its log (on a copy) is the other measure.
    copy = Path(tempfile.mkdtemp(prefix="mnemoplan-reindexed-")) / "data"
    shutil.copytree(args.data_dir, copy, ignore=shutil.ignore_patterns("LOCK", "*.sock"))
    reindexed = build_service(Settings(data_dir=copy))
    try:
        for user in reindexed.store.log.user_ids():  # BM25 alone: the vectors stay as the log has them
            reindexed.store.rebuild_bm25(user)
        rebuilt = rankings(reindexed, dataset.questions)
    finally:
        reindexed.close()
    same = sum(1 for qid in before if [i for i, _ in before[qid]] == [i for i, _ in after[qid]])
    same_scores = sum(1 for qid in before if before[qid] == after[qid])
    same_rebuilt = sum(1 for qid in rebuilt if [i for i, _ in rebuilt[qid]] == [i for i, _ in after[qid]])
    same_rebuilt_scores = sum(1 for qid in rebuilt if rebuilt[qid] == after[qid])
    result = {
        "records": records, "export_s": round(export_s, 1), "export_mb": round(export.stat().st_size / 2**20, 1),
        "import_s": round(import_s, 1), "import_per_s": round(restored.stored / import_s, 1) if import_s else 0.0,
        "stored": restored.stored, "skipped": len(restored.skipped), "notes": restored.notes,
        "questions": len(before), "identical_rankings": same, "identical_scores": same_scores,
        "identical_to_reindexed_original": same_rebuilt, "identical_scores_to_reindexed": same_rebuilt_scores,
    }  # fmt: skip
    (args.out / "restore.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(json.dumps(result, indent=2), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
