"""A class day through the real hub: interactive GPU servers against CPU servers plus GPU
notebook jobs, and CPU servers plus GPU kernels, on the same demand.

    .venv/bin/python benchmarks/class_day.py [--members 12] [--gpus 2] [--span 300]
                                             [--scale 18] [--seed 7]
                                             [--modes servers,jobs,kernels]
                                             [--kernel-idle 5,10,15]
                                             [--kernel-contended 5]

Each of ``--members`` members alternates thinking and a "training" burst, both drawn once
from a fixed seed (think 5-25 min, burst 5-20 min of class time), so both ways see the
same demand.  Class time is compressed ``--scale`` times (18: a 90-minute class in 300 s);
the hub's time-outs that shape the answer (the GPU-idle culler's ``GPUHUB_GPU_IDLE_TIMEOUT``,
the idle culler's, the line's maximum wait) are divided by the same factor, at their
defaults otherwise.

- ``servers``: (a) each member starts a GPU server when a burst is due (waiting in the
  line while both GPUs are held) and keeps it while thinking, as members do; the burst
  keeps its GPU at 100 % (the NVML stand-in's utilisation), and the GPU-idle culler stops a
  server whose GPU stayed idle for its time-out.
- ``jobs``: (b) each member has a CPU server (no GPU) and runs each burst as a notebook job
  on the GPU profile (``POST /hub/api/gpuhub/jobs``), a notebook that sleeps for the burst.
- ``kernels``: (c) each member has a CPU server and runs her bursts in a GPU kernel, which
  she keeps while she thinks (as people do): when a burst is due and she has no kernel, she
  starts one, waiting in the same line.  The kernels are the hub's own (issue 29): the
  member's server asks ``POST /hub/api/gpuhub/kernels`` with its own token, as the
  images' provisioner does (:func:`start_kernel`: the connection folder of hers in her
  workspace and its ``connection.json`` first, then the request, the hub's checks and
  its line), the kernel's container runs ``gpuhub-kernel`` (ipykernel on ipc sockets in
  that folder), and the hub's kernels' keeper ends a kernel idle for the GPU kernels'
  idle time-out (``--kernel-idle``, class minutes, one run per value, 15 the default),
  or for the shorter contended one while someone waits in line for a GPU
  (``--kernel-contended``, 5 the default, 0 off); both divided by ``--scale`` like the
  other time-outs.  A kernel is idle while its GPU is (the burst's utilisation marks it
  active, as the culler does for any server with a busy GPU).  Each kernel's end reason
  is read from the hub's ``gpuhub_kernels`` table.

Printed for each, inside the span: GPU-seconds held (sampled from the containers holding GPUs, every
0.25 s), GPU-seconds busy (the bursts' own seconds inside the span), utilisation =
busy/held, bursts completed, each burst's wait to start (median, p90) and the credits
charged per member; the most GPUs held at one sample, and any device on two containers
at once (never, or the pool double-booked).  For jobs also the hand-off: from a finished
job's container ending (Docker's ``die`` event) to the next waiting job's container
starting (``start``), by the engine's clock.  Parts: our hub (``jupyterhub_config.py``),
the proxy, Docker, the Credits API reference service, the OIDC provider, the NVML
stand-in for the GPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROFILES = [
    {"display_name": "CPU", "slug": "cpu", "gpus": 0, "credits_per_hour": 0, "default": True},
    {"display_name": "PyTorch", "slug": "gpu", "gpus": 1, "credits_per_hour": 1},
]
#: (c)'s profiles: the GPU profile offers GPU kernels (issue 29); the CPU servers are not
#: culled for inactivity: her JupyterLab, open all class, would keep hers (nobody browses
#: here), and her GPU kernels end with it
KERNEL_PROFILES = [
    {**p, "kernels": True} if p["gpus"] else {**p, "cull_idle_timeout": 0} for p in PROFILES
]
#: the GPU kernels' idle time-out, class minutes, when none is given (issue 29's default)
KERNEL_IDLE_DEFAULT = 15
#: the GPU kernels' contended idle time-out, class minutes (GPUHUB_KERNEL_CONTENDED_IDLE_TIMEOUT)
KERNEL_CONTENDED_DEFAULT = 5

BURST_NOTEBOOK = {
    "cells": [
        {
            "cell_type": "code",
            "metadata": {"tags": ["parameters"]},
            "source": "seconds = '1'",
            "outputs": [],
            "execution_count": None,
        },
        {
            "cell_type": "code",
            "metadata": {},
            "source": "import os, time\ntime.sleep(float(seconds))\n"
            "print(os.environ.get('NVIDIA_VISIBLE_DEVICES'))",
            "outputs": [],
            "execution_count": None,
        },
    ],
    "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(round(q * (len(ordered) - 1)))] if ordered else float("nan")


def demand(members: int, span: float, scale: float, seed: int) -> dict[str, list[tuple]]:
    """Each member's (think, burst) seconds, real time, enough to fill ``span``."""
    rng = random.Random(seed)
    plan = {}
    for i in range(members):
        steps, total = [], 0.0
        while total < span:
            think = rng.uniform(5, 25) * 60 / scale
            burst = rng.uniform(5, 20) * 60 / scale
            steps.append((think, burst))
            total += think + burst
        plan[f"member{i:02d}"] = steps
    return plan


