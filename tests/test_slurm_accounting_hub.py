"""``gpuhub usage`` on the Slurm backend beside Slurm's own accounting: a real hub and
batchspawner, the two-node test cluster with slurmdbd and MariaDB (scripts/slurm-cluster.sh,
AccountingStorageTRES=gres/gpu), and the real command as an admin runs it.

The figures must agree, not be fast: the job Slurm accounted is the run's own (its id, its
member, its GPUs), it started before the run began, and it ended while the hub stopped the
server (the run record's end is when the stop was done)."""

from __future__ import annotations

import asyncio
import csv
import io
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.slurm.accounting import epoch
from tests.fixtures.hub import _need
from tests.test_slurm_pages import hub_runs

pytestmark = [pytest.mark.slurm, pytest.mark.hub, pytest.mark.docker]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1},
]
#: seconds of rounding between the hub's times (microseconds) and Slurm's (whole seconds)
ROUNDING = 2


def report(hub, *args: str, **env: str) -> tuple[int, list[dict], str]:
    """``gpuhub usage --since yesterday --csv ARGS`` -> (exit status, rows, stderr)."""
    since = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    done = subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "usage", "--since", since, "--csv", *args],
        capture_output=True,
        text=True,
        env={**hub.env, **env},
        timeout=120,
    )
    return done.returncode, list(csv.DictReader(io.StringIO(done.stdout))), done.stderr


async def gpu_server_ran(slurm_hub, slurm_cluster, seconds: float = 0):
    """A hub on the Slurm backend where a fresh member ran a one-GPU server for ``seconds``
    and stopped it: (hub, member, when the stop was asked for)."""
    member = slurm_cluster.fresh_member("gha")
    hub = await slurm_hub(PROFILES, GPUHUB_CREDITS="off")
    await hub.create_user(member)
    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(member, timeout=180)
    await asyncio.sleep(seconds)
    stop_asked = datetime.now(UTC)
    await hub.stop_server(member, timeout=120)
    return hub, member, stop_asked


async def accounted(hub, job_id: str, timeout: float = 60) -> dict:
    """The run's line of ``gpuhub usage --jobs`` once Slurm's accounting has the job's end
    (slurmctld sends it to slurmdbd a moment after the job ends)."""
    rows: list[dict] = []
    for _ in range(int(timeout)):
        status, rows, err = report(hub, "--jobs")
        assert status == 0, err
        row = next((r for r in rows if r["job"] == job_id), None)
        if row and row["state"] not in ("-", "RUNNING"):
            return row
        await asyncio.sleep(1)
    raise AssertionError(f"Slurm's accounting never showed job {job_id} ended: {rows}")


async def test_usage_shows_slurms_accounting_of_the_members_job_beside_the_run_record(
    slurm_hub, slurm_cluster
):
    _need(
        slurm_cluster.accounting,
        "the test cluster keeps no accounting (started with GPUHUB_SLURM_DBD=no or by an "
        "older scripts/slurm-cluster.sh): stop it and start it again",
    )
    hub, member, stop_asked = await gpu_server_ran(slurm_hub, slurm_cluster, seconds=5)

    [run] = [r for r in hub_runs(hub) if r.username == member]
    assert run.job_id and run.stopped_at and run.gpus == 1
    job = await accounted(hub, run.job_id)
    # the same job: its id, its member, the GPU Slurm gave it, ended by the stop
    assert (job["user"], job["gpus"], job["slurm_gpus"]) == (member, "1", "1")
    assert job["state"].startswith(("CANCELLED", "COMPLETED")), job
    hub_seconds, slurm_seconds = int(job["seconds"]), int(job["slurm_elapsed_s"])
    # Slurm's own times (read straight from sacct) around the run's
    out = slurm_cluster.run(
        "env",
        "SLURM_TIME_FORMAT=%s",
        "sacct",
        "-n",
        "-P",
        "-X",
        "-j",
        run.job_id,
        "-o",
        "Start,End",
    ).stdout.split()[-1]
    start, end = (int(t) for t in out.split("|"))
    assert start <= epoch(run.started_at) + ROUNDING
    assert epoch(stop_asked) - ROUNDING <= end <= epoch(run.stopped_at) + ROUNDING
    assert slurm_seconds == end - start
    assert float(job["slurm_gpu_hours"]) == pytest.approx(slurm_seconds / 3600, abs=1e-4)

    # per member: the hub's GPU-hours, and Slurm's beside them
    status, rows, err = report(hub)
    assert status == 0, err
    [row] = [r for r in rows if r["user"] == member]
    assert row["slurm_gpu_hours"] == f"{slurm_seconds / 3600:.2f}"
    assert row["gpu_hours"] == f"{hub_seconds / 3600:.2f}"


async def test_usage_without_slurm_accounting_says_so_and_shows_the_hubs_figures(
    slurm_hub, slurm_cluster, tmp_path
):
    # the submit host's slurm.conf of a site without slurmdbd: sacct says so itself
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "\n".join(
            "AccountingStorageType=accounting_storage/none"
            if line.startswith("AccountingStorageType=")
            else line
            for line in (slurm_cluster.dir / "slurm.conf").read_text().splitlines()
            if not line.startswith(
                (
                    "AccountingStorageHost",
                    "AccountingStoragePort",
                    "AccountingStoragePass",
                    "AccountingStorageTRES",
                )
            )
        )
        + "\n"
    )
    hub, member, _ = await gpu_server_ran(slurm_hub, slurm_cluster)

    status, rows, err = report(hub, GPUHUB_SLURM_CONF=str(conf))
    assert status == 0, err
    assert "Slurm accounting is not configured (Slurm accounting storage is disabled)" in err
    [row] = [r for r in rows if r["user"] == member]
    assert (row["servers"], row["slurm_gpu_hours"]) == ("1", "-")
    # a site that says it has accounting is told of its absence with exit status 1
    status, rows, err = report(hub, GPUHUB_SLURM_CONF=str(conf), GPUHUB_SLURM_ACCOUNTING="on")
    assert (status, [r["servers"] for r in rows if r["user"] == member]) == (1, ["1"])
    assert "Slurm accounting is not configured" in err
    status, rows, err = report(hub, GPUHUB_SLURM_ACCOUNTING="off")
    assert status == 0 and "Slurm accounting is off (GPUHUB_SLURM_ACCOUNTING=off)" in err
