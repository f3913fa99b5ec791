"""The line's rows in the hub database: one per waiting server, in table ``gpuhub_line``.

Kept in the hub's own database (``c.JupyterHub.db_url``), beside the run records
(:mod:`hub_ext.common.runs`), so that the line survives a hub restart, ``kill -9`` included, with
the same order.  Two unique constraints keep the rules in the database itself: one place
per server (``username, server_name``) and one place per member per profile
(``username, profile``).  The table is created on first use; JupyterHub's own tables and
migrations are not touched.  Times are naive UTC, JupyterHub's convention.

Rows are written by :class:`Writer`, off the hub's event loop.

Order: rows marked ``front`` (moved there by an admin) first, then, with fair share on,
fewer GPU-hours first, then ``rank`` (the row's id when it joined: first come, first
served).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    Integer,
    String,
    UniqueConstraint,
    create_engine,
    delete,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..common.db import ensure_tables

__all__ = ["LineRow", "Writer", "delete_row", "ensure_table", "insert_row", "load_rows", "move_row"]


class Base(DeclarativeBase):
    """Our own metadata, apart from JupyterHub's ``orm.Base``."""


class LineRow(Base):
    """One waiting server: who, for which profile and units, since when, and its rank."""

    __tablename__ = "gpuhub_line"
    __table_args__ = (
        UniqueConstraint("username", "server_name", name="uq_gpuhub_line_server"),
        UniqueConstraint("username", "profile", name="uq_gpuhub_line_profile"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(255), index=True)
    server_name: Mapped[str] = mapped_column(String(255), default="")
    profile: Mapped[str] = mapped_column(String(255), default="")
    profile_name: Mapped[str] = mapped_column(String(255), default="")
    #: what it waits for: "gpu" (whole GPUs) or a MIG slice profile such as "1g.5gb"
    units: Mapped[str] = mapped_column(String(64), default="gpu")
    count: Mapped[int] = mapped_column(Integer, default=1)
    user_options: Mapped[dict] = mapped_column(JSON, default=dict)
    queued_at: Mapped[datetime] = mapped_column(DateTime)
    rank: Mapped[float] = mapped_column(Float, default=0.0)
    front: Mapped[bool] = mapped_column(Boolean, default=False)
    #: GPU-hours used in the fair-share window when it joined (0 with fair share off)
    share_hours: Mapped[float] = mapped_column(Float, default=0.0)

    def queued_epoch(self) -> float:
        """``queued_at`` as seconds since the epoch."""
        return self.queued_at.replace(tzinfo=UTC).timestamp()


def ensure_table(session: Session) -> None:
    """Create ``gpuhub_line`` if the database lacks it (once per process and URL)."""
    ensure_tables(session, Base.metadata)


def load_rows(session: Session) -> list[LineRow]:
    """Every row, by id."""
    ensure_table(session)
    return list(session.scalars(select(LineRow).order_by(LineRow.id)))


def insert_row(session: Session, fields: dict) -> None:
    """Add a row (``LineRow`` fields); raises IntegrityError when the server or the
    member's profile has a row already."""
    ensure_table(session)
    session.add(LineRow(**fields))


def delete_row(session: Session, username: str, server_name: str) -> None:
    """Delete the row of that server; idempotent."""
    ensure_table(session)
    session.execute(
        delete(LineRow).where(LineRow.username == username, LineRow.server_name == server_name)
    )


def move_row(session: Session, username: str, server_name: str, rank: float) -> None:
    """Mark the row of that server as moved to the front, with ``rank``."""
    ensure_table(session)
    session.execute(
        update(LineRow)
        .where(LineRow.username == username, LineRow.server_name == server_name)
        .values(front=True, rank=rank)
    )


class Writer:
    """Writes rows in one thread of its own, in the order asked, through an engine of its
    own on the hub database: a slow commit (SQLite's fsync takes tens of milliseconds on a
    busy disk) never stalls the hub's event loop.  An in-memory SQLite database (one
    connection's own) is written in the caller's session instead.
    """

    def __init__(self, session: Session):
        url = session.get_bind().engine.url
        self.session = (
            session
            if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")
            else None
        )
        self.engine = (
            None
            if self.session is not None
            else create_engine(url.render_as_string(hide_password=False))
        )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gpuhub-line-db")

    def _run(self, write, *args) -> None:
        with Session(self.engine) as session:
            write(session, *args)
            session.commit()

    def submit(self, write, *args) -> asyncio.Future:
        """Run ``write(session, *args)`` and commit; a future of its end (asyncio)."""
        if self.session is not None:
            future = asyncio.get_running_loop().create_future()
            try:
                write(self.session, *args)
                self.session.commit()
                future.set_result(None)
            except Exception as e:  # noqa: BLE001 - handed to the caller
                self.session.rollback()
                future.set_exception(e)
            return future
        return asyncio.wrap_future(self._thread.submit(self._run, write, *args))