class Node:
    """The NVML stand-in's node file, the utilisation of each GPU set by the bursts."""

    def __init__(self, nvml, gpus: int):
        self.nvml = nvml
        self.util = {f"GPU-{i:08x}-class-day": 0 for i in range(gpus)}
        self.lock = threading.Lock()
        self.write()

    def write(self) -> None:
        devices = [
            {"uuid": u, "name": "Simulated", "memory_total_mib": 16384, "utilization_gpu": v}
            for u, v in self.util.items()
        ]
        self.nvml.write({"devices": devices})

    def set(self, uuid: str, value: int) -> None:
        with self.lock:
            if uuid in self.util:
                self.util[uuid] = value
                self.write()


class Sampler:
    """GPU-seconds held: the GPUs on running containers of the hub, every ``period`` s."""

    def __init__(self, hub, client, end: float, period: float = 0.25):
        self.hub, self.client, self.end, self.period = hub, client, end, period
        self.held = 0.0
        #: the most GPUs held at one sample, and a device on two containers at once
        self.most, self.double = 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        last = time.monotonic()
        while not self.stop.is_set() and last < self.end:
            held: list[str] = []
            for c in self.hub.containers(self.client):
                devices = c["Labels"].get("io.gpuhub.devices", "")
                if c["State"] == "running" and devices:
                    held += devices.split(",")
            self.most = max(self.most, len(held))
            self.double = max(self.double, len(held) - len(set(held)))
            held = len(held)
            now = min(time.monotonic(), self.end)
            self.held += held * (now - last)
            last = now
            self.stop.wait(self.period)


async def wait_server(hub, user: str, until: float) -> bool:
    """Until ``user``'s default server is ready (True) or ``until`` passes (False)."""
    while time.monotonic() < until:
        server = await hub.server(user)
        if server and server.get("ready"):
            return True
        if server is None:
            return False
        await asyncio.sleep(0.25)
    return False


def gpu_of(hub, client, user: str, server: str = "") -> str:
    for c in hub.containers(client):
        labels = c["Labels"]
        if labels.get("io.gpuhub.user") == user and labels.get("io.gpuhub.server", "") == server:
            return labels.get("io.gpuhub.devices", "")
    return ""


