"""The graph's reads, as the graph's child process runs them (``kuzu_child.KuzuGraph``'s own half).

Kept apart from the writes; like them, they run only in the child, through ``_run``.
"""

from __future__ import annotations

from typing import Any

CO_MENTION_RECORDS = 1_000  # an entity's latest records over which co-mentioned entities are counted
BY_KEY_MAX = 200  # records a delete (or a look-up) seeks one by one; more take a scan of the graph


class GraphReads:
    """The reads of ``KuzuGraph``, over its ``_run`` (a statement's rows)."""

    def _run(self, query: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        raise NotImplementedError

    def ids(self, user: str) -> set[str]:
        """Every record id of a user in the graph."""
        return {row[0] for row in self._run("MATCH (r:Record {user: $u}) RETURN r.id", {"u": user})}

    # Kùzu seeks a node by its primary key only when the pattern names one key
    # (``{id: $e}``); ``e.id IN $es`` filters a scan of the node table, and a pattern
    # written from the record's side scans every MENTIONS edge of the store (70–90 ms on a
    # store of 500k records, whatever the user's size). So one entity is sought by its key,
    # several are filtered from the Entity side (the smallest table), and the co-mention
    # count, whose cost is the entity's records times their mentions, runs per entity over
    # its latest ``CO_MENTION_RECORDS`` records.

    def entity_records(
        self, user: str, entities: list[str], limit: int = 500, roles: list[str] | None = None
    ) -> list[tuple[str, str, str]]:
        """Records that mention (or are said by) any of the entities: (record, entity, role), newest first."""
        if not entities:
            return []
        role_filter = "AND m.role IN $roles " if roles else ""
        params: dict[str, Any] = {"u": user, "k": limit}
        if roles:
            params["roles"] = roles
        if len(entities) == 1:
            match = "MATCH (e:Entity {id: $e})<-[m:MENTIONS]-(r:Record) WHERE e.user = $u "
            params["e"] = entities[0]
        else:
            match = "MATCH (e:Entity)<-[m:MENTIONS]-(r:Record) WHERE e.id IN $es AND e.user = $u "
            params["es"] = entities
        rows = self._run(f"{match}{role_filter}RETURN r.id, e.id, m.role, r.seq ORDER BY r.seq DESC LIMIT $k", params)
        rows.sort(key=lambda row: (-row[3], row[0], row[1]))  # ties (one record, several entities) in one order
        return [(row[0], row[1], row[2]) for row in rows]

    def related_entities(
        self, user: str, entities: list[str], limit: int = 50
    ) -> list[tuple[str, str, float]]:
        """Entities one step away: through a valid RELATED edge, or mentioned by the same record.

        Returns (from entity, to entity, strength), strongest first. Co-mentions are counted
        over each entity's latest ``CO_MENTION_RECORDS`` records.
        """
        if not entities:
            return []
        # (a, b) -> (strength, order among equal strengths: fact links first, then by co-mentions)
        out: dict[tuple[str, str], tuple[float, float]] = {}

        def put(pair: tuple[str, str], strength: float, order: float) -> None:
            held = out.get(pair)
            if held is None or strength > held[0]:
                out[pair] = (strength, order if held is None else min(order, held[1]))

        for a in entities:
            for b, s in self._run(
                "MATCH (a:Entity {id: $e})-[x:RELATED]-(b:Entity) WHERE a.user = $u AND NOT x.negated "
                "AND (x.valid_to IS NULL) RETURN b.id, max(x.strength)",
                {"e": a, "u": user},
            ):
                put((a, b), float(s or 1.0), float("-inf"))
        seeds = set(entities)
        for a in entities:
            since = self._run(
                "MATCH (a:Entity {id: $e})<-[:MENTIONS]-(r:Record) WHERE a.user = $u "
                "RETURN r.seq ORDER BY r.seq DESC SKIP $n LIMIT 1",
                {"e": a, "u": user, "n": CO_MENTION_RECORDS - 1},
            )
            # No condition on b here: one (b.id <> $e) made Kùzu scan every MENTIONS edge again.
            for b, c in self._run(
                "MATCH (a:Entity {id: $e})<-[:MENTIONS]-(r:Record)-[m:MENTIONS]->(b:Entity) "
                "WHERE a.user = $u AND r.seq >= $s AND m.role <> 'speaker' "
                "RETURN b.id, count(r) AS c ORDER BY c DESC, b.id LIMIT $k",
                {"e": a, "u": user, "s": since[0][0] if since else -1, "k": limit + len(seeds)},
            ):
                if b not in seeds:
                    put((a, b), min(1.0, 0.25 * float(c)), -float(c))
        ranked = sorted(out.items(), key=lambda kv: (-kv[1][0], kv[1][1], kv[0]))[:limit]
        return [(a, b, s) for (a, b), (s, _) in ranked]

    def neighbours(self, ids: list[str]) -> dict[str, tuple[str, str]]:
        """For each record: (previous turn id, next turn id), '' where there is none."""
        if not ids:
            return {}
        out = {rid: ("", "") for rid in ids}
        for rid, prev in self._run(
            "MATCH (p:Record)-[:NEXT]->(r:Record) WHERE r.id IN $ids RETURN r.id, p.id", {"ids": ids}
        ):
            out[rid] = (prev, out[rid][1])
        for rid, nxt in self._run(
            "MATCH (r:Record)-[:NEXT]->(n:Record) WHERE r.id IN $ids RETURN r.id, n.id", {"ids": ids}
        ):
            out[rid] = (out[rid][0], nxt)
        return out

    def session_records(self, user: str, sessions: list[str], limit: int = 2_000) -> list[tuple[str, str]]:
        """Records of some sessions: (record id, session key) in conversation order."""
        if not sessions:
            return []
        return [
            (row[0], row[1])
            for row in self._run(
                "MATCH (r:Record)-[:IN_SESSION]->(s:Session) WHERE s.id IN $ss AND s.user = $u "
                "RETURN r.id, s.id ORDER BY r.seq LIMIT $k",
                {"ss": sessions, "u": user, "k": limit},
            )
        ]

    def derived_from(self, ids: list[str]) -> dict[str, list[str]]:
        """Derived records (facts, summaries) that cite any of ``ids``: source id -> derived ids."""
        if not ids:
            return {}
        out: dict[str, list[str]] = {}
        if len(ids) <= BY_KEY_MAX:  # by key: the list filtered a scan of every record (~25 ms at 500k)
            rows = [(d, rid) for rid in ids for (d,) in self._run(
                "MATCH (d:Record)-[:DERIVED_FROM]->(s:Record {id: $id}) RETURN d.id", {"id": rid})]  # fmt: skip
        else:
            rows = [(d, src) for d, src in self._run(
                "MATCH (d:Record)-[:DERIVED_FROM]->(s:Record) WHERE s.id IN $ids RETURN d.id, s.id", {"ids": ids})]  # fmt: skip
        for derived, source in rows:
            out.setdefault(source, []).append(derived)
        return out
