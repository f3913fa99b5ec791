"""GPU kernels in the hub database: table ``gpuhub_kernels``, one row per kernel.

The hub, not the member's server, is the record of a GPU kernel (as
:mod:`hub_ext.jobs.store` is of a job): its state survives a restart of the hub or of her
server, and an ended kernel keeps its reason for a while (``c.Kernels.keep_ended``) so
that her server can tell her why it ended.  The table is created on first use.

States: ``waiting`` (created; in line for its GPU, or not started yet), ``running`` (its
server answers) and ``ended`` (with a ``reason`` and a ``message`` for the member).  A
kernel ends exactly once: :func:`finish` moves a row to ``ended`` in one conditional
``UPDATE``.  Times are seconds since the epoch (the hub's clock).
"""

from __future__ import annotations

import secrets

from sqlalchemy import JSON, Float, String, Text, func, select, update
from sqlalchemy import delete as sql_delete
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from ..common.clock import now
from ..common.db import ensure_tables
from ..common.runs import KERNEL_PREFIX

__all__ = [
    "LIVE",
    "STATES",
    "KernelRow",
    "by_server",
    "count_live",
    "count_servers",
    "delete",
    "ensure_table",
    "finish",
    "forget_ended",
    "get",
    "insert",
    "load",
    "new_id",
    "server_name_of",
    "set_running",
]

STATES = ("waiting", "running", "ended")
#: a kernel in one of these counts against ``GPUHUB_KERNELS_PER_USER`` and may still end
LIVE = ("waiting", "running")
#: the longest message kept (characters)
MESSAGE_CHARS = 1000
#: the longest path kept (characters)
PATH_CHARS = 1024


class Base(DeclarativeBase):
    """Our own metadata, apart from JupyterHub's ``orm.Base``."""


class KernelRow(Base):
    """One GPU kernel of one member."""

    __tablename__ = "gpuhub_kernels"

    #: 12 lower-case hex digits
    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), index=True)
    profile: Mapped[str] = mapped_column(String(255))
    #: the JupyterHub named server that runs it: ``kernel-<id>``
    server_name: Mapped[str] = mapped_column(String(255), unique=True)
    #: the member's server it runs for ("" the default server)
    parent: Mapped[str] = mapped_column(String(255), default="")
    #: workspace-relative paths: the notebook, the kernel's working folder, its
    #: connection folder (the connection file and the ipc sockets)
    notebook: Mapped[str] = mapped_column(String(PATH_CHARS), default="")
    cwd: Mapped[str] = mapped_column(String(PATH_CHARS), default="")
    connection_dir: Mapped[str] = mapped_column(String(PATH_CHARS))
    state: Mapped[str] = mapped_column(String(16), index=True, default="waiting")
    #: why it ended: shutdown, stopped, idle, idle_contended, parent_gone, died, failed, left, ...
    reason: Mapped[str] = mapped_column(String(32), default="")
    message: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[float] = mapped_column(Float)
    started: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: the device UUIDs it held (Docker), or ``<node>/gpu<i>``
    gpus: Mapped[list] = mapped_column(JSON, default=list)


def ensure_table(session: Session) -> None:
    """Create ``gpuhub_kernels`` if the database lacks it (once per process and URL)."""
    ensure_tables(session, Base.metadata)


def new_id() -> str:
    """A new kernel id: 12 random hex digits."""
    return secrets.token_hex(6)


def server_name_of(kernel_id: str) -> str:
    """The named server of a kernel: ``kernel-<id>``."""
    return KERNEL_PREFIX + kernel_id


def insert(session: Session, **values) -> KernelRow:
    """Store a new kernel (``values``: the columns; ``id`` made when missing); commits."""
    ensure_table(session)
    values.setdefault("id", new_id())
    values.setdefault("server_name", server_name_of(values["id"]))
    values.setdefault("created", now())
    values.setdefault("state", "waiting")
    row = KernelRow(**values)
    session.add(row)
    session.commit()
    return row


def get(session: Session, kernel_id: str) -> KernelRow | None:
    ensure_table(session)
    return session.get(KernelRow, kernel_id)


def by_server(session: Session, user: str, server_name: str) -> KernelRow | None:
    """The kernel that ``user``'s server ``server_name`` runs, or None."""
    ensure_table(session)
    return session.scalars(
        select(KernelRow).where(KernelRow.user == user, KernelRow.server_name == server_name)
    ).first()


def load(
    session: Session,
    user: str | None = None,
    states: tuple[str, ...] | None = None,
    parent: str | None = None,
) -> list[KernelRow]:
    """Kernels (of ``user``, in ``states``, run for the server ``parent``), oldest first."""
    ensure_table(session)
    query = select(KernelRow)
    if user is not None:
        query = query.where(KernelRow.user == user)
    if states:
        query = query.where(KernelRow.state.in_(states))
    if parent is not None:
        query = query.where(KernelRow.parent == parent)
    return list(session.scalars(query.order_by(KernelRow.created, KernelRow.id)))


def count_live(session: Session, user: str) -> int:
    """``user``'s kernels that wait or run (:data:`LIVE`)."""
    ensure_table(session)
    return session.scalar(
        select(func.count())
        .select_from(KernelRow)
        .where(KernelRow.user == user, KernelRow.state.in_(LIVE))
    )


def count_servers(session: Session, user: str, server_names: set[str]) -> int:
    """How many of ``server_names`` (a member's named servers) are ``user``'s kernels'."""
    if not server_names:
        return 0
    ensure_table(session)
    return session.scalar(
        select(func.count())
        .select_from(KernelRow)
        .where(KernelRow.user == user, KernelRow.server_name.in_(server_names))
    )


def _move(session: Session, row: KernelRow, only: tuple[str, ...], **changes) -> bool:
    done = session.execute(
        update(KernelRow).where(KernelRow.id == row.id, KernelRow.state.in_(only)).values(**changes)
    )
    session.commit()
    session.refresh(row)
    return done.rowcount == 1


def set_running(session: Session, row: KernelRow, gpus: list[str]) -> bool:
    """A waiting kernel's server answers: ``running`` since now, on ``gpus``.  Returns
    whether the row changed (an ended kernel stays ended); commits."""
    return _move(session, row, ("waiting",), state="running", started=now(), gpus=list(gpus))


def finish(session: Session, row: KernelRow, reason: str, message: str) -> bool:
    """End the kernel once, with ``reason`` and ``message`` (for the member).  Returns
    False when it had ended already (nothing changed); commits."""
    return _move(
        session,
        row,
        LIVE,
        state="ended",
        reason=reason[:32],
        message=message[:MESSAGE_CHARS],
        ended=now(),
    )


def delete(session: Session, row: KernelRow) -> None:
    """Forget the kernel (a refused one); commits."""
    session.delete(row)
    session.commit()


def forget_ended(session: Session, before: float) -> list[tuple[str, str]]:
    """Delete the kernels that ended before ``before`` (seconds since the epoch); returns
    their ``(user, server name)``; commits."""
    ensure_table(session)
    rows = list(
        session.scalars(
            select(KernelRow).where(KernelRow.state == "ended", KernelRow.ended < before)
        )
    )
    gone = [(r.user, r.server_name) for r in rows]
    if rows:
        session.execute(sql_delete(KernelRow).where(KernelRow.id.in_([r.id for r in rows])))
        session.commit()
    return gone