async def member_servers(hub, client, node, user, token, steps, end, out) -> None:
    """(a): a GPU server, started when a burst is due, kept while thinking."""
    for think, burst in steps:
        await asyncio.sleep(max(0.0, min(think, end - time.monotonic())))
        if time.monotonic() >= end:
            return
        want = time.monotonic()
        while not await hub.running(user):
            if time.monotonic() >= end:
                out["unstarted"].append(end - want)
                return
            if await hub.server(user) is None:  # ask again, waiting in line
                r = await hub.api(
                    "POST", f"/users/{user}/server", json={"profile": "gpu", "wait": True}
                )
                if r.status_code not in (201, 202, 400):
                    out["refused"].append(r.text[:200])
                    await asyncio.sleep(1)
                    continue
            await wait_server(hub, user, end)
        if time.monotonic() >= end:
            out["unstarted"].append(end - want)
            return
        out["waits"].append(time.monotonic() - want)
        uuid = gpu_of(hub, client, user)
        node.set(uuid, 100)
        ran = min(burst, end - time.monotonic())
        await asyncio.sleep(max(ran, 0))
        node.set(uuid, 0)
        out["busy"] += max(ran, 0)
        out["done"] += ran >= burst


async def member_jobs(hub, user, token, steps, end, out) -> None:
    """(b): each burst a notebook job on the GPU profile, from the member's CPU server."""
    auth = {"Authorization": f"token {token}"}
    for think, burst in steps:
        await asyncio.sleep(max(0.0, min(think, end - time.monotonic())))
        if time.monotonic() >= end:
            return
        want, posted = time.monotonic(), time.time()
        r = await hub.client.post(
            "/hub/api/gpuhub/jobs",
            headers=auth,
            json={
                "input_uri": "burst.ipynb",
                "name": f"burst of {burst:.0f} s",
                "runtime_environment_name": "gpu",
                "parameters": {"seconds": f"{burst:.3f}"},
                "output_formats": ["ipynb"],
            },
        )
        if r.status_code != 201:
            out["refused"].append(r.text[:200])
            await asyncio.sleep(1)
            continue
        job = r.json()["job_id"]
        out["jobs"].append(job)
        out["created"][f"job-{job.replace('-', '')[:12]}"] = posted
        started = None
        while time.monotonic() < end:
            model = (await hub.client.get(f"/hub/api/gpuhub/jobs/{job}", headers=auth)).json()
            if started is None and model["status"] != "QUEUED":
                started = time.monotonic()
                out["waits"].append(started - want)
            if model["status"] in ("COMPLETED", "FAILED", "STOPPED"):
                if model["status"] == "COMPLETED":
                    out["done"] += 1
                    out["busy"] += burst
                else:
                    out["failed"].append(model.get("status_message", ""))
                break
            await asyncio.sleep(0.25)
        else:
            if started is not None:
                out["busy"] += min(burst, end - started)
            else:
                out["unstarted"].append(end - want)
            return


KERNELS = "/gpuhub/kernels"


def server_env(hub, client, user: str) -> dict[str, str]:
    """The environment of ``user``'s default server: its API token (what its provisioner
    asks the hub with) and where her workspace is mounted (``GPUHUB_WORKSPACE_MOUNT``)."""
    for c in hub.containers(client):
        labels = c["Labels"]
        if labels.get("io.gpuhub.user") == user and labels.get("io.gpuhub.server") == "":
            env = client.inspect_container(c["Id"])["Config"]["Env"]
            return dict(e.split("=", 1) for e in env)
    raise RuntimeError(f"{user} has no server container")


def connection_folder(home: Path, mount: str) -> str:
    """What the provisioner does first (gpuhub_kernels.transport.WorkspaceIPC): a folder of
    the member's, ``.gpuhub/kernels/<id>`` (0700, her uid), with the kernel's
    ``connection.json`` (0600: ipc sockets in the folder, as the containers see it under
    ``mount``, and the key); its path relative to her workspace."""
    kernels = home / ".gpuhub" / "kernels"
    folder = kernels / secrets.token_hex(8)
    folder.mkdir(parents=True, mode=0o700)
    relative = str(folder.relative_to(home))
    info = {
        "transport": "ipc",
        "ip": f"{mount.rstrip('/')}/{relative}/k",
        **{f"{n}_port": i for i, n in enumerate(("shell", "iopub", "stdin", "control", "hb"), 1)},
        "key": secrets.token_hex(16),
        "signature_scheme": "hmac-sha256",
        "kernel_name": "gpuhub-gpu",
    }
    (folder / "connection.json").write_text(json.dumps(info))
    (folder / "connection.json").chmod(0o600)
    for path in (home / ".gpuhub", kernels, folder, folder / "connection.json"):
        os.chown(path, 1000, 100)
    return relative


