"""Spawn-to-ready on the Slurm backend against the Docker backend, same image, same run;
and the time from a GPU being freed to the next pending job running.

    .venv/bin/python benchmarks/slurm_spawn.py [--runs 5] [--image gpuhub/base:latest]

Needs root, Docker and Debian's slurm-wlm + munge + bubblewrap (scripts/setup.sh); starts
the local two-node cluster (scripts/slurm-cluster.sh) when it is not running.  With
``GPUHUB_SLURM_SCHEDULER_PARAMETERS`` set, stop the cluster first
(``scripts/slurm-cluster.sh stop``) so that it starts with them; the figures name the
SchedulerParameters they were taken with.

docker: a hub on the Docker backend (simulated GPUs), ``POST .../server`` of a one-GPU
        profile until the progress stream says ready.
slurm:  the same on the Slurm backend; split into submit -> job RUNNING (Slurm's
        scheduling) and RUNNING -> ready (the container, JupyterLab, the hub's wait).
freed:  every GPU held by plain jobs, a member's spawn pending; one holder is cancelled
        and the clock runs until the member's job is RUNNING, and until the server is ready.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402

DIR = Path(os.environ.get("GPUHUB_SLURM_DIR", "/srv/gpuhub-slurm"))
ENV = {**os.environ, "SLURM_CONF": str(DIR / "slurm.conf")}
SCRIPT = REPO / "scripts" / "slurm-cluster.sh"


def sh(*argv: str, user: str | None = None) -> str:
    cmd = ["runuser", "-u", user, "--", *argv] if user else list(argv)
    return subprocess.run(
        cmd, env=ENV, check=True, capture_output=True, text=True, cwd="/"
    ).stdout.strip()


def member(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", name], check=True)


def job_state(job_id: str) -> str:
    return sh("squeue", "-h", "-j", job_id, "-o", "%T")


def profiles(tmp: Path, image: str) -> str:
    path = tmp / "profiles.json"
    path.write_text(
        json.dumps(
            [
                {"display_name": "cpu", "slug": "cpu", "spawner_override": {"image": image}},
                {
                    "display_name": "gpu",
                    "slug": "gpu",
                    "gpus": 1,
                    "spawner_override": {"image": image},
                },
            ]
        )
    )
    return str(path)


def slurm_env(image: str) -> dict:
    controller = next(
        line.split("(", 1)[1].rstrip(")")
        for line in (DIR / "slurm.conf").read_text().splitlines()
        if line.startswith("SlurmctldHost=")
    )
    return {
        "GPUHUB_BACKEND": "slurm",
        "GPUHUB_CREDITS": "off",
        "GPUHUB_IMAGE": image,
        "GPUHUB_SLURM_CONF": str(DIR / "slurm.conf"),
        "GPUHUB_SLURM_IMAGE_DIR": str(DIR / "images"),
        "GPUHUB_SLURM_WORKSPACE": str(DIR / "shared" / "home" / "{username}"),
        "GPUHUB_SLURM_GPU_DEVICE": f"{DIR}/dev/$SLURMD_NODENAME/nvidia$i",
        "GPUHUB_HUB_IP": controller,
    }


def slurm_split(hub: Hub) -> list[tuple[float, float]]:
    """(submit -> RUNNING, RUNNING -> ready) of each spawn, from the hub's own log
    (batchspawner's 'Job submitted', our 'runs on', JupyterHub's 'took N seconds')."""
    from datetime import datetime

    def stamp(line: str) -> float:
        return datetime.strptime(
            line.split(" JupyterHub")[0][3:], "%Y-%m-%d %H:%M:%S.%f"
        ).timestamp()

    out, submitted, running = [], None, None
    for line in hub.log().splitlines():
        if "Job submitted. output:" in line:
            submitted = stamp(line)
        elif "still pending" in line or not line.startswith("["):
            continue
        elif " runs on " in line or "Notebook server job" in line and running is None:
            running = running or stamp(line)
        elif "took" in line and "seconds to start" in line and submitted and running:
            out.append((running - submitted, stamp(line) - running))
            submitted = running = None
    return out


async def freed_to_running(hub: Hub, user: str, holder: str) -> tuple[float, float]:
    holds = [
        sh(
            "sbatch",
            "--parsable",
            "--gres=gpu:1",
            "--output=/dev/null",
            "--wrap=sleep 600",
            user=holder,
        )
        for _ in range(4)
    ]
    while not all(job_state(j) == "RUNNING" for j in holds):
        await asyncio.sleep(0.1)
    r = await hub.spawn(user, {"profile": "gpu", "wait": True})  # a place in line
    assert r.status_code in (201, 202), r.text
    mine = ""
    while not mine:
        mine = sh("squeue", "-h", "-u", user, "-o", "%i")
        await asyncio.sleep(0.1)
    tic = time.perf_counter()
    sh("scancel", holds[0])
    while job_state(mine) != "RUNNING":
        await asyncio.sleep(0.02)
    running = time.perf_counter() - tic
    await hub.wait_ready(user, timeout=300)
    ready = time.perf_counter() - tic
    sh("scancel", "-u", holder)
    await hub.stop_server(user, timeout=120)
    return running, ready


async def main(runs: int, image: str) -> None:
    subprocess.run(["bash", str(SCRIPT), "start"], check=True)
    subprocess.run(["bash", str(SCRIPT), "image", image], check=True)
    for name in ("ghs-bench", "ghs-holder"):
        member(name)
    config = sh("scontrol", "show", "config")
    sched = config.split("SchedulerParameters", 1)[1].split("=", 1)[1].splitlines()[0].strip()
    with tempfile.TemporaryDirectory() as tmp, running_provider(Path(tmp) / "oidc.log") as oidc:
        tmp = Path(tmp)
        (tmp / "d").mkdir()
        (tmp / "s").mkdir()
        docker_hub = Hub(
            tmp / "d", {"GPUHUB_PROFILES": profiles(tmp, image), "GPUHUB_CREDITS": "off"}, oidc=oidc
        )
        await docker_hub.start()
        try:
            await docker_hub.create_user("ghs-bench")
            docker_runs = [(await hub_spawn_gpu(docker_hub, "ghs-bench")) for _ in range(runs)]
        finally:
            await docker_hub.close(docker.APIClient())
        slurm_hub = Hub(
            tmp / "s", {"GPUHUB_PROFILES": profiles(tmp, image), **slurm_env(image)}, oidc=oidc
        )
        await slurm_hub.start()
        try:
            await slurm_hub.create_user("ghs-bench")
            slurm_runs = [(await hub_spawn_gpu(slurm_hub, "ghs-bench")) for _ in range(runs)]
            split = slurm_split(slurm_hub)
            freed = [
                await freed_to_running(slurm_hub, "ghs-bench", "ghs-holder")
                for _ in range(max(3, runs // 2))
            ]
        finally:
            sh("scancel", "-u", "ghs-holder")
            await slurm_hub.close(docker.APIClient())
    d, s = statistics.median(docker_runs), statistics.median(slurm_runs)
    print(f"SchedulerParameters: {sched}")
    print(
        f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
        f" (1, 5, 15 min) on {os.cpu_count()} CPUs"
    )
    print(f"docker backend spawn : median {d:.2f} s  runs {[round(x, 2) for x in docker_runs]}")
    print(f"slurm backend spawn  : median {s:.2f} s  runs {[round(x, 2) for x in slurm_runs]}")
    if split:
        print(
            f"  submit -> RUNNING  : median {statistics.median(a for a, _ in split):.2f} s"
            "  (Slurm's scheduling)"
        )
        print(
            f"  RUNNING -> ready   : median {statistics.median(b for _, b in split):.2f} s"
            "  (container, JupyterLab, the hub's wait)"
        )
    print(
        f"GPU freed -> next job RUNNING : median "
        f"{statistics.median(a for a, _ in freed):.2f} s  runs "
        f"{[round(a, 2) for a, _ in freed]}"
    )
    print(f"GPU freed -> its server ready : median {statistics.median(b for _, b in freed):.2f} s")


async def hub_spawn_gpu(hub: Hub, user: str) -> float:
    """POST of a one-GPU spawn until the hub's REST model says ready; then a stop."""
    tic = time.perf_counter()
    r = await hub.spawn(user, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(user, timeout=300)
    seconds = time.perf_counter() - tic
    await hub.stop_server(user, timeout=120)
    return seconds


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", default="gpuhub/base:latest")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.image))
