"""The package's shape: layers import one way, no import circles, each library in its own module.

Layers, lowest first (a module may import its own layer's package and lower layers, never a
sibling package of its own rank):

    errors, config, runtime, progress  <  model  <  extract, inference  <  storage  <  ingest, search
    <  planner  <  service  <  transfer, web  <  server, bench  <  cli
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mnemoplan"
RANK = {
    "errors": 0, "config": 0, "runtime": 0, "progress": 0,
    "model": 1,
    "extract": 2, "inference": 2,
    "storage": 3,
    "ingest": 4, "search": 4,
    "planner": 5,
    "service": 6,
    "transfer": 6.5, "web": 6.5,  # importers, export and the web view: over the service, under the server
    "server": 7, "bench": 7,
    "cli": 8,
    "__init__": 0, "__main__": 9,
}  # fmt: skip
# Each third-party storage, protocol or model library belongs to the one module (or package,
# ending in /) that adapts it.
OWNERS = {
    "lancedb": {"storage/log/"},
    "tantivy": {"storage/bm25.py"},
    "kuzu": {"storage/graph/kuzu_child.py"},
    "anthropic": {"inference/llm_anthropic.py"},
    "openai": {"inference/llm_openai.py"},
    "sentence_transformers": {"inference/forward.py", "inference/cross_encoder.py"},
    "transformers": {"inference/forward.py", "inference/onnx_export.py", "inference/cross_encoder.py"},
    "torch": {"inference/forward.py", "inference/onnx_export.py", "inference/cross_encoder.py"},
    "onnxruntime": {"inference/onnx_forward.py", "inference/onnx_export.py"},
    "tokenizers": {"inference/onnx_forward.py"},
    "filelock": {"storage/lock.py"},
    "tqdm": {"progress.py"},
    "yaml": {"transfer/notes.py"},
    "ijson": {"transfer/sources.py", "server/stdio.py"},
    "jinja2": {"web/pages.py"},
    "platformdirs": {"config.py"},
    # The MCP server lives in server/; the bench drives it from outside with the SDK's client, as a host.
    "mcp": {"server/", "bench/probe.py", "bench/scale_load.py", "bench/replicas_load.py"},
}
# Settings are read by entry points (cli, bench, the server's start) and the composition root.
CONFIG_READERS = ("service/", "server/", "cli/", "bench/", "runtime.py", "config.py")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["mnemoplan", *parts])] = path
    return out


def _imports(path: Path, module: str) -> list[str]:
    """Every module ``path`` imports, at any depth of the file (lazy imports count too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)  # submodules imported by name
    return names


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _owned(rel: str, owners: set[str]) -> bool:
    return any(rel == o or (o.endswith("/") and rel.startswith(o)) for o in owners)


def test_every_top_level_module_has_a_layer() -> None:
    tops = {_top(m) for m in _modules()}
    assert tops <= set(RANK), sorted(tops - set(RANK))


def test_imports_point_one_way() -> None:
    modules = _modules()
    violations = []
    for module, path in modules.items():
        mine = _top(module)
        for name in _imports(path, module):
            if not name.startswith("mnemoplan.") or name not in modules:
                continue
            theirs = _top(name)
            if theirs == mine or theirs == "__init__":
                continue
            if RANK[theirs] >= RANK[mine]:
                violations.append(f"{_rel(path)} imports {name}")
    assert violations == [], "\n".join(map(str, violations))


def test_the_bench_uses_the_service_never_the_server() -> None:
    offenders = [
        f"{_rel(path)} imports {name}"
        for module, path in _modules().items()
        if _top(module) == "bench"
        for name in _imports(path, module)
        if name.startswith("mnemoplan.server")
    ]
    assert offenders == [], "\n".join(map(str, offenders))


def test_each_library_is_imported_by_its_own_module() -> None:
    violations = []
    for module, path in _modules().items():
        rel = _rel(path)
        for name in _imports(path, module):
            owners = OWNERS.get(name.split(".")[0])
            if owners is not None and not _owned(rel, owners):
                violations.append(f"{rel} imports {name} (allowed only in {sorted(owners)})")
    assert violations == [], "\n".join(map(str, violations))


def test_no_import_circles() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        for name in _imports(path, module):
            if name in modules and name != module and not modules[name].name == "__init__.py":
                graph[module].add(name)
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in list(modules):
        if v not in index:
            visit(v)
    assert circles == [], "\n".join(map(str, circles))


def test_config_is_read_only_by_entry_points_and_the_service() -> None:
    readers = [
        _rel(path) for module, path in _modules().items() if "mnemoplan.config" in _imports(path, module)
    ]
    assert all(r.startswith(CONFIG_READERS) for r in readers), readers


def test_the_planner_never_sees_storage() -> None:
    offenders = [
        f"{_rel(path)} imports {name}"
        for module, path in _modules().items()
        if _top(module) == "planner"
        for name in _imports(path, module)
        if name.startswith(("mnemoplan.storage", "mnemoplan.search.") ) and not name.startswith(
            ("mnemoplan.search.base", "mnemoplan.search.registry")
        )
    ]
    assert offenders == [], "\n".join(map(str, offenders))


def test_no_module_is_over_500_lines() -> None:
    long = {_rel(p): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}


def test_no_sql_is_built_outside_the_log() -> None:
    """Filter strings for LanceDB are written by storage/log/ alone; everyone else passes a
    RecordFilter or calls one of the log's verbs."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = _rel(path)
        if rel.startswith("storage/log/"):
            continue
        text = path.read_text(encoding="utf-8")
        for needle in ("sql_str", "sql_in", "sql_ts", "user_id = '", "user_id = {"):
            if needle in text:
                offenders.append(f"{rel}: {needle}")
    assert offenders == [], "\n".join(map(str, offenders))


def test_nothing_happens_at_import() -> None:
    """No module sets process-wide state when imported: environment variables and thread
    counts are applied once, by an entry point (runtime.py)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = _rel(path)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only
            text = ast.unparse(node)
            if isinstance(node, ast.Expr | ast.Assign) and ("os.environ" in text or "set_num_threads" in text):
                offenders.append(f"{rel}: {text[:80]}")
    assert offenders == [], "\n".join(map(str, offenders))