async def start_kernel(hub, home: Path, server: dict[str, str]) -> str:
    """A GPU kernel of the member whose server's environment is ``server``, waiting in line
    for its GPU when none is free: the hub's kernel id."""
    r = await hub.api(
        "POST",
        KERNELS,
        server["JUPYTERHUB_API_TOKEN"],
        json={
            "profile": "gpu",
            "notebook": "burst.ipynb",
            "cwd": "",
            "connection_dir": connection_folder(home, server["GPUHUB_WORKSPACE_MOUNT"]),
        },
    )
    if r.status_code != 201:
        raise RuntimeError(f"kernel refused: {r.status_code} {r.text[:200]}")
    return r.json()["id"]


async def kernel_model(hub, token: str, kernel: str) -> dict:
    """The hub's model of the kernel (``state``, ``gpus``, ``ended``); ended when forgotten."""
    r = await hub.api("GET", f"{KERNELS}/{kernel}", token)
    if r.status_code != 200:  # 404: forgotten; 403: her server (and its token) gone
        return {"state": "ended", "ended": {"reason": f"HTTP {r.status_code}", "message": r.text}}
    return r.json()


async def kernel_ready(hub, token: str, kernel: str, until: float) -> dict | None:
    """Until the kernel runs (its model), or it ended or ``until`` passed (None)."""
    while time.monotonic() < until:
        model = await kernel_model(hub, token, kernel)
        if model["state"] == "running":
            return model
        if model["state"] == "ended":
            return None
        await asyncio.sleep(0.25)
    return None


async def member_kernels(hub, node, home, server, steps, end, out) -> None:
    """(c): bursts in a GPU kernel of her CPU server, kept while she thinks until the
    keeper ends it (idle, or idle while others wait); a new kernel (in line) when a burst
    finds none.  A burst whose kernel the keeper ended as it began runs again in a new
    one."""
    kernel, token = None, server["JUPYTERHUB_API_TOKEN"]
    for think, burst in steps:
        await asyncio.sleep(max(0.0, min(think, end - time.monotonic())))
        if time.monotonic() >= end:
            break
        want, waited = time.monotonic(), False
        while True:
            if time.monotonic() >= end:
                if not waited:
                    out["unstarted"].append(end - want)
                break
            if kernel is not None:
                model = await kernel_model(hub, token, kernel)
                if model["state"] == "ended":  # the keeper ended it: why
                    reason = (model.get("ended") or {}).get("reason", "?")
                    out["found_ended"][reason] = out["found_ended"].get(reason, 0) + 1
                    kernel = None
            if kernel is None:
                try:
                    kernel = await start_kernel(hub, home, server)
                except RuntimeError as e:
                    out["refused"].append(str(e))
                    await asyncio.sleep(1)
                    continue
                out["kernels"] += 1
                out["kernel_ids"].append(kernel)
            model = await kernel_ready(hub, token, kernel, end)
            if model is None:
                continue  # it ended before it ran, or the span did
            started = time.monotonic()
            if not waited:
                out["waits"].append(started - want)
                waited = True
            uuids = model.get("gpus") or []
            for uuid in uuids:
                node.set(uuid, 100)
            ran, last_look = 0.0, started
            while ran < burst and time.monotonic() < end:
                await asyncio.sleep(max(0.0, min(0.5, burst - ran, end - time.monotonic())))
                ran = time.monotonic() - started
                if ran < burst and time.monotonic() - last_look >= 1:
                    last_look = time.monotonic()
                    if (await kernel_model(hub, token, kernel))["state"] != "running":
                        break  # the keeper ended it as the cell began
            for uuid in uuids:
                node.set(uuid, 0)
            out["busy"] += min(ran, burst)
            if ran >= burst:
                out["done"] += 1
                break
            if time.monotonic() >= end:
                break
            out["interrupted"] += 1
    out["live_kernel"] = kernel


