"""Slurm's own accounting of the hub's jobs, beside the hub's run records (``gpuhub usage``).

A site that runs slurmdbd (slurm.conf ``AccountingStorageType=accounting_storage/slurmdbd``)
and keeps GPUs in its job records (``AccountingStorageTRES=gres/gpu``) can say, for every job
the hub submitted, who ran it, when it started and ended, how long it ran and how many GPUs
it was given.  ``gpuhub usage`` shows that beside the hub's own figures; the hub's run
records (:mod:`hub_ext.common.runs`) stay the primary source, and a run is joined to its job by the
job id the run record keeps (``job_id``).

The command (Slurm 22.05, ``man sacct``)::

    SLURM_TIME_FORMAT=%s sacct -a -X -n -P --duplicates -j ID,ID,... -o SACCT_FORMAT

``-X`` the job allocation only (no steps); ``-P`` (``--parsable2``) fields split by ``|``
with none at the end; ``SLURM_TIME_FORMAT=%s`` Start and End as Unix seconds, so no time
zone is guessed; ``--duplicates`` every record of a reused job id (ids restart after
``slurmctld -i`` or past ``MaxJobId``): a run's own job is the record that started nearest
before the run did (:func:`match_runs`).  The job name, which is member text, is not read:
every field asked for is Slurm's own (numbers, a Unix login, a state, TRES), and a line
that does not have exactly those fields is passed over.

The command runs through :meth:`hub_ext.slurm.cluster.SlurmCluster.run` (a subprocess, on
the submit host where the hub has one).  Where the site has no accounting, sacct answers
"Slurm accounting storage is disabled": :class:`AccountingNotConfigured`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from .cluster import SlurmCluster, SlurmUnavailable
from .config import submit_host

__all__ = [
    "Accounting",
    "AccountedJob",
    "AccountingNotConfigured",
    "accounted_jobs",
    "match_runs",
    "parse_alloc_gpus",
    "parse_sacct",
    "read_accounting",
]

SACCT_FORMAT = "JobIDRaw,User,State,ElapsedRaw,Start,End,AllocTRES"
#: job ids per sacct call (its command line stays short on any site)
IDS_PER_CALL = 500
#: seconds the hub's clock and slurmctld's may disagree when a run is matched to its job
CLOCK_SLACK = 120
#: more GPUs than one job of any site holds: a TRES count above it is not believed
MAX_GPUS = 65536
#: sacct's answer where AccountingStorageType=accounting_storage/none (Slurm's sacct.c)
_DISABLED = "accounting storage is disabled"
_TRES_GPU = re.compile(r"gres/gpu(?::[^=,]+)?")


class AccountingNotConfigured(RuntimeError):
    """The site's Slurm keeps no accounting (sacct: "Slurm accounting storage is disabled")."""


@dataclass(frozen=True)
class AccountedJob:
    """One job as Slurm's accounting keeps it.  ``start`` and ``end`` in Unix seconds (None:
    not started / not ended yet); ``elapsed_s`` Slurm's ElapsedRaw in seconds; ``gpus`` the
    GPUs it was allocated (AllocTRES ``gres/gpu``; 0 where the site's
    AccountingStorageTRES leaves GPUs out)."""

    job_id: str
    user: str
    state: str
    elapsed_s: int
    start: float | None
    end: float | None
    gpus: int

    def gpu_seconds(self, since: datetime, until: datetime) -> float:
        """GPU-seconds of the job inside [since, until): its GPUs times the overlap of
        [start, end] with the period; a job still running counts up to ``until``.  0 for a
        job that never started.  Naive datetimes are UTC."""
        if self.start is None:
            return 0.0
        low, high = epoch(since), epoch(until)
        end = high if self.end is None else min(self.end, high)
        return max(0.0, end - max(self.start, low)) * self.gpus


def parse_alloc_gpus(tres: str) -> int:
    """AllocTRES -> GPUs: ``billing=1,cpu=1,gres/gpu=2,node=1`` -> 2.  The untyped
    ``gres/gpu`` total when present, else the sum of the typed ones (``gres/gpu:a100=1``);
    0 when none, or when a count is not a plain number up to :data:`MAX_GPUS`."""
    total, typed = None, 0
    for item in tres.split(","):
        name, _, value = item.partition("=")
        if not _TRES_GPU.fullmatch(name):
            continue
        if not (value.isascii() and value.isdigit()) or int(value) > MAX_GPUS:
            return 0
        if name == "gres/gpu":
            total = int(value)
        else:
            typed += int(value)
    return typed if total is None else total


def _seconds(text: str) -> float | None:
    """A Start/End field under SLURM_TIME_FORMAT=%s -> Unix seconds; None for Slurm's
    ``Unknown``/``None`` and anything that is not a plain number."""
    return float(text) if text.isascii() and text.isdigit() else None


