"""The hub's record of server runs: who ran which profile on which GPUs, when, and why it ended.

One row per run of a server, in the hub's own database (``c.JupyterHub.db_url``, so a
PostgreSQL hub keeps it in PostgreSQL and a backup of the hub keeps it too), table
``gpuhub_server_runs``.  A run is identified by (user, server name, start time): the
unique constraint makes a retried write a no-op instead of a second run.  The table is
created on first use; JupyterHub's own tables and migrations are not touched.

Rows are written by :class:`hub_ext.culling.culler.Culler`, which watches every server's life
(start, stop, cull); ``gpuhub usage`` (:mod:`hub_ext.ops.usage`) reads them.  Times are naive
UTC, JupyterHub's convention for its own timestamps.  ``credits_run`` is the credits
meter's id of the run (``server_id`` in the metadata of its ledger debits,
:mod:`hub_ext.credits.metering`), which joins a run to what it was charged.
``line_wait_s`` is set when the start came from the line (:mod:`hub_ext.line`): the
seconds the member waited for their turn.  ``job_id`` is the scheduler's id of the run's job
(Slurm backend: the Slurm job id, which joins the run to Slurm's accounting, ``sacct``;
None on the Docker backend).  ``course`` is the slug of the course whose account paid for the
run's first interval during its reservation's window (the course budget,
:mod:`hub_ext.reservations.budget`); None when the member paid.

Stop reasons: ``stopped`` (by the member, an admin or the API), ``idle`` (no activity,
jupyterhub-idle-culler), ``idle_gpu`` (GPUs idle), ``max_age``, ``credits`` (credits ran
out and the grace period was over), ``gone`` (its container vanished and the hub cleared it),
``node_down`` (Slurm backend: the node under it went down or failed), ``out_of_memory``
(the kernel killed it past its memory limit: the Slurm job's cgroup, Slurm's state
OUT_OF_MEMORY; the Docker container's, ``State.OOMKilled``), ``reservation`` (it held a GPU
that a reservation's window needed, :mod:`hub_ext.reservations.enforce`), ``job_ended`` (a
GPU notebook job's container ended by itself: its notebook ran to its end, or it died),
``kernel_ended`` (a GPU kernel's container ended by itself: it died, or was killed),
``parent_gone`` (a GPU kernel stopped because the member's server it ran for stopped),
``idle_contended`` (a GPU kernel idle past ``c.Kernels.contended_idle_timeout`` while others
waited in line for its GPU).
A run whose server name starts with :data:`JOB_PREFIX` is a notebook job's (:mod:`hub_ext.jobs`),
one starting with :data:`KERNEL_PREFIX` a GPU kernel's (:mod:`hub_ext.kernels`): :func:`kind`
tells them apart, and ``gpuhub usage`` counts them apart from servers.  ``stop_detail``
says more where the backend knows it, e.g. "node node2 down: power failure" (Slurm's
reason), or the reservation it made way for.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    Integer,
    String,
    UniqueConstraint,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from .db import ensure_tables

__all__ = [
    "JOB_PREFIX",
    "KERNEL_PREFIX",
    "ServerRun",
    "close_run",
    "discard_run",
    "ensure_table",
    "kind",
    "naive_utc",
    "open_run",
    "runs_overlapping",
    "set_reason",
]

STOP_REASONS = (
    "stopped",
    "idle",
    "idle_gpu",
    "max_age",
    "credits",
    "gone",
    "node_down",
    "out_of_memory",
    "reservation",
    "job_ended",
    "kernel_ended",
    "parent_gone",
    "idle_contended",
)
#: the server names of GPU notebook jobs (hub_ext.jobs): their runs are jobs, not servers
JOB_PREFIX = "job-"
#: the server names of GPU kernels (hub_ext.kernels): their runs are kernels, not servers
KERNEL_PREFIX = "kernel-"
#: characters of ``stop_detail`` kept
DETAIL_CHARS = 255


class Base(DeclarativeBase):
    """Our own metadata, apart from JupyterHub's ``orm.Base``."""


class ServerRun(Base):
    """One run of one server.  ``stopped_at`` and ``stop_reason`` are None while it runs."""

    __tablename__ = "gpuhub_server_runs"
    __table_args__ = (
        UniqueConstraint("username", "server_name", "started_at", name="uq_gpuhub_server_run"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(255), index=True)
    server_name: Mapped[str] = mapped_column(String(255), default="")
    profile: Mapped[str] = mapped_column(String(255), default="")
    groups: Mapped[list] = mapped_column(JSON, default=list)
    devices: Mapped[list] = mapped_column(JSON, default=list)
    started_at: Mapped[datetime] = mapped_column(DateTime, index=True)
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    stop_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    #: why, in words, where the backend knows more (a node's reason in Slurm)
    stop_detail: Mapped[str | None] = mapped_column(String(DETAIL_CHARS), nullable=True)
    credits_run: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: seconds the server waited in line before it started; None: it started at once
    line_wait_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: the scheduler's job id (Slurm); None where the backend has no jobs (Docker)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    #: the course whose account paid (its reservation's window); None: the member paid
    course: Mapped[str | None] = mapped_column(String(64), nullable=True)

    @property
    def gpus(self) -> int:
        return len(self.devices or [])