def hub_kernels_live(hub_db: Path) -> int:
    """GPU kernels waiting or running, in the hub's ``gpuhub_kernels``."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(hub_db)) as db:
        return db.execute(
            "SELECT count(*) FROM gpuhub_kernels WHERE state IN ('waiting', 'running')"
        ).fetchone()[0]


def kernel_ends(hub_db: Path) -> dict[str, int]:
    """How the GPU kernels ended, by the hub's own record of each (``gpuhub_kernels``:
    its end reason); the shutdowns that settle the span's end included."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(hub_db)) as db:
        rows = db.execute(
            "SELECT reason, count(*) FROM gpuhub_kernels WHERE state = 'ended' GROUP BY reason"
        ).fetchall()
    return dict(rows)


def handoffs(events: list[dict], created: dict[str, float]) -> list[float]:
    """Seconds from a job container's ``die`` to the ``start`` of the next job container
    whose job was already waiting then (created before the ``die``): a GPU handed from a
    finished job to the head of the line."""
    jobs = [e for e in events if e["Actor"]["Attributes"].get("io.gpuhub.server") in created]
    out = []
    for i, e in enumerate(jobs):
        if e["status"] != "die":
            continue
        died = e["timeNano"] / 1e9
        nxt = next(
            (
                f
                for f in jobs[i + 1 :]
                if f["status"] == "start"
                and created[f["Actor"]["Attributes"]["io.gpuhub.server"]] < died
            ),
            None,
        )
        if nxt is not None:
            out.append(nxt["timeNano"] / 1e9 - died)
    return out


