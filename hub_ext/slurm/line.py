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

The spawner's reserve step (docs/explanation/spawn.md) reports its pending job as a place
(:func:`report_place`): joined once Slurm has kept the job waiting, its sentence on the
progress page, ended when the member leaves, an admin removes it or it expires
(``c.Line.max_wait``), as on the single node.  After a hub restart the line's keeper starts
the spawn again and it takes the pending job back by its id (:func:`left_jobs`), handing it
the new API token through a file of the member's (:func:`write_token`: the job's
environment was fixed at submission).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from tornado import web

from ..common import metrics
from ..common.clock import now
from ..line import Line, LineBackend, LineRefused, Place, show_changes
from ..line.resume import ensure_keeper
from .cluster import (
    SUBMIT_HOST_MESSAGE,
    QueuedJob,
    SlurmCluster,
    SlurmUnavailable,
    member_prefix,
)
from .submit import CommandFailed, SubmitHost, SubmitHostUnavailable

__all__ = [
    "SlurmQueue",
    "attach_line",
    "left_jobs",
    "report_place",
    "seconds_until",
    "write_token",
]


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


def attach_line(config, cluster: SlurmCluster, min_interval: float, db, api_url: str = "") -> Line:
    """The hub's line with Slurm's queue as its backend (once per process; ``config``: the
    hub's, ``min_interval``: ``c.GPUSlurmSpawner.line_poll_interval``), attached to the hub
    database ``db``; its keeper started (``api_url``: the hub's API), which starts the
    waiting spawns again after a restart."""
    line = Line.instance(config=config)
    if not isinstance(line.backend, SlurmQueue):
        line.backend = SlurmQueue(cluster, line, min_interval)
    line.attach(db)
    if api_url:
        ensure_keeper(line, api_url)
    return line


async def report_place(
    line: Line,
    key,
    job_id: str,
    *,
    profile: str,
    profile_name: str,
    count: int,
    user_options: dict,
    not_before: float,
    show,
    log,
    who: str = "",
) -> None:
    """Server ``key``'s pending job ``job_id`` is a place in the hub's line: joined once
    Slurm has looked at the job and kept it waiting (its reason is no longer "None"; the
    queue is first read at the loop's time ``not_before``, a moment after the
    submission); its sentence on the progress page (``show(progress, message)``) whenever
    it changes.  Raises HTTPError(409) when the place ended (the member left, an admin
    removed it, it expired: ``c.Line.max_wait``) or may not be taken (one place per member
    and profile)."""
    if key not in line.places and asyncio.get_running_loop().time() < not_before:
        return  # just submitted: most jobs run before the queue is worth a read
    try:
        job = (await line.backend.read()).get(job_id)
    except SlurmUnavailable as e:
        log.warning("No place in line for %s: %s", who, e)
        return
    place = line.places.get(key)
    if place is None:
        if job is None or job.state != "PENDING" or job.reason == "None":
            return
        try:
            place = await line.join(
                key,
                profile=profile,
                profile_name=profile_name or "this server",
                units="gpu",
                count=count,
                user_options=dict(user_options or {}),
            )
        except LineRefused as e:
            metrics.SPAWNS_REFUSED.labels(reason=e.reason).inc()
            raise web.HTTPError(409, e.message) from None
        log.info("%s waits in line: job %s pending (%s)", who, job_id, job.reason)
    line.backend.track(key, job_id)
    _follow(line, key, place, show)


def _follow(line: Line, key, place: Place, show) -> None:
    """This start's place (a new one, or kept from before a restart): its sentence shown
    when it changes; expired after ``c.Line.max_wait``; raises HTTPError(409) once it
    ended without a turn."""
    if place.waiter is None:
        place.waiter = asyncio.get_running_loop().create_future()
        place.on_update = show_changes(show, 20)
        place.on_update(line.describe(key))
    if not place.waiter.done() and now() > place.queued_at + line.max_wait:
        line.remove(
            key,
            "expired",
            f"Your place in line for {place.profile_name} "
            f"expired: no GPU freed within {line.max_wait / 60:g} min. "
            "Try again later or pick another profile.",
        )
    if place.waiter.done():
        left = place.waiter.exception()
        metrics.SPAWNS_REFUSED.labels(reason=f"line_{getattr(left, 'reason', 'left')}").inc()
        raise web.HTTPError(409, getattr(left, "message", "Your place in line ended."))


def left_jobs(
    jobs: dict[str, QueuedJob], user: str, job_name: str, known: str = ""
) -> tuple[QueuedJob | None, list[QueuedJob]]:
    """A server's jobs left by a hub that stopped during its start (found by ``job_name``
    and owner ``user`` among Slurm's ``jobs``): the pending one to take back (the id
    spawner state kept, ``known``, first), and the others to cancel (one that ran while the
    hub was down holds a token JupyterHub no longer honours)."""
    mine = [
        j
        for j in jobs.values()
        if (j.user, j.name) == (user, job_name)
        and j.state not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT")
    ]
    pending = sorted((j for j in mine if j.state == "PENDING"), key=lambda j: j.job_id != known)
    kept = pending[0] if pending else None
    return kept, [j for j in mine if j is not kept]


async def write_token(
    submit: SubmitHost,
    exec_prefix: str,
    username: str,
    path: str,
    token: str,
    timeout: float,
    log,
    who: str = "",
) -> None:
    """Leave a start's API token at ``path`` where the job reads it when it runs (mode
    0600, deleted by the job), so that a job kept from before a hub restart runs with the
    token JupyterHub holds now.  Written as the member (``exec_prefix``), on the submit host
    when there is one: the hub never writes as root in a folder the member owns.  Raises
    HTTPError(503) when the submit host does not answer, HTTPError(500) when the write
    fails."""
    argv = [
        *member_prefix(exec_prefix, username),
        "sh",
        "-c",
        'umask 077 && cat > "$1"',
        "sh",
        path,
    ]
    try:
        await submit.run(argv, input=(token or "").encode(), timeout=timeout)
    except SubmitHostUnavailable as e:
        log.error("Could not write the token file of %s: %s", who, e)
        raise web.HTTPError(503, SUBMIT_HOST_MESSAGE) from None
    except (CommandFailed, OSError, TimeoutError) as e:
        log.error("Could not write the token file of %s: %s", who, e)
        raise web.HTTPError(
            500, "Your server could not be prepared on the cluster. Ask an admin."
        ) from None
