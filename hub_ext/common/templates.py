"""Jinja templates of the hub's own pages and fragments, from ``share/gpuhub/templates``.

Autoescape is on: no HTML is ever built with string formatting (STYLE.md).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape


def template_dir() -> Path:
    """The templates folder: the source tree's ``share/`` or the installed ``share/``."""
    for base in (Path(__file__).resolve().parent.parent.parent, Path(sys.prefix)):
        candidate = base / "share" / "gpuhub" / "templates"
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("share/gpuhub/templates not found next to hub_ext or in sys.prefix")


@lru_cache(maxsize=1)
def environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(str(template_dir())),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(name: str, **context) -> str:
    """Render ``name`` with ``context`` (autoescaped)."""
    return environment().get_template(name).render(**context)
