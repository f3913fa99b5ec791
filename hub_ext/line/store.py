"""The line's rows in the hub database: one per waiting server, in table ``gpuhub_line``.

Kept in the hub's own database (``c.JupyterHub.db_url``), beside the run records
(:mod:`hub_ext.runs`), so that the line survives a hub restart, ``kill -9`` included, with
the same order.  Two unique constraints keep the rules in the database itself: one place
per server (``username, server_name``) and one place per member per profile
(``username, profile``).  The table is created on first use; JupyterHub's own tables and
migrations are not touched.  Times are naive UTC, JupyterHub's convention.

Order: rows marked ``front`` (moved there by an admin) first, then, with fair share on,
fewer GPU-hours first, then ``rank`` (the row's id when it joined: first come, first
served).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, Integer, String, UniqueConstraint, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..hubdb import ensure_tables

__all__ = ["LineRow", "delete_row", "ensure_table", "load_rows"]


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


def delete_row(session: Session, row_id: int) -> None:
    """Delete row ``row_id``; idempotent.  Commits."""
    row = session.get(LineRow, row_id)
    if row is not None:
        session.delete(row)
        session.commit()
