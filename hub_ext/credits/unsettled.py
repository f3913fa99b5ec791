"""What the credits hook still owes, in the hub database: table ``gpuhub_credits_unsettled``.

When a server stops, its start fails, or a start is given up, :class:`CreditsHook` settles
at once: the final charges and the pro rata refund (a stop), the whole first debit (a
failed start), or the refund of a debit whose answer was lost (a void).  The record it
settles from was in spawner state, which JupyterHub clears at the stop.  When the Credits
API cannot be reached then, the meter retries; without this table those retries lived only
in the hub's memory, and a hub stopped (``kill -9`` included) before the API answered
forgot the refund: the member kept paying for an interval they did not use.

A row is written **before** the first attempt, not when it fails: a hub killed while that
attempt is under way (the request sent, its answer not yet read) would otherwise lose it,
since the spawner state is gone and no failure was ever seen.  A row for a settlement that
was in fact made is harmless: its retry sends the same Idempotency-Keys (derived from the
server run and the interval, :mod:`hub_ext.credits.metering`), and the Credits API answers
with the first transaction instead of a second one.  The row is deleted once settled.

One row per server run (primary key ``server_id``, the meter's id of the run), kept in the
hub's own database (``c.JupyterHub.db_url``, SQLite or PostgreSQL) beside the run records
(:mod:`hub_ext.common.runs`) and the line (:mod:`hub_ext.line.store`); the table is created on
first use, JupyterHub's own tables and migrations are not touched.  Times are naive UTC,
JupyterHub's convention.  At hub start :func:`settle_at_start` hands the rows to the meter.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import JSON, Boolean, DateTime, String, delete, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, object_session

from ..common.db import ensure_tables
from ..common.runs import naive_utc
from .metering import MeterRecord

__all__ = ["KINDS", "Owed", "UnsettledRow", "UnsettledStore", "ensure_table", "settle_at_start"]

#: ``stop``: final charges and the pro rata refund (``stopped_at``, ``charge_to_stop``),
#: also a failed start (refund from its start) and a server whose container vanished;
#: ``void``: a first debit to refund if it was made (its answer was lost, or the hub
#: stopped in the middle of the start)
KINDS = ("stop", "void")


class Base(DeclarativeBase):
    """Our own metadata, apart from JupyterHub's ``orm.Base``."""


class UnsettledRow(Base):
    """One settlement not yet done: the meter record and what to settle it for."""

    __tablename__ = "gpuhub_credits_unsettled"

    server_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    username: Mapped[str] = mapped_column(String(255), index=True)
    #: :meth:`MeterRecord.to_state` (its debits' transaction ids included)
    record: Mapped[dict] = mapped_column(JSON)
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    charge_to_stop: Mapped[bool] = mapped_column(Boolean, default=True)
    #: how a void's refund reason ends: "Spawn of <server> <why>"
    why: Mapped[str] = mapped_column(String(255), default="")
    written_at: Mapped[datetime] = mapped_column(DateTime)


def ensure_table(session: Session) -> None:
    """Create ``gpuhub_credits_unsettled`` if the database lacks it (once per process and
    URL)."""
    ensure_tables(session, Base.metadata)


@dataclass
class Owed:
    """A settlement the hook owes, as a row holds it.  ``stopped_at`` is aware UTC (None
    for a void); ``charge_to_stop``: debit the intervals begun before ``stopped_at`` first."""

    kind: str
    record: MeterRecord
    stopped_at: datetime | None = None
    charge_to_stop: bool = True
    why: str = ""


class UnsettledStore:
    """The rows, written through the hub's own session (the one JupyterHub's ``Spawner``
    rows live in), synchronously, as the hub writes its own rows.

    :meth:`keep` and :meth:`drop` never raise: a settlement goes on when the database
    cannot be written (logged as an error: then it is retried from memory only).
    """

    def __init__(self, log: logging.Logger):
        self.log = log
        self.db: Session | None = None

    def attach(self, db: Session | None) -> None:
        """Use the hub's session ``db`` (``JupyterHub.db``) from now on."""
        if db is not None:
            self.db = db

    def _session(self, spawner=None) -> Session | None:
        if self.db is None and spawner is not None:
            orm_spawner = getattr(spawner, "orm_spawner", None)
            self.attach(object_session(orm_spawner) if orm_spawner is not None else None)
        return self.db

    def keep(self, owed: Owed, spawner=None) -> None:
        """Write (or overwrite) the row of ``owed``'s server run and commit."""
        session = self._session(spawner)
        if session is None:
            return
        record = owed.record
        try:
            ensure_table(session)
            session.merge(
                UnsettledRow(
                    server_id=record.server_id,
                    kind=owed.kind,
                    username=record.username,
                    record=record.to_state(),
                    stopped_at=None if owed.stopped_at is None else naive_utc(owed.stopped_at),
                    charge_to_stop=owed.charge_to_stop,
                    why=owed.why,
                    written_at=naive_utc(datetime.now(UTC)),
                )
            )
            session.commit()
        except Exception:
            session.rollback()
            self.log.exception(
                "Could not record the unsettled credits of %s (%s); retried from memory only",
                record.label,
                owed.kind,
            )

    def drop(self, server_id: str) -> None:
        """Delete the row of ``server_id`` (settled) and commit; idempotent."""
        session = self._session()
        if session is None:
            return
        try:
            ensure_table(session)
            session.execute(delete(UnsettledRow).where(UnsettledRow.server_id == server_id))
            session.commit()
        except Exception:
            session.rollback()
            self.log.exception(
                "Could not delete the settled credits row %s; its retry "
                "after a restart replays the same keys",
                server_id,
            )

    def load(self) -> list[Owed]:
        """Every row, oldest first; a row that cannot be read is logged and skipped."""
        session = self._session()
        if session is None:
            return []
        ensure_table(session)
        owed = []
        for row in session.scalars(select(UnsettledRow).order_by(UnsettledRow.written_at)):
            try:
                if row.kind not in KINDS:
                    raise ValueError(f"unknown kind {row.kind!r}")
                record = MeterRecord.from_state(row.record)
            except ValueError as e:
                self.log.error("Cannot read the unsettled credits row %s: %s", row.server_id, e)
                continue
            stopped_at = row.stopped_at.replace(tzinfo=UTC) if row.stopped_at else None
            owed.append(Owed(row.kind, record, stopped_at, row.charge_to_stop, row.why))
        return owed


def settle_at_start(app, hook_class) -> None:
    """Make the JupyterHub application ``app`` hand the unsettled rows to the credits meter
    (``hook_class.instance().resume_unsettled``) when it starts.

    JupyterHub (6.1) has no start-up hook for extensions, and creates spawners (and so the
    hook) only for servers that run; a hub whose servers all stopped would never look at
    the rows.  ``app.start`` (called once ``initialize``, the database included, is done:
    ``JupyterHub.launch_instance_async``) is wrapped to do it first, the way
    :func:`hub_ext.common.periodic.stop_passes_first` wraps ``cleanup``.  Wrapping twice is a
    no-op.
    """
    start = app.start
    if getattr(start, "settles_credits_first", False):
        return

    async def start_after_settling():
        try:
            hook_class.instance(config=app.config).resume_unsettled(app.db)
        except Exception:
            app.log.exception(
                "Could not read the unsettled credits; they stay in the "
                "hub database for the next start"
            )
        await start()

    start_after_settling.settles_credits_first = True
    app.start = start_after_settling
