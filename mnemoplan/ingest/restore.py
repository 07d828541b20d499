"""Records written back as they were exported: same ids, times, sources, facts and their history.

An export (``transfer/export.py``) may carry each record's vectors, of the model that made them:
with that model they are written as they were. Otherwise (no vectors, another model) each record
is embedded again as ``remember`` embeds it, and a summary takes the mean of its messages'
vectors, as when it was made. Records the log holds already (the same id) are skipped, so
restoring twice stores nothing the second time.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from mnemoplan.ingest.episodes import episode_vector
from mnemoplan.ingest.pipeline import Ingestor
from mnemoplan.model import Record
from mnemoplan.model.scope import RecordFilter


def restore_records(
    ingestor: Ingestor, records: list[Record], stored: Mapping[str, tuple[np.ndarray, bytes | None]] | None = None
) -> tuple[int, int]:
    """Store ``records`` (of one user, in their stored order) that the log lacks, with the
    ``stored`` embedding and packed tokens of those that have them (the others embedded now).

    Returns:
        (stored, already there).

    Raises:
        ValueError: records of more than one user.
    """
    if not records:
        return 0, 0
    user = records[0].user_id
    if any(r.user_id != user for r in records):
        raise ValueError("restore_records takes the records of one user")
    store = ingestor.store
    with store.writing(user):
        present = set(store.log.ids(RecordFilter(user, ids=tuple(r.id for r in records))))
        fresh = [r for r in records if r.id not in present]
        if not fresh:
            return 0, len(records)
        given = stored or {}
        episodes = {i for i, r in enumerate(fresh) if r.kind == "episode" and r.derived_from and r.id not in given}
        plain = [r for i, r in enumerate(fresh) if i not in episodes and r.id not in given]
        vectors, tokens = ingestor.embed_records(plain) if plain else (np.zeros((0, 0), np.float32), [])
        by_id = {**{r.id: v for r, v in zip(plain, vectors, strict=True)}, **{k: v for k, (v, _) in given.items()}}
        rows: list[np.ndarray] = []
        packed: list[bytes | None] = []
        tokens_of = {**{r.id: t for r, t in zip(plain, tokens, strict=True)}, **{k: t for k, (_, t) in given.items()}}
        for rec in fresh:
            if rec.id in by_id:
                rows.append(by_id[rec.id])
                packed.append(tokens_of[rec.id])
            else:  # a summary: the mean of its messages' vectors, as the ingestor makes it
                rows.append(episode_vector(ingestor.store, rec, plain, vectors))
                packed.append(None)
        store.append(fresh, np.stack(rows).astype(np.float32), packed)
        store.drop_ledger(user)  # facts, summaries and supersessions are read from the log again
    return len(fresh), len(records) - len(fresh)