async def run_mode(
    mode: str, args, plan: dict, tmp: Path, kernel_idle: float = 0, contended: float = 0
) -> dict:
    """One run of ``mode`` ("servers", "jobs" or "kernels"; ``kernel_idle`` and
    ``contended``: the GPU kernels' idle and contended idle time-outs in class minutes)
    on ``plan``: the figures :func:`report` prints."""
    import docker

    from tests.fixtures.credits import running_credits_service
    from tests.fixtures.hub import NOTEBOOK_IMAGE, Hub
    from tests.fixtures.nvml import SONAME, SOURCE, NVMLNode
    from tests.fixtures.oidc import running_provider

    lib = tmp / "nvml"
    lib.mkdir()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O2", f"-Wl,-soname,{SONAME}", "-o", str(lib / SONAME),
         str(SOURCE), "-lpthread"],
        check=True,
    )  # fmt: skip
    nvml = NVMLNode(tmp / "node.json", lib)
    node = Node(nvml, args.gpus)
    profiles = tmp / "profiles.json"
    listed = KERNEL_PROFILES if mode == "kernels" else PROFILES
    profiles.write_text(
        json.dumps([{**p, "spawner_override": {"image": NOTEBOOK_IMAGE}} for p in listed])
    )
    homes = tmp / "homes"
    kernels_env, kernels_config = {}, ""
    if mode == "kernels":  # (c): workspaces on the host (the kernel's connection folder
        # is in hers), and the GPU kernels' time-outs scaled like the others
        homes.mkdir()
        for u in plan:
            (homes / u).mkdir(mode=0o700)
            os.chown(homes / u, 1000, 100)
        kernels_env = {
            "GPUHUB_WORKSPACE": str(homes / "{username}"),
            "GPUHUB_WORKSPACE_ROOT": str(homes),
            "GPUHUB_KERNEL_IDLE_TIMEOUT": str(int(kernel_idle * 60 / args.scale)),
            "GPUHUB_KERNEL_CONTENDED_IDLE_TIMEOUT": str(int(contended * 60 / args.scale)),
        }
        kernels_config = f"c.Kernels.check_interval = {5 / args.scale:.3f}\n"
    client = docker.APIClient(timeout=120)
    with contextlib.ExitStack() as stack:
        oidc = stack.enter_context(running_provider(tmp / "oidc.log"))
        credits = stack.enter_context(
            running_credits_service(f"sqlite:///{tmp / 'credits.sqlite'}", tmp / "credits")
        )
        hub = Hub(
            tmp,
            {
                "GPUHUB_GPUS": "nvml",
                **nvml.env,
                "GPUHUB_PROFILES": str(profiles),
                "GPUHUB_CREDITS_URL": credits.url,
                "GPUHUB_CREDITS_TOKEN": credits.hub_token,
                "GPUHUB_GPU_IDLE_TIMEOUT": str(int(1800 / args.scale)),
                "GPUHUB_CULL_IDLE_TIMEOUT": str(int(3600 / args.scale)),
                "GPUHUB_LINE_MAX_WAIT": str(int(3600 / args.scale)),
                "GPUHUB_CONCURRENT_SPAWN_LIMIT": "0",
                "GPUHUB_ACTIVE_SERVER_LIMIT": "0",
                "GPUHUB_JOBS_PER_USER": "4",
                **kernels_env,
            },
            extra_config="c.JupyterHub.log_level = 'INFO'\n"
            "c.GPUPool.refresh_interval = 0.5\nc.Culler.check_interval = 1\n" + kernels_config,
            oidc=oidc,
        )
        admin = credits.client(admin=True)
        events: list[dict] = []
        stop_events = threading.Event()
        try:
            await hub.start()
            tokens = {u: await hub.create_user(u) for u in plan}
            for u in plan:
                await admin.grant(u, "100.00", key=f"class-day-{u}-{time.time()}")
            if mode in ("jobs", "kernels"):
                await asyncio.gather(*(hub.spawn(u, {"profile": "cpu"}) for u in plan))
                for u in plan:
                    await hub.wait_ready(u, timeout=300)
            if mode == "kernels":
                servers = {u: server_env(hub, client, u) for u in plan}
                tokens = {u: servers[u]["JUPYTERHUB_API_TOKEN"] for u in plan}  # their servers'
            if mode == "jobs":
                for u in plan:
                    r = await hub.client.put(
                        f"/user/{u}/api/contents/work/burst.ipynb",
                        headers={"Authorization": f"token {tokens[u]}"},
                        json={"type": "notebook", "format": "json", "content": BURST_NOTEBOOK},
                    )
                    assert r.status_code in (200, 201), r.text

                def watch():
                    since = time.time()
                    for e in client.events(
                        since=since,
                        decode=True,
                        filters={"type": "container", "label": f"io.gpuhub.hub={hub.id}"},
                    ):
                        if e.get("status") in ("die", "start"):
                            events.append(e)
                        if stop_events.is_set():
                            return

                threading.Thread(target=watch, daemon=True).start()
            end = time.monotonic() + args.span
            sampler = Sampler(hub, client, end)
            sampler.thread.start()
            outs = {
                u: {
                    "waits": [],
                    "busy": 0.0,
                    "done": 0,
                    "jobs": [],
                    "refused": [],
                    "failed": [],
                    "created": {},
                    "unstarted": [],
                    "kernels": 0,
                    "kernel_ids": [],
                    "found_ended": {},
                    "live_kernel": None,
                    "interrupted": 0,
                }
                for u in plan
            }
            if mode == "servers":
                tasks = [
                    member_servers(hub, client, node, u, tokens[u], plan[u], end, outs[u])
                    for u in plan
                ]
            elif mode == "kernels":
                tasks = [
                    member_kernels(hub, node, homes / u, servers[u], plan[u], end, outs[u])
                    for u in plan
                ]
            else:
                tasks = [member_jobs(hub, u, tokens[u], plan[u], end, outs[u]) for u in plan]
            await asyncio.gather(*tasks)
            sampler.stop.set()
            sampler.thread.join()
            stop_events.set()
            for u in plan:  # settle: stop what is left, then read the balances
                for job in outs[u]["jobs"]:
                    await hub.client.post(
                        f"/hub/api/gpuhub/jobs/{job}/stop",
                        headers={"Authorization": f"token {tokens[u]}"},
                    )
                if outs[u]["live_kernel"]:  # her kernel shut down, as JupyterLab does
                    await hub.api("DELETE", f"{KERNELS}/{outs[u]['live_kernel']}", tokens[u])
                model = (await hub.api("GET", f"/users/{u}")).json()
                for name in sorted(model["servers"], reverse=True):  # kernels, then ""
                    with contextlib.suppress(Exception):
                        await hub.stop_server(u, name, timeout=120)
            await asyncio.sleep(3)
            if mode == "kernels":  # every kernel ended (and its record written)
                for _ in range(120):
                    if not hub_kernels_live(hub.state_dir / "jupyterhub.sqlite"):
                        break
                    await asyncio.sleep(0.5)
            charged = [100 - float((await admin.balance(u)).balance) for u in plan]
            ended = kernel_ends(hub.state_dir / "jupyterhub.sqlite") if mode == "kernels" else {}
        finally:
            await hub.close(client)
            await admin.aclose()
    waits = [w for o in outs.values() for w in o["waits"]]
    return {
        "held": sampler.held,
        "most": sampler.most,
        "double": sampler.double,
        "busy": sum(o["busy"] for o in outs.values()),
        "done": sum(o["done"] for o in outs.values()),
        "wait_p50": statistics.median(waits) if waits else float("nan"),
        "wait_p90": percentile(waits, 0.9),
        "unstarted": [w for o in outs.values() for w in o["unstarted"]],
        "charged": charged,
        "refused": [t for o in outs.values() for t in o["refused"]],
        "failed": [t for o in outs.values() for t in o["failed"]],
        "handoffs": handoffs(
            events, {k: v for o in outs.values() for k, v in o["created"].items()}
        ),
        **{k: sum(o[k] for o in outs.values()) for k in ("kernels", "interrupted")},
        "found_ended": {
            r: sum(o["found_ended"].get(r, 0) for o in outs.values())
            for r in sorted({r for o in outs.values() for r in o["found_ended"]})
        },
        "kernel_ends": ended,
    }


