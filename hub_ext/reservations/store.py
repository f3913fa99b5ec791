"""Reservations in the hub database: table ``gpuhub_reservations``, one row per reservation.

Kept in the hub's own database (``c.JupyterHub.db_url``), beside the run records
(:mod:`hub_ext.common.runs`) and the line (:mod:`hub_ext.line.store`), so a backup of the hub keeps
them and a PostgreSQL hub keeps them in PostgreSQL.  The table is created on first use;
JupyterHub's own tables and migrations are not touched.  Times are naive UTC in the table
(JupyterHub's convention); :func:`to_spec` and :func:`to_model` give them back aware.
Ids are never reused (SQLite ``AUTOINCREMENT``; a sequence elsewhere), so a deleted
reservation's id never names a new one.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime

from sqlalchemy import JSON, DateTime, Integer, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..common.db import ensure_tables
from .rules import NOTE_CHARS, RRULE_CHARS, Spec

__all__ = [
    "ReservationRow",
    "all_specs",
    "delete",
    "ensure_table",
    "get",
    "insert",
    "iso",
    "load",
    "made_at",
    "to_model",
    "to_spec",
    "update",
]


class Base(DeclarativeBase):
    """Our own metadata, apart from JupyterHub's ``orm.Base``."""


class ReservationRow(Base):
    """One reservation: a group's GPUs (or MIG slices) for a window, maybe weekly."""

    __tablename__ = "gpuhub_reservations"
    __table_args__ = {"sqlite_autoincrement": True}

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: the JupyterHub group whose members the GPUs are for
    group: Mapped[str] = mapped_column(String(255), index=True)
    #: whole GPUs, or MIG slices of ``mig_profile``
    gpus: Mapped[int] = mapped_column(Integer)
    mig_profile: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: the first occurrence, naive UTC
    start: Mapped[datetime] = mapped_column(DateTime, index=True)
    end: Mapped[datetime] = mapped_column(DateTime)
    #: IANA zone whose wall-clock time a recurrence keeps
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    #: RFC 5545 RRULE (FREQ=WEEKLY;...); None: once
    rrule: Mapped[str | None] = mapped_column(String(RRULE_CHARS), nullable=True)
    #: starts of cancelled occurrences, ISO 8601 UTC texts
    exdates: Mapped[list] = mapped_column(JSON, default=list)
    note: Mapped[str] = mapped_column(String(NOTE_CHARS), default="")
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime)


def ensure_table(session: Session) -> None:
    """Create ``gpuhub_reservations`` if the database lacks it (once per process and URL)."""
    ensure_tables(session, Base.metadata)


def _naive(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(tzinfo=None)


def _aware(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC)


def iso(when: datetime) -> str:
    """An aware datetime as the API writes it: ISO 8601, UTC, to the second."""
    return when.astimezone(UTC).isoformat(timespec="seconds")


def _values(spec: Spec) -> dict:
    values = asdict(spec)
    values.pop("id")
    values.update(
        start=_naive(spec.start), end=_naive(spec.end), exdates=[iso(x) for x in spec.exdates]
    )
    return values


def to_spec(row: ReservationRow) -> Spec:
    """The row's rule, times aware UTC."""
    return Spec(
        group=row.group,
        gpus=row.gpus,
        mig_profile=row.mig_profile,
        start=_aware(row.start),
        end=_aware(row.end),
        timezone=row.timezone,
        rrule=row.rrule,
        note=row.note or "",
        id=row.id,
        exdates=tuple(datetime.fromisoformat(x) for x in row.exdates or ()),
    )


def made_at(row: ReservationRow) -> datetime:
    """When the reservation was made, aware UTC."""
    return _aware(row.created_at)


def to_model(row: ReservationRow) -> dict:
    """The row as the REST API shows it (times ISO 8601 UTC)."""
    return {
        "id": row.id,
        "group": row.group,
        "gpus": row.gpus,
        "mig_profile": row.mig_profile,
        "start": iso(_aware(row.start)),
        "end": iso(_aware(row.end)),
        "timezone": row.timezone,
        "rrule": row.rrule,
        "exdates": list(row.exdates or []),
        "note": row.note or "",
        "created_by": row.created_by,
        "created_at": iso(_aware(row.created_at)),
    }


def load(session: Session, groups: set[str] | None = None) -> list[ReservationRow]:
    """Every reservation (of ``groups`` only, when given), by start."""
    ensure_table(session)
    query = select(ReservationRow)
    if groups is not None:
        query = query.where(ReservationRow.group.in_(sorted(groups)))
    return list(session.scalars(query.order_by(ReservationRow.start, ReservationRow.id)))


def all_specs(session: Session) -> list[Spec]:
    """Every reservation's rule, for the capacity check."""
    return [to_spec(row) for row in load(session)]


def get(session: Session, reservation_id: int) -> ReservationRow | None:
    ensure_table(session)
    return session.get(ReservationRow, reservation_id)


def insert(session: Session, spec: Spec, created_by: str, now: datetime) -> ReservationRow:
    """Store a new reservation; commits.  Returns the row (with its id)."""
    ensure_table(session)
    row = ReservationRow(**_values(spec), created_by=created_by, created_at=_naive(now))
    session.add(row)
    session.commit()
    return row


def update(session: Session, row: ReservationRow, spec: Spec) -> ReservationRow:
    """Replace the row's rule with ``spec``; commits."""
    for key, value in _values(spec).items():
        setattr(row, key, value)
    session.commit()
    return row


def delete(session: Session, row: ReservationRow) -> None:
    """Delete the row; commits."""
    session.delete(row)
    session.commit()
