"""The Slurm backend's part of the line: a pending job is a member's place in line.

The places are the shared line's (:class:`hub_ext.line.Line`: its rows in the hub
database, its sentences, the member's and the admins' endpoints, the keeper that starts
the waiting spawns again after a hub restart); :class:`SlurmQueue` is its backend.  It
grants nothing: Slurm starts the jobs, in its own order, and the spawner ends the place
when its job runs (:meth:`hub_ext.line.Line.started`).  What it adds is the standing of
each place in Slurm's line:

- position: the job's place among the pending jobs of its partition, in Slurm's own
  priority order (:meth:`hub_ext.slurm.cluster.SlurmCluster.queue`), jobs of other users of
  the cluster included;
- estimate: Slurm's expected start time (``squeue --start``), in seconds from now, or
  unknown while Slurm has none (e.g. jobs without a time limit ahead).

The queue is read at most every ``min_interval`` seconds, however many spawns wait, and
never on the event loop (:class:`hub_ext.slurm.cluster.SlurmCluster` runs subprocesses).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from ..line import Line, LineBackend, Place
from ..line.resume import ensure_keeper
from .cluster import QueuedJob, SlurmCluster

__all__ = ["SlurmQueue", "attach_line", "seconds_until"]


#: seconds: Slurm's backfill scheduler gives a job it cannot place in its window (jobs
#: without a time limit ahead of it, for instance) a start time a year ahead: no estimate
NO_ESTIMATE_BEYOND = 300 * 24 * 3600


def seconds_until(start: str, now: datetime) -> float | None:
    """Slurm's ``%S`` time (``2026-11-23T12:30:00``, the cluster's local time, naive) ->
    seconds from ``now`` (same clock), at least 0; None when unreadable, or Slurm's
    "a year from now" (:data:`NO_ESTIMATE_BEYOND`)."""
    try:
        when = datetime.fromisoformat(start)
    except ValueError:
        return None
    seconds = max(0.0, (when - now).total_seconds())
    return None if seconds > NO_ESTIMATE_BEYOND else seconds


class SlurmQueue(LineBackend):
    """The :class:`hub_ext.line.LineBackend` of a Slurm hub: free units none (the line
    grants nothing), the places' standing from Slurm's queue."""

    #: the sentence's words for a wait Slurm has no estimate of
    no_estimate = "unknown"

    def __init__(self, cluster: SlurmCluster, line: Line | None, min_interval: float = 2.0):
        self.cluster, self.line, self.min_interval = cluster, line, min_interval
        self.jobs: dict[tuple, str] = {}  # place key -> its job id
        self.queued: dict[str, QueuedJob] = {}  # job id -> the job, at the last read
        self._standing: dict[str, tuple[int, float | None]] = {}
        self._read_at = 0.0
        self._reading: asyncio.Future | None = None

    # -- LineBackend -----------------------------------------------------------------------

    def free_units(self, units: str) -> int:
        return 0  # Slurm starts the jobs, not the line

    def grant(self, place: Place):
        return None

    def frees(self, units: str) -> list[tuple[float, int]]:
        return []

    def standing(self, place: Place) -> tuple[int, float | None] | None:
        """(position, estimate in seconds or None) of the place's job at the last read of
        Slurm's queue; None when its job is not known pending."""
        return self.job_standing(self.jobs.get(tuple(place.key), ""))

    def job_standing(self, job_id: str) -> tuple[int, float | None] | None:
        """(position in its partition's line, 1 = next; estimate in seconds or None) of
        pending job ``job_id`` at the last :meth:`read`; None when not pending."""
        return self._standing.get(job_id)

    # -- the queue -------------------------------------------------------------------------

    def track(self, key, job_id: str) -> None:
        """``key``'s place is job ``job_id``."""
        self.jobs[tuple(key)] = job_id

    def untrack(self, key) -> None:
        self.jobs.pop(tuple(key), None)

    async def read(self, fresh: bool = False) -> dict[str, QueuedJob]:
        """Read Slurm's queue (at most every ``min_interval`` seconds unless ``fresh``;
        one read at a time, shared by every caller) and tell the waiting members their
        place.  Returns job id -> job.  Raises SlurmUnavailable."""
        if self._reading is not None:
            await asyncio.shield(self._reading)
            return self.queued
        if not fresh and time.monotonic() - self._read_at < self.min_interval:
            return self.queued
        self._reading = asyncio.get_running_loop().create_future()
        try:
            jobs = await self.cluster.queue()
            starts = (
                await self.cluster.start_times() if any(j.state == "PENDING" for j in jobs) else {}
            )
            self._update(jobs, starts, datetime.now())
            self._read_at = time.monotonic()
        finally:
            self._reading.set_result(None)
            self._reading = None
        if self.line is not None:
            self.line.announce_soon()
        return self.queued

    def _update(self, jobs: list[QueuedJob], starts: dict[str, str], now: datetime) -> None:
        self.queued = {j.job_id: j for j in jobs}
        standing: dict[str, tuple[int, float | None]] = {}
        per_partition: dict[str, int] = {}
        for job in jobs:  # pending first, in Slurm's order
            if job.state != "PENDING":
                continue
            position = per_partition[job.partition] = per_partition.get(job.partition, 0) + 1
            start = starts.get(job.job_id)
            standing[job.job_id] = (position, seconds_until(start, now) if start else None)
        self._standing = standing


def attach_line(spawner) -> Line:
    """The hub's line with Slurm's queue as its backend (once per process), attached to
    the hub database; its keeper started (it starts the waiting spawns again after a
    restart)."""
    line = Line.instance(config=spawner.config)
    if not isinstance(line.backend, SlurmQueue):
        line.backend = SlurmQueue(spawner.cluster, line, spawner.line_poll_interval)
    line.attach(spawner.db_session())
    if spawner.hub is not None and spawner.hub.api_url:
        ensure_keeper(line, spawner.hub.api_url)
    return line
