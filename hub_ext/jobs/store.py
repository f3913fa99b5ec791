"""GPU notebook jobs in the hub database: table ``gpuhub_jobs``, one row per job.

Kept in the hub's own database (``c.JupyterHub.db_url``), beside the reservations
(:mod:`hub_ext.reservations.store`), the line and the run records, so that the hub, not a
member's server, is the record of a job: the list is the same after the member's server
restarts, on another profile or node.  The table is created on first use.

Times are whole milliseconds since the epoch (Jupyter Scheduler's models); statuses are
Jupyter Scheduler's (:data:`STATUSES`).  A job ends exactly once: :func:`finish` moves a row
from an active status to an end status in one conditional ``UPDATE``.
"""

from __future__ import annotations

import uuid

from sqlalchemy import (
    JSON,
    BigInteger,
    Integer,
    String,
    Text,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..common.clock import now
from ..common.db import ensure_tables

__all__ = [
    "ACTIVE",
    "ENDED",
    "STATUSES",
    "JobRow",
    "count_active",
    "ensure_table",
    "finish",
    "get",
    "insert",
    "load",
    "ms",
    "server_name_of",
    "set_status",
]

#: Jupyter Scheduler's ``Status`` values
STATUSES = ("CREATED", "QUEUED", "IN_PROGRESS", "COMPLETED", "FAILED", "STOPPING", "STOPPED")
#: a job in one of these counts against ``GPUHUB_JOBS_PER_USER`` and may still end
ACTIVE = ("CREATED", "QUEUED", "IN_PROGRESS", "STOPPING")
ENDED = ("COMPLETED", "FAILED", "STOPPED")
#: the longest status message kept (characters)
MESSAGE_CHARS = 1000


class Base(DeclarativeBase):
    """Our own metadata, apart from JupyterHub's ``orm.Base``."""


class JobRow(Base):
    """One notebook job of one member."""

    __tablename__ = "gpuhub_jobs"

    #: uuid4 with hyphens (Jupyter Scheduler's JOB_ID_REGEX)
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    profile: Mapped[str] = mapped_column(String(255))
    #: the JupyterHub named server that runs it: ``job-<first 12 hex of id>``
    server_name: Mapped[str] = mapped_column(String(255), unique=True)
    #: workspace-relative paths
    input_path: Mapped[str] = mapped_column(String(1024))
    input_filename: Mapped[str] = mapped_column(String(255))
    #: the folder of the original notebook: the job's working folder (its relative paths)
    cwd: Mapped[str] = mapped_column(String(1024), default="")
    output_dir: Mapped[str] = mapped_column(String(1024))
    #: {format: workspace-relative file}, "log" included
    outputs: Mapped[dict] = mapped_column(JSON, default=dict)
    output_formats: Mapped[list] = mapped_column(JSON, default=list)
    #: {str: str}, papermill's parameters
    parameters: Mapped[dict] = mapped_column(JSON, default=dict)
    idempotency_token: Mapped[str | None] = mapped_column(String(255), nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default="CREATED")
    status_message: Mapped[str] = mapped_column(Text, default="")
    #: ms since the epoch
    create_time: Mapped[int] = mapped_column(BigInteger)
    update_time: Mapped[int] = mapped_column(BigInteger)
    start_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    end_time: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: the job's longest run, seconds (0: no limit), from its profile at creation
    max_seconds: Mapped[int] = mapped_column(Integer, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: the runner's report, {"exit_code", "error"}, as it came
    reported: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    #: the id (``orm.APIToken.id``) of the API token JupyterHub made for the job's server
    #: at its start: the only token that may report the job's end
    server_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


def _add_columns(engine) -> None:
    """A table made before the server's token was kept (``server_token_id``) lacks it."""
    columns = {c["name"] for c in inspect(engine).get_columns(JobRow.__tablename__)}
    if "server_token_id" not in columns:
        with engine.begin() as conn:
            conn.execute(
                text(f"ALTER TABLE {JobRow.__tablename__} ADD COLUMN server_token_id INTEGER")
            )


def ensure_table(session: Session) -> None:
    """Create ``gpuhub_jobs`` if the database lacks it, and add what an older one lacks
    (once per process and URL)."""
    ensure_tables(session, Base.metadata, _add_columns)


def ms(seconds: float | None = None) -> int:
    """Seconds since the epoch (default: now, the hub's clock) as whole milliseconds."""
    return int((now() if seconds is None else seconds) * 1000)


def server_name_of(job_id: str) -> str:
    """The named server of a job: ``job-`` and the first 12 hex digits of its id."""
    return "job-" + job_id.replace("-", "")[:12]


def new_id() -> str:
    return str(uuid.uuid4())


def insert(session: Session, **values) -> JobRow:
    """Store a new job (``values``: the columns; ``id`` made when missing); commits."""
    ensure_table(session)
    values.setdefault("id", new_id())
    values.setdefault("server_name", server_name_of(values["id"]))
    stamp = ms()
    values.setdefault("create_time", stamp)
    values.setdefault("update_time", stamp)
    row = JobRow(**values)
    session.add(row)
    session.commit()
    return row


def get(session: Session, job_id: str) -> JobRow | None:
    ensure_table(session)
    return session.get(JobRow, job_id)


def by_server(session: Session, user: str, server_name: str) -> JobRow | None:
    """The job that ``user``'s server ``server_name`` runs, or None."""
    ensure_table(session)
    return session.scalars(
        select(JobRow).where(JobRow.user == user, JobRow.server_name == server_name)
    ).first()


def by_token(session: Session, user: str, token: str) -> JobRow | None:
    """``user``'s job created with this idempotency token, or None."""
    ensure_table(session)
    return session.scalars(
        select(JobRow).where(JobRow.user == user, JobRow.idempotency_token == token)
    ).first()


def load(
    session: Session,
    user: str | None = None,
    statuses: tuple[str, ...] | None = None,
    name: str | None = None,
) -> list[JobRow]:
    """Jobs (of ``user``, in ``statuses``, whose name starts with ``name``), newest first."""
    ensure_table(session)
    query = select(JobRow)
    if user is not None:
        query = query.where(JobRow.user == user)
    if statuses:
        query = query.where(JobRow.status.in_(statuses))
    if name:
        query = query.where(JobRow.name.startswith(name, autoescape=True))
    return list(session.scalars(query.order_by(JobRow.create_time.desc(), JobRow.id)))


def count_active(session: Session, user: str) -> int:
    """``user``'s jobs that are queued or running (:data:`ACTIVE`)."""
    ensure_table(session)
    return session.scalar(
        select(func.count())
        .select_from(JobRow)
        .where(JobRow.user == user, JobRow.status.in_(ACTIVE))
    )


def count_servers(session: Session, user: str, server_names: set[str]) -> int:
    """How many of ``server_names`` (a member's named servers) are ``user``'s jobs'."""
    if not server_names:
        return 0
    ensure_table(session)
    return session.scalar(
        select(func.count())
        .select_from(JobRow)
        .where(JobRow.user == user, JobRow.server_name.in_(server_names))
    )


def set_status(
    session: Session,
    row: JobRow,
    status: str,
    message: str | None = None,
    only: tuple[str, ...] = ACTIVE,
    **values,
):
    """Move a job whose status is one of ``only`` (default: any active one) to
    ``status``; commits.  Returns whether the row changed (a job that ended, or moved on
    meanwhile, is left as it is)."""
    changes = {"status": status, "update_time": ms(), **values}
    if message is not None:
        changes["status_message"] = message[:MESSAGE_CHARS]
    done = session.execute(
        update(JobRow).where(JobRow.id == row.id, JobRow.status.in_(only)).values(**changes)
    )
    session.commit()
    session.refresh(row)
    return done.rowcount == 1


def finish(
    session: Session, row: JobRow, status: str, message: str, exit_code: int | None = None
) -> bool:
    """End the job once: ``status`` one of :data:`ENDED`, with ``end_time`` now.  Returns
    False when it had ended already (nothing changed); commits."""
    assert status in ENDED, status
    return set_status(session, row, status, message, end_time=ms(), exit_code=exit_code)


def set_server_token(session: Session, row: JobRow, token_id: int) -> None:
    """Keep ``token_id`` (``orm.APIToken.id``) as the token of the job's server; commits."""
    session.execute(update(JobRow).where(JobRow.id == row.id).values(server_token_id=token_id))
    session.commit()
    session.refresh(row)


def delete(session: Session, row: JobRow) -> None:
    """Forget the job; commits (its files in the workspace are kept)."""
    session.delete(row)
    session.commit()
