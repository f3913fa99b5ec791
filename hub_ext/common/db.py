"""Our own tables in the hub database, beside JupyterHub's (run records, the line)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import MetaData
from sqlalchemy.orm import Session

__all__ = ["ensure_tables"]

_created: set[tuple[str, int]] = set()


def ensure_tables(session: Session, metadata: MetaData, upgrade: Callable | None = None) -> None:
    """Create the tables of ``metadata`` that the database lacks, once per process and
    URL; ``upgrade(engine)`` then adds what older tables miss.  JupyterHub's own tables
    and migrations are not touched."""
    engine = session.get_bind().engine
    key = (str(engine.url), id(metadata))
    if key not in _created:
        metadata.create_all(engine, checkfirst=True)
        if upgrade is not None:
            upgrade(engine)
        _created.add(key)
