"""The view's HTML: Jinja2 templates, autoescaped (every text shown is a user's memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

TEMPLATES = Path(__file__).parent / "templates"
_ENV = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]),
                   trim_blocks=True, lstrip_blocks=True)  # fmt: skip


def _short_time(value: str | None) -> str:
    return (value or "")[:16].replace("T", " ")


_ENV.filters["when"] = _short_time


def render(name: str, **context: Any) -> str:
    """The page ``name`` (a template file) filled with ``context``."""
    return _ENV.get_template(name).render(**context)