def is_job(run) -> bool:
    """Whether ``run`` (a :class:`ServerRun`) was a GPU notebook job's."""
    return kind(run) == "job"


def kind(run) -> str:
    """What ``run`` (a :class:`ServerRun`, or a server name) was: ``"job"`` (a GPU notebook
    job, :data:`JOB_PREFIX`), ``"kernel"`` (a GPU kernel, :data:`KERNEL_PREFIX`) or
    ``"server"`` (a member's own server)."""
    name = (run if isinstance(run, str) else run.server_name) or ""
    if name.startswith(JOB_PREFIX):
        return "job"
    if name.startswith(KERNEL_PREFIX):
        return "kernel"
    return "server"


def naive_utc(when: datetime) -> datetime:
    """An aware datetime as naive UTC (a naive one is taken to be UTC already)."""
    if when.tzinfo is None:
        return when
    return when.astimezone(UTC).replace(tzinfo=None)


def _add_columns(engine) -> None:
    """A table made before the line (``line_wait_s``), the stop details (``stop_detail``),
    the job ids (``job_id``) or the course budget (``course``) existed lacks them: add
    them."""
    columns = {c["name"] for c in inspect(engine).get_columns(ServerRun.__tablename__)}
    for name, sql_type in (
        ("line_wait_s", "FLOAT"),
        ("stop_detail", f"VARCHAR({DETAIL_CHARS})"),
        ("job_id", "VARCHAR(64)"),
        ("course", "VARCHAR(64)"),
    ):
        if name not in columns:
            with engine.begin() as conn:
                conn.execute(
                    text(f"ALTER TABLE {ServerRun.__tablename__} ADD COLUMN {name} {sql_type}")
                )


def ensure_table(session: Session) -> None:
    """Create ``gpuhub_server_runs`` if the database lacks it (once per process and URL)."""
    ensure_tables(session, Base.metadata, _add_columns)


def open_run(
    session: Session,
    *,
    username: str,
    server_name: str,
    profile: str,
    groups: list[str],
    devices: list[str],
    started_at: datetime,
    credits_run: str | None = None,
    line_wait: float | None = None,
    job_id: str | None = None,
    course: str | None = None,
) -> int:
    """Record that a run began; returns its id.  Commits.  ``line_wait``: seconds it
    waited in line first (None: it started at once); ``job_id``: the scheduler's job id;
    ``course``: the course that pays (None: the member).

    Idempotent: a second call for the same (user, server, start) returns the first row's id.
    """
    ensure_table(session)
    started = naive_utc(started_at)
    run = ServerRun(
        username=username,
        server_name=server_name,
        profile=profile,
        groups=sorted(groups),
        devices=list(devices),
        started_at=started,
        credits_run=credits_run,
        line_wait_s=line_wait,
        job_id=job_id,
        course=course,
    )
    session.add(run)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return session.scalars(
            select(ServerRun.id).where(
                ServerRun.username == username,
                ServerRun.server_name == server_name,
                ServerRun.started_at == started,
            )
        ).one()
    return run.id


def close_run(
    session: Session, run_id: int, stopped_at: datetime, reason: str, detail: str | None = None
) -> None:
    """Record that run ``run_id`` ended at ``stopped_at`` for ``reason`` (``detail``: more,
    in words, cut to :data:`DETAIL_CHARS`).  Commits.

    Idempotent: a run already closed keeps its first end.  Raises ValueError for a reason
    not in :data:`STOP_REASONS`.
    """
    if reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {reason!r}; one of {', '.join(STOP_REASONS)}")
    ensure_table(session)
    run = session.get(ServerRun, run_id)
    if run is None or run.stopped_at is not None:
        return
    run.stopped_at = max(naive_utc(stopped_at), run.started_at)
    run.stop_reason = reason
    run.stop_detail = detail[:DETAIL_CHARS] if detail else None
    session.commit()


def set_reason(session: Session, run_id: int, reason: str) -> None:
    """Correct the stop reason of a closed run (a cull learnt after the stop).  Commits."""
    if reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {reason!r}; one of {', '.join(STOP_REASONS)}")
    ensure_table(session)
    run = session.get(ServerRun, run_id)
    if run is not None and run.stopped_at is not None:
        run.stop_reason = reason
        session.commit()


def discard_run(session: Session, run_id: int) -> None:
    """Forget a run whose start failed (it never ran).  Commits; idempotent."""
    ensure_table(session)
    run = session.get(ServerRun, run_id)
    if run is not None:
        session.delete(run)
        session.commit()


def runs_overlapping(
    session: Session, since: datetime, until: datetime | None = None
) -> list[ServerRun]:
    """Runs that were running at some time in [since, until) (until None: now), oldest first."""
    ensure_table(session)
    query = select(ServerRun).where(
        (ServerRun.stopped_at.is_(None)) | (ServerRun.stopped_at > naive_utc(since))
    )
    if until is not None:
        query = query.where(ServerRun.started_at < naive_utc(until))
    return list(session.scalars(query.order_by(ServerRun.started_at, ServerRun.id)))