def report(mode: str, r: dict) -> None:
    util = r["busy"] / r["held"] if r["held"] else float("nan")
    print(f"\n== {mode}")
    print(f"GPU-seconds held      {r['held']:9.1f}")
    print(f"GPU-seconds busy      {r['busy']:9.1f}   utilisation {util:.2f}")
    print(f"GPUs held at once     at most {r['most']}, double-booked {r['double']}")
    print(f"bursts completed      {r['done']:9d}")
    print(f"wait to start, s      median {r['wait_p50']:.1f}   p90 {r['wait_p90']:.1f}")
    if r["unstarted"]:
        u = r["unstarted"]
        print(
            f"bursts never started  {len(u)}, each waited {min(u):.0f}-{max(u):.0f} s "
            "until the span ended (not in the wait figures)"
        )
    c = r["charged"]
    print(
        f"credits per member    mean {statistics.mean(c):.2f}   min {min(c):.2f}   max {max(c):.2f}"
    )
    if r["handoffs"]:
        h = r["handoffs"]
        print(
            f"hand-off die->start   median {statistics.median(h):.2f} s   p90 "
            f"{percentile(h, 0.9):.2f} s   ({len(h)} hand-offs)"
        )
    if r["kernels"]:
        print(
            f"GPU kernels asked for {r['kernels']}; found ended at a burst, by reason: "
            f"{r['found_ended']}; bursts run again (ended as they began) {r['interrupted']}"
        )
        print(f"GPU kernels' ends     {r['kernel_ends']} (the hub's, the span's end included)")
    for what in ("refused", "failed"):
        if r[what]:
            print(f"{what}: {len(r[what])}, first: {r[what][0]}")


