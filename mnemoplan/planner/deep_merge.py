"""Deep search's answer from recall's: recall's first items kept in place, then what deep's own
steps found merged in by reciprocal ranks."""

from __future__ import annotations

from mnemoplan.model import MemoryItem

RRF_K = 5  # reciprocal ranks 1/(k + rank): a small k leans on the first places


def message_key(item: MemoryItem) -> str:
    """A message and its passages are one answer (as ``recall.once_per_message`` shows them)."""
    return item.derived_from[0] if item.kind == "passage" and item.derived_from else item.id


def start_from_recall(recall: list[MemoryItem], found: list[MemoryItem], keep: int, share: float) -> list[MemoryItem]:
    """Deep's answer, starting from recall's: recall's first items in place, as many as show
    ``keep`` messages (a fact or a summary counts as the messages it came from), then
    recall's other items and what deep's own steps found, by reciprocal ranks (deep's at
    ``share`` of recall's). Without evidence of its own (a judge, a reranker) deep does not
    reorder what recall put first: on agent conversations its own fusion ranked below recall's
    (bench/README.md); what it adds is what recall did not find."""
    out: list[MemoryItem] = []
    shown: set[str] = set()  # the messages recall's first items show: a fact counts as its sources
    for item in recall:
        if len(shown) >= keep:
            break
        out.append(item)
        shown.update(item.derived_from if item.kind != "passage" and item.derived_from else [message_key(item)])
    taken = {message_key(i) for i in out}
    score: dict[str, float] = {}
    by_key: dict[str, MemoryItem] = {}
    for weight, items in ((1.0, recall), (share, found)):
        seen: set[str] = set()
        for item in items:
            key = message_key(item)
            if key in seen:
                continue
            seen.add(key)  # ranks are places in each list, the kept ones counted
            if key not in taken:
                score[key] = score.get(key, 0.0) + weight / (RRF_K + len(seen))
                by_key.setdefault(key, item)  # recall's item first: its marks are the answer's
    return out + [by_key[k] for k in sorted(score, key=lambda k: -score[k])]
