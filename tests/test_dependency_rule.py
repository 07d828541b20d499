"""The one-way import rule: model, errors <- extract <- indexes <- planner <- server (and bench)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mnemoplan"
# bench is part of the application layer: the CLI dispatches to it, it drives the service.
LAYERS = {"model": 0, "errors": 0, "config": 0, "extract": 1, "indexes": 2, "planner": 3, "server": 4, "bench": 4}
# Each third-party storage or protocol library belongs to exactly one module.
OWNERS = {
    "lancedb": {"indexes/lance_log.py"},
    "tantivy": {"indexes/bm25.py"},
    "kuzu": {"indexes/kuzu_graph.py"},
    "anthropic": {"planner/llm.py"},
    "sentence_transformers": {"indexes/embedder.py", "indexes/cross_encoder.py"},
}


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def _layer(rel: Path) -> int | None:
    top = rel.parts[0].removesuffix(".py")
    return LAYERS.get(top)


def test_imports_point_one_way() -> None:
    violations = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        mine = _layer(rel)
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "mnemoplan" and len(parts) > 1:
                theirs = LAYERS.get(parts[1])
                if mine is not None and theirs is not None and theirs > mine:
                    violations.append(f"{rel} imports {name}")
            if parts[0] == "mcp" and rel.parts[0] != "server":
                violations.append(f"{rel} imports mcp outside server/")
            owners = OWNERS.get(parts[0])
            if owners is not None and rel.as_posix() not in owners:
                violations.append(f"{rel} imports {parts[0]} (allowed only in {sorted(owners)})")
    assert violations == []


def test_config_is_read_only_by_the_server() -> None:
    readers = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "mnemoplan.config" in _imports(path)
    ]
    assert all(r.startswith(("server/", "bench/")) for r in readers), readers


def test_planner_never_sees_a_concrete_adapter() -> None:
    adapters = {"mnemoplan.indexes.lance_log", "mnemoplan.indexes.bm25", "mnemoplan.indexes.graph",
                "mnemoplan.indexes.store"}  # fmt: skip
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in (PACKAGE / "planner").rglob("*.py")
        for name in _imports(path)
        if name in adapters
    ]
    assert offenders == []