def table(results: list[tuple[str, dict]]) -> None:
    """The runs side by side, as docs/benchmarks.md shows them, with the targets of (c) at
    the default time-out against (a)."""
    rows = [
        ("GPU-seconds held", lambda r: f"{r['held']:.1f}"),
        ("GPU-seconds busy", lambda r: f"{r['busy']:.1f}"),
        ("utilisation (busy/held)", lambda r: f"{r['busy'] / r['held']:.2f}" if r["held"] else "-"),
        ("bursts completed", lambda r: str(r["done"])),
        ("wait to start, median / p90", lambda r: f"{r['wait_p50']:.1f} / {r['wait_p90']:.1f} s"),
        ("bursts never started", lambda r: str(len(r["unstarted"]))),
        ("GPUs held at once / double-booked", lambda r: f"{r['most']} / {r['double']}"),
        ("GPU kernels asked for", lambda r: str(r["kernels"]) if r["kernels"] else ""),
        (
            "GPU kernels ended: idle / idle while others waited",
            lambda r: (
                f"{r['kernel_ends'].get('idle', 0)} / {r['kernel_ends'].get('idle_contended', 0)}"
                if r["kernels"]
                else ""
            ),
        ),
    ]
    print("\n| | " + " | ".join(name for name, _ in results) + " |")
    print("|---|" + "---|" * len(results))
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(r) for _, r in results) + " |")
    found = dict(results)
    a, c = found.get("(a) GPU servers"), found.get(f"(c) kernels, {KERNEL_IDLE_DEFAULT} min")
    if a and c and a["held"] and c["held"]:
        ratio = c["done"] / a["done"] if a["done"] else float("inf")
        gain = c["busy"] / c["held"] - a["busy"] / a["held"]
        print(
            f"\n(c) at {KERNEL_IDLE_DEFAULT} min against (a): bursts completed x{ratio:.2f} "
            f"(target >= 1.5), utilisation {gain:+.2f} (target >= +0.15)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=12)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--span", type=float, default=300, help="seconds of each run")
    parser.add_argument("--scale", type=float, default=18, help="class seconds per second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--modes", default="servers,jobs,kernels")
    parser.add_argument(
        "--kernel-contended",
        type=float,
        default=KERNEL_CONTENDED_DEFAULT,
        help="the GPU kernels' contended idle time-out, class minutes (0: off)",
    )
    parser.add_argument(
        "--kernel-idle",
        default=f"5,10,{KERNEL_IDLE_DEFAULT}",
        help="the GPU kernels' idle time-outs to run (c) with, class minutes",
    )
    args = parser.parse_args()
    plan = demand(args.members, args.span, args.scale, args.seed)
    want = sum(b for steps in plan.values() for _, b in steps)
    print(
        f"{args.members} members, {args.gpus} GPUs, {args.span:.0f} s "
        f"(x{args.scale:g}: {args.span * args.scale / 60:.0f} class minutes), "
        f"{sum(map(len, plan.values()))} bursts planned, {want:.0f} GPU-seconds wanted"
    )
    if "kernels" in args.modes:
        print(
            f"(c): the GPU kernels' idle time-outs {args.kernel_idle} class min, the contended "
            f"one {args.kernel_contended:g} class min (0: off), divided by {args.scale:g}"
        )
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    names = {"servers": "(a) GPU servers", "jobs": "(b) jobs"}
    runs = []
    for mode in args.modes.split(","):
        idles = [float(m) for m in args.kernel_idle.split(",")] if mode == "kernels" else [0]
        for idle in idles:
            name = names.get(mode) or f"(c) kernels, {idle:g} min"
            with tempfile.TemporaryDirectory() as tmp:
                result = asyncio.run(
                    run_mode(
                        mode,
                        args,
                        plan,
                        Path(tmp),
                        kernel_idle=idle,
                        contended=args.kernel_contended,
                    )
                )
            report(name, result)
            print(f"load average after it: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
            runs.append((name, result))
    table(runs)


if __name__ == "__main__":
    main()
