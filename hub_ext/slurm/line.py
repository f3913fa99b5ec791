"""A pending Slurm job is a member's place in the line for a GPU.

Position: the job's place among the pending jobs of its partition, in Slurm's own priority
order (:meth:`hub_ext.slurm.cluster.SlurmCluster.queue`).  Estimate: Slurm's expected
start time (``squeue --start``), in whole minutes from now, or unknown when Slurm has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from .cluster import SlurmCluster


@dataclass(frozen=True)
class Place:
    """Where a pending job stands: ``position`` (1 = next), ``ahead`` (jobs before it),
    ``minutes`` (Slurm's estimate of the wait, rounded up; None: unknown)."""

    job_id: str
    position: int
    minutes: int | None

    @property
    def ahead(self) -> int:
        return self.position - 1

    def sentence(self) -> str:
        """For the member: "You are number 1 in line for a GPU; about 3 min." """
        wait = f"about {self.minutes} min" if self.minutes is not None else "unknown"
        return f"You are number {self.position} in line for a GPU; expected wait: {wait}."


def minutes_until(start: str, now: datetime) -> int | None:
    """Slurm's ``%S`` time (``2026-11-23T12:30:00``, the cluster's local time, naive) ->
    whole minutes from ``now`` (same clock), at least 0; None when unreadable."""
    try:
        when = datetime.fromisoformat(start)
    except ValueError:
        return None
    return max(0, math.ceil((when - now).total_seconds() / 60))


async def place_in_line(cluster: SlurmCluster, job_id: str,
                        now: datetime | None = None) -> Place | None:
    """The place of pending job ``job_id`` in its partition's line; None when the job is
    not pending (running, gone).  Raises SlurmUnavailable when Slurm does not answer."""
    jobs = await cluster.queue()
    mine = next((j for j in jobs if j.job_id == job_id), None)
    if mine is None or mine.state != "PENDING":
        return None
    line = [j for j in jobs if j.state == "PENDING" and j.partition == mine.partition]
    position = [j.job_id for j in line].index(job_id) + 1
    start = (await cluster.start_times()).get(job_id)
    minutes = minutes_until(start, now or datetime.now()) if start else None
    return Place(job_id, position, minutes)