def parse_sacct(out: str) -> list[AccountedJob]:
    """``sacct -n -P -o SACCT_FORMAT`` (times as Unix seconds) -> the jobs, in sacct's
    order.  A line without exactly the seven fields, or with a job id or elapsed time that
    is not a plain number, is passed over."""
    jobs = []
    for line in out.splitlines():
        cols = line.split("|")
        if len(cols) != 7:
            continue
        job_id, user, state, elapsed, start, end, tres = cols
        if not (job_id.isascii() and job_id.isdigit() and elapsed.isascii() and elapsed.isdigit()):
            continue
        jobs.append(
            AccountedJob(
                job_id,
                user,
                state,
                int(elapsed),
                _seconds(start),
                _seconds(end),
                parse_alloc_gpus(tres),
            )
        )
    return jobs


async def accounted_jobs(
    cluster: SlurmCluster, job_ids: Iterable[str], timeout: float = 60
) -> dict[str, list[AccountedJob]]:
    """Job id -> every record Slurm's accounting keeps under that id (reused ids give
    several).  Asks once when ``job_ids`` is empty, so that a site without accounting is
    told apart from one with no jobs.  Raises :class:`AccountingNotConfigured`, or
    :class:`SlurmUnavailable` when sacct fails otherwise (slurmdbd down)."""
    ids = sorted({j for j in job_ids if j.isascii() and j.isdigit()}, key=int)
    chunks = [ids[i : i + IDS_PER_CALL] for i in range(0, len(ids), IDS_PER_CALL)]
    found: dict[str, list[AccountedJob]] = {}
    for chunk in chunks or [[]]:
        asked = set(chunk)
        select = ["-j", ",".join(chunk)] if chunk else ["-S", "now", "-E", "now"]
        try:
            out = await cluster.run(
                "env",
                "SLURM_TIME_FORMAT=%s",
                "sacct",
                "-a",
                "-X",
                "-n",
                "-P",
                "--duplicates",
                *select,
                "-o",
                SACCT_FORMAT,
                timeout=timeout,
            )
        except SlurmUnavailable as e:
            if _DISABLED in str(e).lower():
                raise AccountingNotConfigured(sacct_said(e)) from e
            raise
        for job in parse_sacct(out):
            if job.job_id in asked:
                found.setdefault(job.job_id, []).append(job)
    return found


def sacct_said(error: SlurmUnavailable) -> str:
    """The last line sacct wrote to stderr ("sacct: error: Problem talking to the database:
    Connection refused"), without the command line before it, which names every job id."""
    text = str(error).split(": ", 1)[-1].strip()
    return text.splitlines()[-1] if text else str(error)


def epoch(when: datetime) -> float:
    """A datetime -> Unix seconds; a naive one is UTC (the run records' convention)."""
    return when.replace(tzinfo=UTC).timestamp() if when.tzinfo is None else when.timestamp()


def match_runs(runs: Iterable, records: dict[str, list[AccountedJob]]) -> dict[int, AccountedJob]:
    """Run id -> its job's record.  Of the records under a run's ``job_id``, the one that
    started last before the run did (within :data:`CLOCK_SLACK` seconds either way) and had
    not ended before it; a run whose job accounting does not know is left out."""
    matched = {}
    for run in runs:
        started = epoch(run.started_at)
        fits = [
            job
            for job in records.get(run.job_id or "", [])
            if job.start is not None
            and job.start <= started + CLOCK_SLACK
            and (job.end is None or job.end >= started - CLOCK_SLACK)
        ]
        if fits:
            matched[run.id] = max(fits, key=lambda job: job.start)
    return matched


@dataclass
class Accounting:
    """What ``gpuhub usage`` learnt from Slurm's accounting: ``jobs`` maps a run id to its
    job's record (None when accounting was not read); ``note`` says why, or which runs it
    lacks, for stderr; ``failed``: the exit status is 1."""

    jobs: dict[int, AccountedJob] | None
    note: str = ""
    failed: bool = False


def read_accounting(settings, runs: Sequence) -> Accounting:
    """Read Slurm's accounting of ``runs`` (blocking: for the command line, which has no
    event loop of its own).  ``settings.slurm_accounting``: ``off`` reads nothing, ``auto``
    takes a site without accounting quietly (a note), ``on`` makes that an error."""
    if settings.slurm_accounting == "off":
        return Accounting(None, "Slurm accounting is off (GPUHUB_SLURM_ACCOUNTING=off)")
    cluster = SlurmCluster(
        env={"SLURM_CONF": settings.slurm_conf} if settings.slurm_conf else {},
        submit=submit_host(settings),
    )
    try:
        records = asyncio.run(accounted_jobs(cluster, [r.job_id for r in runs if r.job_id]))
    except AccountingNotConfigured as e:
        return Accounting(
            None,
            f"Slurm accounting is not configured ({e}); the site needs "
            "slurmdbd (docs/howto/slurm.md)",
            failed=settings.slurm_accounting == "on",
        )
    except SlurmUnavailable as e:
        return Accounting(None, f"Slurm's accounting cannot be read ({sacct_said(e)})", failed=True)
    jobs = match_runs(runs, records)
    lacking = [r.job_id or f"run {r.id}" for r in runs if r.id not in jobs]
    note = (
        f"Slurm's accounting has no record of {len(lacking)} run(s) (jobs "
        f"{', '.join(lacking[:10])}{', ...' if len(lacking) > 10 else ''})"
        if lacking
        else ""
    )
    return Accounting(jobs, note)
