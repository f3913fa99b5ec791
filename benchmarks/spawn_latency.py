"""Spawn latency: our hub against stock JupyterHub, a plain ``docker run`` and the floor,
interleaved in one run, for the CPU profile (gpuhub/base) and the GPU profile (gpuhub/pytorch).

    .venv/bin/python benchmarks/spawn_latency.py [--runs 7] [--cpu-image gpuhub/base:latest]
                                                 [--gpu-image gpuhub/pytorch:latest]

ours:  ``POST /hub/api/users/<name>/server`` of the profile until the hub reports the server
       ready (its progress event stream sends ``ready``), through our hub and proxy; the GPU
       profile reserves one of the simulated node's GPUs. The hub logs at JupyterHub's
       default level (INFO), as deployed and as stock runs, not at the tests' DEBUG.
stock: the same request and wait against stock JupyterHub 6.1 + DockerSpawner 14
       (benchmarks/stock_hub.py: no subclass of ours, JupyterHub's own readiness wait).
plain: ``docker run`` of the image's ``jupyter lab`` until ``/api/status`` answers 200.
floor: ``docker run --rm IMAGE python -c pass``: a container and an interpreter, no server.

Each round runs the four once, in an order that rotates from round to round, so that the
machine's load (2 shared cores here) weighs on all of them alike. Prints each median and the
ratios ours/stock (target <= 0.35), ours/plain (<= 1.0), ours/floor (<= 5), where our hub's
seconds went (from Docker's timestamps), the ratios with the hub's own work at zero (Docker's
create-to-started and the server's start-up alone: what a spawn at the click cannot shed),
the load average before and after, and the GPU refusal's median and p99 with both GPUs held
(the answer "at once").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import docker
import httpx
from jupyterhub.utils import random_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.stock_hub import StockHub  # noqa: E402
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402


async def plain_run(image: str) -> float:
    port = random_port()
    name = f"bench-plain-{port}"
    tic = time.perf_counter()
    subprocess.run(
        [
            "docker",
            "run",
            "-d",
            "--rm",
            "--name",
            name,
            "--network",
            "host",
            image,
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            "--IdentityProvider.token=bench",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient() as client:
            while True:
                try:
                    r = await client.get(
                        f"http://127.0.0.1:{port}/api/status",
                        headers={"Authorization": "token bench"},
                    )
                    if r.status_code == 200:
                        return time.perf_counter() - tic
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.01)
    finally:
        subprocess.run(["docker", "rm", "-f", name], stdout=subprocess.DEVNULL)


async def hub_spawn(hub: Hub, user: str, profile: str) -> tuple[float, dict]:
    """One spawn of our hub until ready: its seconds, and where they went (see
    :func:`breakdown`)."""
    wall = time.time()
    total = await spawn_until_ready(hub, user, {"profile": profile})
    return total, breakdown(hub, user, wall, total)


def _docker_time(text: str) -> float:
    """Docker's RFC 3339 timestamp (nanoseconds, Z) as seconds since the epoch."""
    day, _, rest = text.rstrip("Z").partition("T")
    clock, _, fraction = rest.partition(".")
    whole = datetime.fromisoformat(f"{day}T{clock}+00:00").timestamp()
    return whole + float("0." + (fraction or "0"))


def breakdown(hub: Hub, user: str, requested: float, total: float) -> dict:
    """Where a spawn's seconds went, from Docker's own timestamps of its container:
    ``hub``: the hub's own work (request to ``docker create``, and first answer to ready);
    ``docker``: create to started; ``server``: started until jupyterhub-singleuser answers
    its first HTTP request (its own start-up, inside the container)."""
    [container] = [
        c
        for c in docker.APIClient().containers(
            filters={"label": [f"io.gpuhub.hub={hub.id}", f"io.gpuhub.user={user}"]}
        )
    ]
    info = docker.APIClient().inspect_container(container["Id"])
    created, started = _docker_time(info["Created"]), _docker_time(info["State"]["StartedAt"])
    logs = subprocess.run(
        ["docker", "logs", "-t", container["Id"]], capture_output=True, text=True
    ).stderr.splitlines()
    answered = next(
        _docker_time(line.split()[0]) for line in logs if f"GET /user/{user}/api " in line
    )
    return {
        "hub": total - (answered - created),
        "docker": started - created,
        "server": answered - started,
    }


async def hub_refusal(hub: Hub, user: str) -> float:
    """A GPU spawn on a node whose GPUs are all held: seconds until the refusal."""
    tic = time.perf_counter()
    r = await hub.spawn(user, {"profile": "gpu"})
    elapsed = time.perf_counter() - tic
    assert r.status_code == 409 and "No GPU free" in r.json()["message"], r.text
    return elapsed


def floor_run(image: str) -> float:
    """``docker run --rm IMAGE python -c pass``: seconds until it exited."""
    tic = time.perf_counter()
    subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "python", "-c", "pass"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - tic


async def spawn_until_ready(hub: Hub, user: str, options: dict) -> float:
    """Seconds from the spawn request until the hub's progress stream says ``ready``."""
    tic = time.perf_counter()
    r = await hub.spawn(user, options)
    assert r.status_code in (201, 202), r.text
    headers = {"Authorization": f"token {hub.admin_token}"}
    async with hub.client.stream(
        "GET", f"/hub/api/users/{user}/server/progress", headers=headers, timeout=120
    ) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("ready"):
                break
    return time.perf_counter() - tic


