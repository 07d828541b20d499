"""Final ranking: conversational-context expansion and priors on top of the fused scores."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from mnemoplan.model import Record, RecordHead
from mnemoplan.planner.fusion import Candidate

Heads = Mapping[str, Record] | Mapping[str, RecordHead]  # ranking reads only what both carry


@dataclass(frozen=True)
class RankingConfig:
    """Knobs of the final ranking.

    Attributes:
        context_propagation: Share of the next turn's score a turn inherits (the answer
            often sits one turn before the words that match the question, or after them).
        context_backward: The same from the previous turn, as a fraction of the above.
        session_weight: Weight of the session prior: a turn in a session where several
            turns match gains (evidence clusters in sessions).
        session_top: How many of a session's best candidates make its score.
        recency_half_life_days: Half-life of the recency prior; 0 turns it off.
        recency_weight: Weight of the recency prior.
        importance_weight: Weight of the stored importance.
        use_weight: Weight of past use: log(1 + access count), reaching the full weight at
            ``use_saturation`` retrievals. Off by default: no benchmark we have repeats use.
        use_saturation: Access count at which the use prior stops growing.
        superseded_factor: Multiplier of a record that a newer fact replaced (a fact, or the
            message all of whose facts were). What it loses is not lost: the newer fact, when a
            candidate, scores at least what the replaced record scored before (``to_successors``).
        list_context_factor: For a question asking for several things, the context
            propagation is scaled by this (neighbours would crowd out other answers).
        list_session_decay: For such a question, each further turn from an already
            ranked session loses this share of its score (coverage across sessions).
        reply_share: Share of a question turn's final score that passes to the turn after it,
            its reply: a question matches what it asks about, the reply holds the answer.
            The question keeps the rest. 0 turns it off.
    """

    context_propagation: float = 0.5
    context_backward: float = 0.5
    session_weight: float = 0.2
    session_top: int = 3
    recency_half_life_days: float = 0.0
    recency_weight: float = 0.1
    importance_weight: float = 0.0
    use_weight: float = 0.0
    use_saturation: int = 100
    superseded_factor: float = 0.5
    list_context_factor: float = 0.5
    list_session_decay: float = 0.0
    reply_share: float = 0.2


def _add(cand: Candidate, signal: str, value: float) -> None:
    cand.scores[signal] = round(cand.scores.get(signal, 0.0) + value, 4)
    cand.score += value


def replies(live: dict[str, Candidate], records: Heads) -> dict[str, str]:
    """Candidate -> the candidate that follows it in its session."""
    return {records[rid].prev_id: rid for rid in live if records[rid].prev_id}


def expand_context(
    live: dict[str, Candidate], records: Heads, config: RankingConfig, next_of: dict[str, str]
) -> None:
    """Each turn inherits part of the best score of its neighbours in the conversation; not a
    turn long enough to stand alone (an assistant's long reply to the turn that matched), nor
    from one: a long reply matches for what it says itself, and would otherwise lift the short
    turns around it over itself (a long reply does not drown short turns, nor they it).

    Nor a user's turn to an assistant, nor from one: between two people "Yes, last Friday!"
    means what the turn before it asked, but a user's request says what it is about, and the
    user's turns next to a matching reply, lifted by it, took the places of the answers
    (realmem-dev in bench/README.md). A user's short answer to an assistant's question still
    gets that question's share (``pass_to_replies``)."""
    if config.context_propagation <= 0:
        return
    apart = {rid for rid in live if records[rid].alone or records[rid].requests}
    base = {rid: c.score for rid, c in live.items() if rid not in apart}
    for rid, cand in live.items():
        if rid in apart:
            continue
        after = base.get(next_of.get(rid, ""), 0.0)
        before = base.get(records[rid].prev_id, 0.0) * config.context_backward
        bonus = config.context_propagation * max(after, before)
        if bonus > 0:
            _add(cand, "context", bonus)


def pass_to_replies(live: dict[str, Candidate], records: Heads, share: float, reply_to: dict[str, str]) -> None:
    """A question turn gives ``share`` of its score to the candidate that replies to it.

    What it gives up, it gives up whether or not its reply is a candidate: the question is
    a weaker answer either way (measured on LoCoMo in bench/README.md).
    """
    if share <= 0:
        return
    base = {rid: c.score for rid, c in live.items()}
    for rid, cand in live.items():
        if not records[rid].asks:
            continue
        passed = share * base[rid]
        _add(cand, "asks", -passed)
        reply = reply_to.get(rid)
        if reply is not None:
            _add(live[reply], "reply", passed)


def to_successors(live: dict[str, Candidate], records: Heads, before: dict[str, float]) -> None:
    """A replaced record that matches the question well says the question is about its slot,
    whose answer now is the fact that replaced it: that fact, when a candidate, scores at least
    what any record it replaced scored, before that one's demotion (``before``) or after what
    came later (a reply's share). Through a chain (Lyon -> Porto -> Paris) the floor is carried
    to the current end; the records between keep their own scores. "Where do I live?" matches
    "I live in Oslo" better than "I moved to Bergen", and must still put Bergen first.
    """
    carried: dict[str, float] = {}
    floor: dict[str, float] = {}
    for rid in sorted(before, key=lambda r: records[r].seq):  # older first: a chain's links in order
        best = max(before[rid], live[rid].score, carried.get(rid, 0.0))
        successor = records[rid].superseded_by
        if successor not in live:
            continue
        target = carried if successor in before else floor
        target[successor] = max(target.get(successor, 0.0), best)
    for rid, score in floor.items():
        if score > live[rid].score:
            _add(live[rid], "replaces", score - live[rid].score)


def session_prior(live: dict[str, Candidate], records: Heads, config: RankingConfig) -> None:
    """Turns gain with the strength of their session among the candidates."""
    if config.session_weight <= 0:
        return
    by_session: dict[str, list[float]] = defaultdict(list)
    for rid, cand in live.items():
        if records[rid].session_id:
            by_session[records[rid].session_id].append(cand.score)
    if not by_session:
        return
    strength = {s: sum(sorted(v, reverse=True)[: config.session_top]) / config.session_top for s, v in by_session.items()}
    top = max(strength.values()) or 1.0
    for rid, cand in live.items():
        session = records[rid].session_id
        if session:
            _add(cand, "session", config.session_weight * strength[session] / top)


def diversify(ranked: list[Candidate], records: Heads, decay: float) -> list[Candidate]:
    """Greedy re-order: a turn's score shrinks with how many of its session's turns rank above it."""
    if decay <= 0:
        return ranked
    out: list[Candidate] = []
    seen: dict[str, int] = defaultdict(int)
    pool = list(ranked)
    while pool:
        best = max(pool, key=lambda c: c.score * (1 - decay) ** seen[records[c.id].session_id])
        pool.remove(best)
        out.append(best)
        seen[records[best.id].session_id] += 1
    return out


def rank(
    cands: dict[str, Candidate],
    records: Heads,
    config: RankingConfig,
    now: datetime,
    *,
    wants_list: bool = False,
) -> list[Candidate]:
    """Score and order candidates whose records are known; the others are dropped."""
    live = {rid: c for rid, c in cands.items() if rid in records}
    if wants_list:
        config = replace(config, context_propagation=config.context_propagation * config.list_context_factor)
    next_of = replies(live, records)
    expand_context(live, records, config, next_of)
    session_prior(live, records, config)
    replaced: dict[str, float] = {}
    for rid, cand in live.items():
        rec = records[rid]
        if config.recency_half_life_days > 0:
            age_days = max(0.0, (now - rec.occurred_at).total_seconds() / 86400)
            _add(cand, "recency", config.recency_weight * math.pow(0.5, age_days / config.recency_half_life_days))
        if config.importance_weight > 0:
            _add(cand, "importance", config.importance_weight * rec.importance)
        if config.use_weight > 0 and rec.access_count:
            use = min(1.0, math.log1p(rec.access_count) / math.log1p(config.use_saturation))
            _add(cand, "use", config.use_weight * use)
        if rec.superseded_by:
            replaced[rid] = cand.score
            cand.score *= config.superseded_factor
    pass_to_replies(live, records, config.reply_share, next_of)
    to_successors(live, records, replaced)
    ranked = sorted(live.values(), key=lambda c: (-c.score, -records[c.id].seq))
    return diversify(ranked, records, config.list_session_decay) if wants_list else ranked
