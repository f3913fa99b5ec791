"""``gpuhub usage``: GPU-hours, credits and servers per user or group, for admins.

::

    gpuhub usage --since 2026-01-01 --by user
    gpuhub usage --since 2026-01-01 --until 2026-02-01 --by group --csv
    gpuhub usage --since 2026-01-01 --jobs      # one line per run (Slurm: with its job)
    gpuhub usage --since 2026-01-01 --by course # runs a course's account paid for

Two sources, joined by the credits meter's run id:

- the hub's run records (:mod:`hub_ext.common.runs`, table ``gpuhub_server_runs`` in the hub
  database): who ran which server, with how many GPUs, from when to when.  *Servers* are
  the runs that were running at some time in the period; *GPU-hours* are each run's GPUs
  times its hours inside the period;
- the credits ledger (the Credits API, read with the hub's or the admin token): *credits*
  are the run's debits made in the period, less their refunds made in the period.

On the Slurm backend a third source stands beside them: Slurm's own accounting (``sacct``,
where the site runs slurmdbd; :mod:`hub_ext.slurm.accounting`), joined by each run's job id.
*Slurm GPU-hours* are the GPUs Slurm allocated to the job times its hours inside the period
as Slurm recorded them; ``--jobs`` lists each run beside its job.  Where the site keeps no
accounting, or ``GPUHUB_SLURM_ACCOUNTING=off``, the column shows ``-`` and stderr says why.

*Jobs* are GPU notebook jobs (:mod:`hub_ext.jobs`: runs of a ``job-…`` server), counted
apart from *servers*, with their *job GPU-hours* (a part of the GPU-hours); the two
columns show when the period has any job.  *Kernels* are GPU kernels
(:mod:`hub_ext.kernels`: runs of a ``kernel-…`` server), counted apart likewise.

*Line starts* are the runs that began in the period after a wait in line
(:mod:`hub_ext.line`), and *average wait* their mean wait in minutes (``-`` when none).

A run counts for its user, and for each group its user was in when it started (so group
rows can add up to more than the users').  ``--by course`` counts the runs a course's
account paid for (during its reservations' windows, the run record's ``course``), and
their credits as that account's ledger has them (the intervals after a window, paid by
the member, are not the course's).  Settings come from the hub's environment
(``GPUHUB_STATE_DIR``, ``GPUHUB_DB_URL``, ``GPUHUB_CREDITS*``); with credits off, or a
Credits API that does not answer (said on stderr, exit status 1), credits are ``-``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # SQLAlchemy is imported only when a report runs, not by ``gpuhub init``
    from ..common.runs import ServerRun

#: the report's rows: per user, per group, per course (the runs its account paid for)
BY = ("user", "group", "course")

__all__ = ["UsageRow", "add_arguments", "credits_by_run", "gpu_seconds", "summarise", "usage"]


@dataclass
class UsageRow:
    """One line of the report: a user or a group.  Hours of GPU time; credits or None;
    starts that came from the line and their summed wait in seconds; hours of GPU time
    as the scheduler's accounting says (Slurm), or None when it was not read."""

    name: str
    servers: int = 0
    gpu_hours: float = 0.0
    credits: Decimal | None = None
    line_starts: int = 0
    line_wait_s: float = 0.0
    slurm_gpu_hours: float | None = None
    #: GPU notebook jobs (hub_ext.jobs), counted apart from ``servers``; their GPU-hours
    #: (also in ``gpu_hours``)
    jobs: int = 0
    job_gpu_hours: float = 0.0
    #: GPU kernels (hub_ext.kernels), counted apart from ``servers`` and ``jobs``; their
    #: GPU-hours (also in ``gpu_hours``)
    kernels: int = 0
    kernel_gpu_hours: float = 0.0

    @property
    def average_wait(self) -> str:
        """Mean wait in line in minutes ("12.5"), or "-" when no start came from it."""
        return f"{self.line_wait_s / self.line_starts / 60:.1f}" if self.line_starts else "-"


