"""One server the culler watches: what it keeps of it, in memory and in spawner state.

:class:`_Watched` is the culler's bookkeeping of one running server (its profile, start time,
limits, run record, and why it is being stopped); :meth:`_Watched.to_state` is the shape kept
in the spawner's ``hook_state["culling"]`` (version :data:`STATE_VERSION`), read back by
:meth:`hub_ext.culling.culler.Culler.restore` after a hub restart.  The functions below read
what the culler needs off a spawner of either backend: the GPUs it holds, its idle time
(JupyterHub's ``last_activity``, seconds), and what the credits hook decided at its start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jupyterhub.utils import utcnow as hub_utcnow

from ..common.server_key import ServerKey
from ..credits.metering import MeterRecord
from .rules import Limits, Verdict

__all__ = ["STATE_VERSION", "held_devices"]

STATE_VERSION = 1


@dataclass
class _Watched:
    """One running server the culler watches."""

    spawner: Any
    key: ServerKey
    profile: str
    started_at: datetime
    limits: Limits
    watching_since: datetime
    last_seen: datetime
    run_id: int | None = None
    mem_limit: int | None = None  # bytes (the profile's mem_limit), for the OOM notice
    cull: str | None = None  # why this hub (or the idle culler) is stopping it
    cull_seconds: float = 0.0  # the idle time or age the cull message names
    stopping: bool = False
    stopped_at: datetime | None = None
    last_verdict: Verdict | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return str(self.key)

    @property
    def server(self) -> str:
        return f"server '{self.key.server}'" if self.key.server else "server"

    def to_state(self) -> dict:
        return {
            "version": STATE_VERSION,
            "started_at": self.started_at.isoformat(),
            "profile": self.profile,
            "run": self.run_id,
            "limits": self.limits.to_dict(),
            "mem_limit": self.mem_limit,
        }


def held_devices(spawner) -> list[str]:
    """The GPUs a starting server holds, for its run record: the Docker pool's device
    UUIDs (``allocation``), or what a backend names ``gpu_devices`` (Slurm:
    ``<node>/gpu<index>``)."""
    allocation = getattr(spawner, "allocation", None)
    if allocation is not None:
        return list(allocation.uuids)
    return list(getattr(spawner, "gpu_devices", None) or [])


def _idle_seconds(spawner) -> float:
    """Seconds since the server's last_activity, in JupyterHub's clock (0 when unknown)."""
    last = getattr(getattr(spawner, "orm_spawner", None), "last_activity", None)
    if last is None:
        return 0.0
    return max(0.0, (hub_utcnow(with_tz=False) - last).total_seconds())


def _credits_run(spawner) -> str | None:
    """The credits meter's id of this run (from the credits hook's state), if it is priced."""
    state = getattr(spawner, "hook_state", {}).get("credits")
    if not isinstance(state, dict):
        return None
    try:
        return MeterRecord.from_state(state).server_id
    except ValueError:
        return None


def _paying_course(spawner) -> str | None:
    """The course whose account pays for this run (the credits hook's decision at its
    start, :mod:`hub_ext.reservations.budget`), or None: the member pays."""
    state = getattr(spawner, "hook_state", {}).get("credits")
    if not isinstance(state, dict) or not state.get("course_account"):
        return None
    return state.get("course")
