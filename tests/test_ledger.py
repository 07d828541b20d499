"""The write path's per-user bookkeeping of current facts."""

from __future__ import annotations

import numpy as np

from mnemoplan.storage.ledger import UserLedger


def fact(ledger: UserLedger, rid: str, subject: str, mentions: int = 1) -> None:
    meta = {"subject": subject, "predicate": "likes", "object": rid}
    ledger.add_fact(rid, meta, np.ones(4, dtype=np.float32), mentions)


def test_facts_are_found_by_id_under_their_subject() -> None:
    ledger = UserLedger()
    fact(ledger, "a", "Ann")
    fact(ledger, "b", "Ann")
    fact(ledger, "c", "Ben")
    fact(ledger, "a", "Ann", mentions=9)  # once only
    assert [f.id for f in ledger.current_facts("ann")] == ["a", "b"]
    assert ledger.reinforce("a") == 2 and ledger.raise_mentions("c", 5) == 5
    ledger.retire_fact("a")
    assert [f.id for f in ledger.current_facts("")] == ["b", "c"]
    assert ledger.reinforce("a") == 0  # no longer current
    fact(ledger, "a", "Ann")  # current again (a forget reopened it)
    assert [f.id for f in ledger.current_facts("ann")] == ["b", "a"] and ledger.reinforce("a") == 2