def gpu_seconds(run: ServerRun, since: datetime, until: datetime) -> float:
    """GPU-seconds of ``run`` inside [since, until): its GPUs times the overlap (a run still
    running counts up to ``until``)."""
    from ..common.runs import naive_utc

    start = max(run.started_at, naive_utc(since))
    end = min(run.stopped_at or naive_utc(until), naive_utc(until))
    return max(0.0, (end - start).total_seconds()) * run.gpus


def credits_by_run(transactions: Iterable, since: datetime, until: datetime) -> dict[str, Decimal]:
    """Credits charged per credits run id (debits less refunds) made in [since, until).

    ``transactions`` are ledger entries (:class:`hub_ext.credits.client.Transaction`); a
    debit names its run in ``metadata["server_id"]``, a refund names its debit.
    """
    entries = list(transactions)
    run_of_debit = {
        t.transaction_id: t.metadata.get("server_id") for t in entries if t.kind == "debit"
    }
    charged: dict[str, Decimal] = {}
    for t in entries:
        if not since <= t.created_at < until:
            continue
        run = run_of_debit.get(t.transaction_id if t.kind == "debit" else t.debit_id)
        if run is None or t.kind not in ("debit", "refund"):
            continue
        sign = 1 if t.kind == "debit" else -1
        charged[run] = charged.get(run, Decimal("0.00")) + sign * t.amount
    return charged


def summarise(
    runs: Iterable[ServerRun],
    charged: dict[str, Decimal] | None,
    since: datetime,
    until: datetime,
    by: str,
    accounted: dict[int, float] | None = None,
) -> list[UsageRow]:
    """Rows per user (``by="user"``), group (``by="group"``) or course (``by="course"``:
    the runs whose record names it), sorted by name.

    ``charged`` is :func:`credits_by_run`'s result, or None when the ledger was not read;
    ``accounted`` maps a run id to its GPU-seconds in the period as Slurm's accounting
    says (a run it lacks counts 0), or is None when that was not read.  Raises ValueError
    for another ``by``.
    """
    from ..common.runs import kind, naive_utc

    if by not in BY:
        raise ValueError(f"--by {by!r}: use one of {', '.join(BY)}")
    rows: dict[str, UsageRow] = {}
    for run in runs:
        if by == "course":
            names = [run.course] if run.course else []
        else:
            names = [run.username] if by == "user" else (run.groups or ["(no group)"])
        for name in names:
            row = rows.setdefault(
                name,
                UsageRow(
                    name,
                    credits=None if charged is None else Decimal("0.00"),
                    slurm_gpu_hours=None if accounted is None else 0.0,
                ),
            )
            hours = gpu_seconds(run, since, until) / 3600
            what = kind(run)
            if what == "job":
                row.jobs += 1
                row.job_gpu_hours += hours
            elif what == "kernel":
                row.kernels += 1
                row.kernel_gpu_hours += hours
            else:
                row.servers += 1
            row.gpu_hours += hours
            if accounted is not None:
                row.slurm_gpu_hours += accounted.get(run.id, 0.0) / 3600
            if charged is not None and run.credits_run:
                row.credits += charged.get(run.credits_run, Decimal("0.00"))
            if run.line_wait_s is not None and naive_utc(since) <= run.started_at:
                row.line_starts += 1
                row.line_wait_s += run.line_wait_s
    return [rows[name] for name in sorted(rows)]


# -- the command ------------------------------------------------------------------------------


def _date(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date (YYYY-MM-DD) or an ISO 8601 time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        type=_date,
        required=True,
        help="start of the period, YYYY-MM-DD (UTC) or an ISO 8601 time",
    )
    parser.add_argument(
        "--until", type=_date, default=None, help="end of the period (default: now)"
    )
    parser.add_argument(
        "--by",
        choices=BY,
        default="user",
        help="one row per user (default), per group, or per course (the runs its account paid for)",
    )
    parser.add_argument("--csv", action="store_true", help="CSV instead of a table")
    parser.add_argument(
        "--jobs",
        action="store_true",
        help="one line per run instead (Slurm: beside its job's accounting)",
    )


