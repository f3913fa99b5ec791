"""The culler's rules as pure functions: when a server is GPU-idle or too old, and what
its member reads about it.  No hub, no clock of its own: :class:`hub_ext.culling.culler.Culler`
calls :func:`assess` for each server at each pass with the time and the devices'
utilization (NVML's ``nvmlDeviceGetUtilizationRates``, percent) it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = [
    "GPUActivity",
    "Limits",
    "Verdict",
    "assess",
    "cull_message",
    "duration",
    "out_of_memory_message",
    "size",
    "warning_message",
]


def duration(seconds: float) -> str:
    """Seconds for people: ``"40 s"``, ``"45 min"``, ``"2 h 5 min"``."""
    total = max(0, int(round(seconds)))
    if total < 90:
        return f"{total} s"
    minutes = int(round(total / 60))
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" if minutes == 0 else f"{hours} h {minutes} min"


def size(nbytes: float) -> str:
    """Bytes for people, in binary units as JupyterHub's ``mem_limit`` counts them:
    ``"400 MB"`` (400 MiB), ``"1.5 GB"``, ``"16 GB"``."""
    mib = nbytes / 2**20
    if mib < 1024:
        return f"{mib:.0f} MB"
    return f"{mib / 1024:.1f}".removesuffix(".0") + " GB"


@dataclass(frozen=True)
class Limits:
    """A server's culling limits in seconds, fixed when it starts; 0 means no limit.

    ``idle_timeout`` is enforced by jupyterhub-idle-culler and kept here for the admin
    page; ``gpu_idle_timeout`` and ``max_age`` by :class:`Culler`.
    """

    gpu_idle_timeout: float = 0.0
    max_age: float = 0.0
    idle_timeout: float = 0.0

    @classmethod
    def of(cls, spawner) -> Limits:
        """The limits of ``spawner``'s profile (its traits after the profile is applied)."""
        return cls(
            float(getattr(spawner, "gpu_idle_timeout", 0) or 0),
            float(getattr(spawner, "cull_max_age", 0) or 0),
            float(getattr(spawner, "cull_idle_timeout", 0) or 0),
        )

    def to_dict(self) -> dict:
        return {
            "gpu_idle_timeout": self.gpu_idle_timeout,
            "max_age": self.max_age,
            "idle_timeout": self.idle_timeout,
        }


@dataclass(frozen=True)
class Verdict:
    """What one pass decides for one server.

    ``busy``: a device is busy now (the server is active).  ``cull``: ``"max_age"``,
    ``"idle_gpu"`` or None.  ``gpu_idle_for`` and ``age`` are seconds; ``stop_in`` is the
    seconds left before the maximum age when within the warning window, else None.
    """

    busy: bool
    cull: str | None
    gpu_idle_for: float
    age: float
    stop_in: float | None


def assess(
    *,
    now: datetime,
    started_at: datetime,
    watching_since: datetime,
    limits: Limits,
    devices: Sequence[str],
    utilization: Mapping[str, int | None],
    last_busy: Mapping[str, datetime],
    busy_utilization: int,
    warning: float,
) -> Verdict:
    """Decide about one server from its devices' utilization now and when each was last busy.

    - busy when any device is at or above ``busy_utilization`` percent;
    - GPU-idle since the latest of: its start, ``watching_since`` (when this hub process
      began to watch it: earlier readings are lost in a restart, and a server is never
      culled on a guess), and the last time any of its devices was busy; a device whose
      utilization is unknown (None, or missing from ``utilization``) keeps it from being
      idle at all;
    - ``max_age`` wins over ``idle_gpu`` when both are due.
    """
    age = (now - started_at).total_seconds()
    readings = [utilization.get(uuid) for uuid in devices]
    busy = any(r is not None and r >= busy_utilization for r in readings)
    idle_for = 0.0
    if devices and not busy and all(r is not None for r in readings):
        since = max(
            [started_at, watching_since, *(last_busy[u] for u in devices if u in last_busy)]
        )
        idle_for = max(0.0, (now - since).total_seconds())
    cull = None
    stop_in = None
    if limits.max_age:
        left = limits.max_age - age
        if left <= 0:
            cull = "max_age"
        elif left <= warning:
            stop_in = left
    if cull is None and limits.gpu_idle_timeout and idle_for >= limits.gpu_idle_timeout:
        cull = "idle_gpu"
    return Verdict(busy=busy, cull=cull, gpu_idle_for=idle_for, age=max(age, 0.0), stop_in=stop_in)


class GPUActivity:
    """When each device was last seen busy, in the culler's clock (this process only)."""

    def __init__(self) -> None:
        self.last_busy: dict[str, datetime] = {}

    def observe(self, units: Iterable[Any], now: datetime, busy_utilization: int) -> None:
        """Note every unit (``uuid``, ``utilization_pct``: see ``Culler.gpu_units``) at or
        above ``busy_utilization`` percent as busy at ``now``."""
        for unit in units:
            if unit.utilization_pct is not None and unit.utilization_pct >= busy_utilization:
                self.last_busy[unit.uuid] = now


def cull_message(reason: str, server: str, seconds: float, profile: str) -> str:
    """What the member reads on the home page after a cull of their ``server``."""
    if reason == "idle_gpu":
        return f"Your {server} was stopped after {duration(seconds)} with an idle GPU."
    if reason == "max_age":
        allowed = f"the {profile} profile" if profile else "this hub"
        return (
            f"Your {server} was stopped after running for {duration(seconds)}, the "
            f"longest {allowed} allows."
        )
    return f"Your {server} was stopped after {duration(seconds)} without activity."


def out_of_memory_message(server: str, mem_limit: float | None) -> str:
    """What the member reads on the home page after the kernel stopped their ``server``
    past its memory limit (``mem_limit``: bytes; None or 0 when unknown)."""
    limit = f"its {size(mem_limit)} of memory" if mem_limit else "its memory limit"
    return (
        f"Your {server} was stopped: it used more than {limit}. Save your work more "
        "often, use less memory, or choose a profile with more."
    )


def warning_message(server: str, stop_in: float, max_age: float, profile: str) -> str:
    """The home-page warning before a server reaches its maximum age."""
    allowed = f"the {profile} profile" if profile else "this hub"
    return (
        f"Your {server} will be stopped in about {duration(stop_in)}: {allowed} allows "
        f"{duration(max_age)} per server. Save your work."
    )
