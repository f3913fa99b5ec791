"""A class day through the real hub: interactive GPU servers against CPU servers plus GPU
notebook jobs, on the same demand.

    .venv/bin/python benchmarks/class_day.py [--members 12] [--gpus 2] [--span 300]
                                             [--scale 18] [--seed 7]
                                             [--modes servers,jobs,kernels]
                                             [--kernel-idle 5,10,15]

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
  starts one, waiting in the same line; the kernel keeps its GPU between bursts until it has
  been idle for the GPU kernels' idle time-out (``--kernel-idle``, class minutes, divided by
  ``--scale`` like the other time-outs; one run per value, 15 the default).  A GPU kernel is
  what the hub runs it as (issue 29): a named server ``kernel-<12 hex>``
  of the member on a GPU profile, started with ``wait``; here the member starts that named
  server herself through JupyterHub's REST API (:func:`start_kernel`) and the GPU-idle
  culler enforces the kernel's time-out (the profile's ``gpu_idle_timeout``): in this
  benchmark a kernel is busy exactly while its GPU is, so "idle" is the same either way.
  The hub's kernels API (``POST /hub/api/gpuhub/kernels``) replaces :func:`start_kernel`
  once it is in.

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
#: What (c)'s GPU kernel's container runs until the kernels API is in: what gpuhub-kernel
#: does before the hub sees it ready (Python starts, ipykernel is imported, the server
#: port answers), not a whole Jupyter server.
KERNEL_STANDIN = """
import http.server, os, sys, urllib.parse
import ipykernel.kernelapp  # noqa: F401 - the kernel's own start-up
arg = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
url = urllib.parse.urlsplit(os.environ["JUPYTERHUB_SERVICE_URL"])
class Up(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
address = (arg.get("ip") or url.hostname or "127.0.0.1", int(arg.get("port") or url.port))
http.server.ThreadingHTTPServer(address, Up).serve_forever()
"""
#: (c)'s GPU kernels: the GPU profile, with the kernels' idle time-out (``gpu_idle_timeout``,
#: seconds, set per run) and, like the hub's GPU kernels, no idle culling by the browser's
#: activity (nobody browses a kernel's server)
KERNEL_PROFILE = {"display_name": "PyTorch kernel", "slug": "gpu-kernel", "gpus": 1,
                  "credits_per_hour": 1, "cull_idle_timeout": 0}  # fmt: skip
#: the GPU kernels' idle time-out, class minutes, when none is given (issue 29's default)
KERNEL_IDLE_DEFAULT = 15

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


async def start_kernel(hub, user: str) -> str:
    """A GPU kernel of ``user``'s, waiting in line for its GPU: its server name.  Until
    the kernels API is in, the named server the hub would make for it (module doc)."""
    name = f"kernel-{secrets.token_hex(6)}"
    r = await hub.spawn(user, {"profile": KERNEL_PROFILE["slug"], "wait": True}, server=name)
    if r.status_code not in (201, 202):
        raise RuntimeError(f"kernel refused: {r.status_code} {r.text[:200]}")
    return name


async def kernel_ready(hub, user: str, kernel: str, until: float) -> bool:
    """Until ``user``'s kernel answers (True), or it ended or ``until`` passed (False)."""
    while time.monotonic() < until:
        server = await hub.server(user, kernel)
        if server is None:
            return False
        if server.get("ready"):
            return True
        await asyncio.sleep(0.25)
    return False


async def member_kernels(hub, client, node, user, steps, end, out) -> None:
    """(c): bursts in a GPU kernel of her CPU server, kept while she thinks until the
    kernels' idle time-out ends it; a new kernel (in line) when a burst finds none.  A
    burst whose kernel the time-out ended as it began runs again in a new one."""
    kernel, answered = None, False
    for think, burst in steps:
        await asyncio.sleep(max(0.0, min(think, end - time.monotonic())))
        if time.monotonic() >= end:
            return
        want, waited = time.monotonic(), False
        while True:
            if time.monotonic() >= end:
                if not waited:
                    out["unstarted"].append(end - want)
                return
            if kernel is None or await hub.server(user, kernel) is None:
                if kernel is not None:  # gone: forget it
                    # it had answered: its idle time-out ended it; else its place in line
                    # expired (GPUHUB_LINE_MAX_WAIT)
                    out["kernels_idle" if answered else "kernels_expired"] += 1
                    await hub.api(
                        "DELETE", f"/users/{user}/servers/{kernel}", json={"remove": True}
                    )
                kernel, answered = await start_kernel(hub, user), False
                out["kernels"] += 1
            if not await kernel_ready(hub, user, kernel, end):
                continue  # it ended before it answered, or the span did
            answered = True
            started = time.monotonic()
            if not waited:
                out["waits"].append(started - want)
                waited = True
            uuid = gpu_of(hub, client, user, kernel)
            node.set(uuid, 100)
            ran = 0.0
            while ran < burst and time.monotonic() < end:
                await asyncio.sleep(max(0.0, min(0.5, burst - ran, end - time.monotonic())))
                ran = time.monotonic() - started
                if ran < burst and not await hub.running(user, kernel):
                    break  # the time-out ended it as the cell began
            node.set(uuid, 0)
            out["busy"] += min(ran, burst)
            if ran >= burst:
                out["done"] += 1
                break
            if time.monotonic() >= end:
                return
            out["interrupted"] += 1


def kernel_ends(hub_db: Path) -> dict[str, int]:
    """How the GPU kernels' servers ended, by the run records' stop reason (the hub's own
    table, ``gpuhub_server_runs``); the stops that settle the span's end included."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(hub_db)) as db:
        rows = db.execute(
            "SELECT stop_reason, count(*) FROM gpuhub_server_runs "
            "WHERE server_name LIKE 'kernel-%' AND stop_reason IS NOT NULL GROUP BY stop_reason"
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


async def run_mode(mode: str, args, plan: dict, tmp: Path, kernel_idle: float = 0) -> dict:
    """One run of ``mode`` ("servers", "jobs" or "kernels"; ``kernel_idle``: the GPU
    kernels' idle time-out in class minutes) on ``plan``: the figures :func:`report`
    prints."""
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
    kernel = {**KERNEL_PROFILE, "gpu_idle_timeout": int(kernel_idle * 60 / args.scale)}
    listed = [{**p, "spawner_override": {"image": NOTEBOOK_IMAGE}} for p in PROFILES]
    command = ["python3", "-c", KERNEL_STANDIN]
    kernel["spawner_override"] = {"image": NOTEBOOK_IMAGE, "cmd": command}
    profiles.write_text(json.dumps([*listed, kernel]))
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
                "GPUHUB_NAMED_SERVER_LIMIT": "0",  # (c): a kernel is a named server
            },
            extra_config="c.JupyterHub.log_level = 'INFO'\n"
            "c.GPUPool.refresh_interval = 0.5\nc.Culler.check_interval = 1\n",
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
                    "kernels_idle": 0,
                    "kernels_expired": 0,
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
                tasks = [member_kernels(hub, client, node, u, plan[u], end, outs[u]) for u in plan]
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
                model = (await hub.api("GET", f"/users/{u}")).json()
                for name in sorted(model["servers"], reverse=True):  # kernels, then ""
                    with contextlib.suppress(Exception):
                        await hub.stop_server(u, name, timeout=120)
            await asyncio.sleep(3)
            charged = [100 - float((await admin.balance(u)).balance) for u in plan]
            ended = kernel_ends(hub.state_dir / "jupyterhub.sqlite")
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
        **{
            k: sum(o[k] for o in outs.values())
            for k in ("kernels", "kernels_idle", "kernels_expired", "interrupted")
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
            f"GPU kernels asked for {r['kernels']}; found gone at a burst: ended by the idle "
            f"time-out {r['kernels_idle']}, place in line expired {r['kernels_expired']}; "
            f"bursts run again (ended as they began) {r['interrupted']}"
        )
        print(f"GPU kernels' ends     {r['kernel_ends']} (run records, the span's end included)")
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
    names = {"servers": "(a) GPU servers", "jobs": "(b) jobs"}
    runs = []
    for mode in args.modes.split(","):
        idles = [float(m) for m in args.kernel_idle.split(",")] if mode == "kernels" else [0]
        for idle in idles:
            name = names.get(mode) or f"(c) kernels, {idle:g} min"
            with tempfile.TemporaryDirectory() as tmp:
                result = asyncio.run(run_mode(mode, args, plan, Path(tmp), kernel_idle=idle))
            report(name, result)
            runs.append((name, result))
    table(runs)


if __name__ == "__main__":
    main()
