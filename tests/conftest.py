"""Shared fixtures: a service on real stores in a temporary directory, and an MCP stdio client."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mnemoplan.config import Settings
from mnemoplan.runtime import configure
from mnemoplan.service.bootstrap import build_service
from mnemoplan.service.service import MemoryService

configure()  # what an entry point applies first (runtime.py)
# The real model's ONNX export, made once per test run (the first test that loads the model) and
# kept in a temporary directory rather than the user's cache.
MODEL_CACHE = tempfile.mkdtemp(prefix="mnemoplan-test-models-")
atexit.register(shutil.rmtree, MODEL_CACHE, ignore_errors=True)
os.environ.setdefault("MNEMOPLAN_MODEL_CACHE_DIR", MODEL_CACHE)


def make_service(data_dir: Path, **overrides: Any) -> MemoryService:
    """A service over real LanceDB, Tantivy and Kùzu stores, with the small test embedder.

    ``remember`` stores before it answers unless a test asks otherwise: most tests read the
    stores right after it. The worker-thread path (the server's default) has its own tests
    (test_deferred_ingest.py) and runs under every MCP test."""
    overrides.setdefault("remember_in_background", False)
    settings = Settings(data_dir=data_dir, embedding_model=overrides.pop("embedding_model", "hash"), **overrides)
    return build_service(settings)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MemoryService]:
    svc = make_service(tmp_path / "data")
    yield svc
    svc.close()


def server_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """Environment of a server under test: its own data directory, the test embedder, no LLM."""
    env = {
        "MNEMOPLAN_DATA_DIR": str(data_dir),
        "MNEMOPLAN_EMBEDDING_MODEL": "hash",
        "ANTHROPIC_API_KEY": "",
        "MNEMOPLAN_LLM_PROVIDER": "none",
        "LANCE_LOG": "error",
        "PYTHONPATH": os.pathsep.join(sys.path),
        "MNEMOPLAN_MODEL_CACHE_DIR": os.environ["MNEMOPLAN_MODEL_CACHE_DIR"],
    }
    env.update(extra)
    return env


def run_with_client(data_dir: Path, scenario: Callable[[Any], Awaitable[Any]], **env: str) -> Any:
    """Start ``mnemoplan serve`` over stdio, as a host would, and run ``scenario(client)``."""
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mnemoplan", "serve"],
        env=server_env(data_dir, **env),
    )

    async def main() -> Any:
        async with Client(params, mode="legacy") as client:
            return await scenario(client)

    return anyio.run(main)