PROFILES = ("cpu", "gpu")
KINDS = ("ours", "stock", "plain", "floor")


async def one_round(
    i: int, profile: str, image: str, ours: Hub, stock: StockHub, times: dict, parts: list
) -> None:
    """Run the four kinds once for ``profile``, starting with kind ``i % 4``."""
    for kind in KINDS[i % 4 :] + KINDS[: i % 4]:
        if kind == "ours":
            seconds, where = await hub_spawn(ours, "bench", profile)
            parts.append(where)
            await ours.stop_server("bench")
        elif kind == "stock":
            seconds = await spawn_until_ready(stock, "bench", {"image": profile})
            await stock.stop_server("bench")
        elif kind == "plain":
            seconds = await plain_run(image)
        else:
            seconds = floor_run(image)
        times[profile, kind].append(seconds)


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def main(runs: int, images: dict[str, str]) -> None:
    times = {(p, k): [] for p in PROFILES for k in KINDS}
    parts = {p: [] for p in PROFILES}
    load_before = _loadavg()
    with tempfile.TemporaryDirectory() as tmp, running_provider(Path(tmp) / "oidc.log") as oidc:
        profiles = Path(tmp) / "profiles.json"
        profiles.write_text(
            json.dumps(
                [
                    {
                        "display_name": "cpu",
                        "slug": "cpu",
                        "spawner_override": {"image": images["cpu"]},
                    },
                    {
                        "display_name": "gpu",
                        "slug": "gpu",
                        "gpus": 1,
                        "spawner_override": {"image": images["gpu"]},
                    },
                ]
            )
        )
        # JupyterHub's default log level, as deployed and as the stock hub runs: the test
        # fixture's DEBUG would log every request, poll and proxy call of ours alone
        ours = Hub(
            Path(tmp),
            {"GPUHUB_PROFILES": str(profiles), "GPUHUB_CREDITS": "off"},
            extra_config="c.JupyterHub.log_level = 'INFO'\n",
            oidc=oidc,
        )
        stock = StockHub(Path(tmp) / "stock", images)
        await ours.start()
        await stock.start()
        try:
            for user in ("bench", "holder1", "holder2", "refused"):
                await ours.create_user(user)
            await stock.create_user("bench")
            for profile in PROFILES:
                await one_round(
                    0, profile, images[profile], ours, stock, defaultdict(list), []
                )  # warm-up, not counted
            for i in range(runs):
                for profile in PROFILES:
                    await one_round(i, profile, images[profile], ours, stock, times, parts[profile])
            for holder in ("holder1", "holder2"):  # the simulated node's two GPUs
                r = await ours.spawn(holder, {"profile": "gpu"})
                assert r.status_code in (201, 202), r.text
                await ours.wait_ready(holder)
            refusals = sorted([await hub_refusal(ours, "refused") for _ in range(runs * 5)])
        finally:
            await ours.close(docker.APIClient())
            await stock.close(docker.APIClient())
    print(
        f"load average before {load_before}, after {_loadavg()} ({os.cpu_count()} cores); "
        f"{runs} interleaved rounds per profile"
    )
    for profile in PROFILES:
        med = {k: statistics.median(times[profile, k]) for k in KINDS}
        print(f"\n{profile} profile ({images[profile]})")
        for kind in KINDS:
            print(
                f"  {kind:<6}: median {med[kind]:.3f} s  runs "
                f"{[round(x, 3) for x in times[profile, kind]]}"
            )
        for other, target in (("stock", 0.35), ("plain", 1.0), ("floor", 5.0)):
            ratio = med["ours"] / med[other]
            print(
                f"  ours/{other:<6}: {ratio:.2f}  (target <= {target}: "
                f"{'met' if ratio <= target else 'NOT met'})"
            )
        for part, what in (
            ("hub", "the hub's own work"),
            ("docker", "docker create to started"),
            ("server", "jupyterhub-singleuser's start-up in the container"),
        ):
            print(
                f"    {part:<7}: median "
                f"{statistics.median(x[part] for x in parts[profile]):.3f} s  ({what})"
            )
        # what no hub can take away from a spawn that creates the container at the click:
        # Docker's create-to-started and the server's own start-up
        bound = statistics.median(x["docker"] + x["server"] for x in parts[profile])
        print(
            f"    container and server alone: {bound:.3f} s, so with the hub's own work at "
            f"zero ours/stock about {bound / med['stock']:.2f}, ours/plain about "
            f"{bound / med['plain']:.2f}"
        )
    p99 = refusals[min(len(refusals) - 1, round(0.99 * (len(refusals) - 1)))]
    print(
        f"\nours GPU refusal: median {statistics.median(refusals) * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms over {len(refusals)} requests (POST until the 409)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--cpu-image", default="gpuhub/base:latest")
    parser.add_argument("--gpu-image", default="gpuhub/pytorch:latest")
    args = parser.parse_args()
    asyncio.run(main(args.runs, {"cpu": args.cpu_image, "gpu": args.gpu_image}))