def _credits_client(settings):
    """A CreditsClient for the ledger the hub uses, or None when credits are off."""
    from ..credits.client import CreditsClient
    from ..credits.hubconfig import ADMIN_TOKEN_FILE, HUB_TOKEN_FILE, api_url

    if not settings.credits:
        return None
    if settings.credits_url:
        token = settings.credits_admin_token or settings.credits_token
        return CreditsClient(url=settings.credits_url, token=token, max_attempts=2)
    for name in (HUB_TOKEN_FILE, ADMIN_TOKEN_FILE):
        path = Path(settings.state_dir) / name
        if path.exists():
            return CreditsClient(
                url=api_url(settings), token=path.read_text().strip(), max_attempts=2
            )
    return None


async def _ledger(client, usernames: Iterable[str]) -> list:
    from ..credits.errors import AccountNotFound

    entries = []
    async with client:
        for username in sorted(set(usernames)):
            try:
                entries += [t async for t in client.iter_transactions(username)]
            except AccountNotFound:
                continue
    return entries


def _table(head: list[str], lines: list[list[str]], left: int, as_csv: bool, out) -> None:
    """CSV, or a table with the first ``left`` columns flush left and the rest right."""
    if as_csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(head)
        writer.writerows(lines)
        return
    head = [h.upper().replace("_", " ") for h in head]
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(head)]
    for line in [head, *lines]:
        print(
            "  ".join(
                v.ljust(w) if i < left else v.rjust(w)
                for i, (v, w) in enumerate(zip(line, widths, strict=True))
            ).rstrip(),
            file=out,
        )


def _print(
    rows: list[UsageRow],
    by: str,
    as_csv: bool,
    out,
    slurm: bool = False,
    jobs: bool = False,
    kernels: bool = False,
) -> None:
    """The report; ``slurm`` adds the column Slurm GPU-hours (``-`` when not read),
    ``jobs`` the columns Jobs and Job GPU-hours (GPU notebook jobs; their hours are in
    GPU-hours too), ``kernels`` the columns Kernels and Kernel GPU-hours (GPU kernels,
    likewise)."""

    def workload_columns(row: UsageRow) -> list[str]:
        columns = [str(row.jobs), f"{row.job_gpu_hours:.2f}"] if jobs else []
        if kernels:
            columns += [str(row.kernels), f"{row.kernel_gpu_hours:.2f}"]
        return columns

    def credits(row: UsageRow) -> str:
        return "-" if row.credits is None else f"{row.credits:.2f}"

    def slurm_hours(row: UsageRow) -> list[str]:
        if not slurm:
            return []
        return ["-" if row.slurm_gpu_hours is None else f"{row.slurm_gpu_hours:.2f}"]

    if as_csv:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(
            [
                by,
                "servers",
                "gpu_hours",
                "credits",
                "line_starts",
                "average_wait_min",
                *(["slurm_gpu_hours"] if slurm else []),
                *(["jobs", "job_gpu_hours"] if jobs else []),
                *(["kernels", "kernel_gpu_hours"] if kernels else []),
            ]
        )
        for row in rows:
            writer.writerow(
                [
                    row.name,
                    row.servers,
                    f"{row.gpu_hours:.2f}",
                    credits(row),
                    row.line_starts,
                    row.average_wait,
                    *slurm_hours(row),
                    *workload_columns(row),
                ]
            )
        return
    width = max([len(by), *(len(r.name) for r in rows)])
    extra = f"  {'SLURM GPU-HOURS':>15}" if slurm else ""
    extra += f"  {'JOBS':>5}  {'JOB GPU-HOURS':>13}" if jobs else ""
    extra += f"  {'KERNELS':>7}  {'KERNEL GPU-HOURS':>16}" if kernels else ""
    print(
        f"{by.upper():<{width}}  {'SERVERS':>7}  {'GPU-HOURS':>9}  {'CREDITS':>9}  "
        f"{'LINE STARTS':>11}  {'AVG WAIT MIN':>12}{extra}",
        file=out,
    )
    for row in rows:
        extra = "".join(f"  {v:>15}" for v in slurm_hours(row))
        widths = ((5, 13) if jobs else ()) + ((7, 16) if kernels else ())
        extra += "".join(f"  {v:>{w}}" for v, w in zip(workload_columns(row), widths, strict=True))
        print(
            f"{row.name:<{width}}  {row.servers:>7}  {row.gpu_hours:>9.2f}  "
            f"{credits(row):>9}  {row.line_starts:>11}  {row.average_wait:>12}{extra}",
            file=out,
        )


