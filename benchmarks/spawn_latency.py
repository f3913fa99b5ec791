"""Spawn latency: plain ``docker run`` against a hub spawn, same image, same machine.

    .venv/bin/python benchmarks/spawn_latency.py [--runs 7] [--image gpuhub/base:latest]

plain: ``docker run`` of the image's JupyterLab until ``/api/status`` answers 200.
hub:   ``POST /hub/api/users/<name>/server`` until the hub reports the server ready
       (its progress event stream sends ``ready``), through the real hub and proxy.
refusal: with both GPUs of the simulated node held, a GPU spawn request until its 409.
Prints the medians of each and their ratio (target: hub/plain at most 1.25), and the
refusal's median and p99 (the answer "at once": well under JupyterHub's 10 s
slow_spawn_timeout, after which a refusal would only show on the progress page).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import docker
import httpx
from jupyterhub.utils import random_port

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402


async def plain_run(image: str) -> float:
    port = random_port()
    name = f"bench-plain-{port}"
    tic = time.perf_counter()
    subprocess.run(
        ["docker", "run", "-d", "--rm", "--name", name, "--network", "host", image,
         "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--IdentityProvider.token=bench"],
        check=True, stdout=subprocess.DEVNULL,
    )
    try:
        async with httpx.AsyncClient() as client:
            while True:
                try:
                    r = await client.get(f"http://127.0.0.1:{port}/api/status",
                                         headers={"Authorization": "token bench"})
                    if r.status_code == 200:
                        return time.perf_counter() - tic
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.01)
    finally:
        subprocess.run(["docker", "rm", "-f", name], stdout=subprocess.DEVNULL)


async def hub_spawn(hub: Hub, user: str) -> tuple[float, dict]:
    """One spawn until ready: its seconds, and where they went (see :func:`breakdown`)."""
    wall, tic = time.time(), time.perf_counter()
    r = await hub.spawn(user, {"profile": "cpu"})
    assert r.status_code in (201, 202), r.text
    headers = {"Authorization": f"token {hub.admin_token}"}
    async with hub.client.stream("GET", f"/hub/api/users/{user}/server/progress",
                                 headers=headers, timeout=120) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data:") and json.loads(line[5:]).get("ready"):
                break
    total = time.perf_counter() - tic
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
    [container] = [c for c in docker.APIClient().containers(
        filters={"label": [f"io.gpuhub.hub={hub.id}", f"io.gpuhub.user={user}"]})]
    info = docker.APIClient().inspect_container(container["Id"])
    created, started = _docker_time(info["Created"]), _docker_time(info["State"]["StartedAt"])
    logs = subprocess.run(["docker", "logs", "-t", container["Id"]], capture_output=True,
                          text=True).stderr.splitlines()
    answered = next(_docker_time(line.split()[0]) for line in logs
                    if f"GET /user/{user}/api " in line)
    return {"hub": total - (answered - created), "docker": started - created,
            "server": answered - started}


async def hub_refusal(hub: Hub, user: str) -> float:
    """A GPU spawn on a node whose GPUs are all held: seconds until the refusal."""
    tic = time.perf_counter()
    r = await hub.spawn(user, {"profile": "gpu"})
    elapsed = time.perf_counter() - tic
    assert r.status_code == 409 and "No GPU free" in r.json()["message"], r.text
    return elapsed


async def main(runs: int, image: str) -> None:
    plain = [await plain_run(image) for _ in range(runs)]
    with tempfile.TemporaryDirectory() as tmp, \
            running_provider(Path(tmp) / "oidc.log") as oidc:
        profiles = Path(tmp) / "profiles.json"
        profiles.write_text(json.dumps([
            {"display_name": "cpu", "slug": "cpu", "spawner_override": {"image": image}},
            {"display_name": "gpu", "slug": "gpu", "gpus": 1,
             "spawner_override": {"image": image}},
        ]))
        hub = Hub(Path(tmp), {"GPUHUB_PROFILES": str(profiles)}, oidc=oidc)
        await hub.start()
        try:
            for user in ("bench", "holder1", "holder2", "refused"):
                await hub.create_user(user)
            spawns, parts = [], []
            for _ in range(runs):
                seconds, where = await hub_spawn(hub, "bench")
                spawns.append(seconds)
                parts.append(where)
                await hub.stop_server("bench")
            for holder in ("holder1", "holder2"):  # the simulated node's two GPUs
                r = await hub.spawn(holder, {"profile": "gpu"})
                assert r.status_code in (201, 202), r.text
                await hub.wait_ready(holder)
            refusals = sorted([await hub_refusal(hub, "refused") for _ in range(runs * 5)])
        finally:
            await hub.close(docker.APIClient())
    p, h = statistics.median(plain), statistics.median(spawns)
    p99 = refusals[min(len(refusals) - 1, round(0.99 * (len(refusals) - 1)))]
    print(f"plain docker run  : median {p:.3f} s  runs {[round(x, 3) for x in plain]}")
    print(f"hub spawn         : median {h:.3f} s  runs {[round(x, 3) for x in spawns]}")
    print(f"ratio hub/plain   : {h / p:.2f}  (target <= 1.25)")
    for part, what in (("hub", "the hub's own work"), ("docker", "docker create to started"),
                       ("server", "jupyterhub-singleuser's start-up in the container")):
        print(f"  {part:<7}: median {statistics.median(x[part] for x in parts):.3f} s  "
              f"({what})")
    print(f"hub GPU refusal   : median {statistics.median(refusals) * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms over {len(refusals)} requests (POST until the 409)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--image", default="gpuhub/base:latest")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.image))