def _print_jobs(
    runs: list[ServerRun], jobs: dict | None, since: datetime, until: datetime, as_csv: bool, out
) -> None:
    """``--jobs``: one line per run, the hub's figures beside Slurm's accounting of its job
    (``jobs``: run id -> :class:`hub_ext.slurm.accounting.AccountedJob`, None when not
    read): GPUs (run record; AllocTRES), seconds (the run's whole length; Slurm's
    ElapsedRaw), Slurm's state, and GPU-hours inside the period by each source's own start
    and end.  ``-`` where a source has no figure."""
    from ..common.runs import naive_utc

    head = [
        "job",
        "user",
        "server",
        "state",
        "gpus",
        "slurm_gpus",
        "seconds",
        "slurm_elapsed_s",
        "gpu_hours",
        "slurm_gpu_hours",
    ]
    lines = []
    for run in runs:
        job = (jobs or {}).get(run.id)
        seconds = ((run.stopped_at or naive_utc(until)) - run.started_at).total_seconds()
        lines.append(
            [
                run.job_id or "-",
                run.username,
                run.server_name or "-",
                job.state if job else "-",
                str(run.gpus),
                str(job.gpus) if job else "-",
                f"{seconds:.0f}",
                str(job.elapsed_s) if job else "-",
                f"{gpu_seconds(run, since, until) / 3600:.4f}",
                f"{job.gpu_seconds(since, until) / 3600:.4f}" if job else "-",
            ]
        )
    _table(head, lines, 4, as_csv, out)


def _course_accounts(settings) -> dict[str, str]:
    """slug -> the course's Credits API account, for the courses of ``GPUHUB_COURSES``
    that have one."""
    from ..courses import load_courses

    courses = load_courses(settings.courses_file)
    return {slug: c.account for slug, c in courses.items() if c.account}


def usage(args) -> int:
    """Run ``gpuhub usage``; returns the exit status (1 when the ledger could not be read)."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from ..backends import backend
    from ..common.dburl import hub_db_url
    from ..common.runs import runs_overlapping
    from ..credits.errors import CreditsError
    from ..settings import Settings

    settings = Settings.from_env()
    until = args.until or datetime.now(UTC)
    if until <= args.since:
        print("gpuhub usage: --until must be after --since", file=sys.stderr)
        return 2
    engine = create_engine(hub_db_url(settings))
    try:
        with Session(engine) as session:
            runs = runs_overlapping(session, args.since, until)
            session.expunge_all()
    finally:
        engine.dispose()
    status = 0
    charged = None
    client = _credits_client(settings)
    if client is not None:
        try:
            accounts = (
                _course_accounts(settings).values()
                if args.by == "course"
                else (r.username for r in runs)
            )
            entries = asyncio.run(_ledger(client, accounts))
            charged = credits_by_run(entries, args.since, until)
        except CreditsError as e:
            print(
                f"gpuhub usage: the credits ledger cannot be read ({e}); credits are shown as -",
                file=sys.stderr,
            )
            status = 1
    jobs = None
    accounting = backend(settings.backend).read_accounting(settings, runs)  # Slurm's sacct
    if accounting is not None:
        if accounting.note:
            print(f"gpuhub usage: {accounting.note}", file=sys.stderr)
        status = max(status, int(accounting.failed))
        jobs = accounting.jobs
    if args.jobs:
        _print_jobs(runs, jobs, args.since, until, args.csv, sys.stdout)
        return status
    accounted = (
        None
        if jobs is None
        else {run_id: job.gpu_seconds(args.since, until) for run_id, job in jobs.items()}
    )
    rows = summarise(runs, charged, args.since, until, args.by, accounted)
    _print(
        rows,
        args.by,
        args.csv,
        sys.stdout,
        slurm=settings.backend == "slurm",
        jobs=any(row.jobs for row in rows),
        kernels=any(row.kernels for row in rows),
    )
    return status
