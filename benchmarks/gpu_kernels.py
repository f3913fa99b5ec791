"""GPU kernels: how soon a notebook's GPU kernel answers, and how soon a freed GPU reaches the
next waiting kernel.

    .venv/bin/python benchmarks/gpu_kernels.py [--runs 7] [--image gpuhub/base:latest]
                                               [--credits | --no-credits]

A real hub (GPUHUB_GPUS=simulated:1: one GPU, whose container gets the hook stand-in's
``NVIDIA_VISIBLE_DEVICES``), its proxy, Docker, the image's provisioner and
``gpuhub-kernel``, and by default the reference credits service (the kernel's first
interval debited and refunded, as deployed).  Two members each have a server on the CPU
profile.  Kernels are started as JupyterLab starts them: a notebook session through the
member's server (``POST /user/<name>/api/sessions``), its first cell through the kernel's
websocket once the kernel answers ``kernel_info``.

- **kernel start**: from the session request (choosing the kernel) until the first cell's
  output arrives, with the GPU free; against a local CPU kernel ("Python 3") started the
  same way in the same server, interleaved round by round. Target: GPU within 1.5 s of
  the local kernel (median).
- **hand-off**: one member's GPU kernel runs, the other's waits in line with a cell
  already sent; from the first member's shutdown (``DELETE`` of her session) until the
  waiting kernel's cell answers. Target: median <= 1 s.

Prints each run, the medians, the targets, and the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.spawn_latency import _docker_time  # noqa: E402
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.kernels import run_code  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 1, "kernels": True},
]
CELL = "print('answered')"


class Member:
    def __init__(self, hub: Hub, name: str, token: str):
        self.hub, self.name = hub, name
        self.headers = {"Authorization": f"token {token}"}
        self.ws_base = hub.url.replace("http://", "ws://", 1) + f"/user/{name}"

    async def open(self, spec: str, path: str) -> tuple[str, str]:
        """A notebook session with kernel ``spec``: (session id, kernel id)."""
        r = await self.hub.client.post(
            f"/user/{self.name}/api/sessions",
            headers=self.headers,
            json={"path": path, "type": "notebook", "name": path, "kernel": {"name": spec}},
            timeout=120,
        )
        assert r.status_code == 201, r.text
        return r.json()["id"], r.json()["kernel"]["id"]

    async def close(self, session: str) -> None:
        r = await self.hub.client.delete(
            f"/user/{self.name}/api/sessions/{session}", headers=self.headers, timeout=120
        )
        assert r.status_code == 204, r.text

    async def answer(self, kernel: str) -> float:
        """Run the first cell; the time its output arrived (perf_counter)."""
        out = await run_code(self.ws_base, self.headers, kernel, CELL, timeout=300)
        assert "answered" in out, out
        return time.perf_counter()

    async def start(self, spec: str, path: str, parts: list | None = None) -> float:
        """Seconds from choosing ``spec`` for a notebook to its first cell's answer;
        ``parts`` gets where a GPU kernel's went (:func:`breakdown`)."""
        tic, wall = time.perf_counter(), time.time()
        session, kernel = await self.open(spec, path)
        opened = time.perf_counter()
        done = await self.answer(kernel)
        if parts is not None:
            parts.append(breakdown(self.hub, wall, opened - tic, done - tic))
        await self.close(session)
        return done - tic


def breakdown(hub: Hub, requested: float, opened: float, total: float) -> dict:
    """Where a GPU kernel's start went, from Docker's timestamps of its container:
    ``session``: the session request answered (the provisioner asked the hub);
    ``hub``: request to ``docker create`` (the hub's start: checks, GPU, debit);
    ``docker``: create to started; ``kernel``: started until the first cell answered
    (gpuhub-kernel and ipykernel's start-up, the channels connecting)."""
    client = docker.APIClient()
    [container] = client.containers(
        filters={"label": [f"io.gpuhub.hub={hub.id}", "io.gpuhub.kernel"]}
    )
    info = client.inspect_container(container["Id"])
    created, started = _docker_time(info["Created"]), _docker_time(info["State"]["StartedAt"])
    return {
        "session": opened,
        "hub": created - requested,
        "docker": started - created,
        "kernel": requested + total - started,
    }


async def gpu_free(hub: Hub) -> None:
    """Wait until the hub has no GPU kernel waiting or running (the GPU back)."""
    token = (hub.state_dir / "gpuhub-cli-token").read_text().strip()
    while True:
        board = (await hub.api("GET", "/gpuhub/gpus", token)).json()
        if not board["kernels"] and board["summary"]["free"] == board["summary"]["total"]:
            return
        await asyncio.sleep(0.05)


def hub_time(hub: Hub, words: str, after: float) -> float | None:
    """When the hub's log (UTC, to the millisecond) first says ``words`` after ``after``
    (seconds since the epoch)."""
    for line in hub.log().splitlines():
        if words in line and line.startswith("[I "):
            stamp = datetime.strptime(line[3:26], "%Y-%m-%d %H:%M:%S.%f")
            seconds = stamp.replace(tzinfo=UTC).timestamp()
            if seconds >= after:
                return seconds
    return None


async def hand_off(hub: Hub, first: Member, second: Member, parts: list) -> float:
    """``first``'s GPU kernel runs, ``second``'s waits with a cell sent: seconds from
    ``first``'s shutdown to ``second``'s cell answering; ``parts`` gets where they went
    (the hub's log and Docker's timestamps)."""
    session, kernel = await first.open("gpuhub-gpu", "first.ipynb")
    await first.answer(kernel)
    waiting_session, waiting = await second.open("gpuhub-gpu", "second.ipynb")
    answered = asyncio.ensure_future(second.answer(waiting))
    await asyncio.sleep(3)  # its cell is sent, the kernel waits in line
    assert not answered.done()
    tic, wall = time.perf_counter(), time.time()
    await first.close(session)
    seconds = await answered - tic
    released = hub_time(hub, "released GPU(s)", wall - 0.01) or wall
    client = docker.APIClient()
    [container] = client.containers(
        filters={
            "label": [
                f"io.gpuhub.hub={hub.id}",
                f"io.gpuhub.user={second.name}",
                "io.gpuhub.kernel",
            ]
        }
    )
    info = client.inspect_container(container["Id"])
    created, started = _docker_time(info["Created"]), _docker_time(info["State"]["StartedAt"])
    parts.append(
        {
            "release": released - wall,
            "start": created - released,
            "docker": started - created,
            "kernel": wall + seconds - started,
        }
    )
    await second.close(waiting_session)
    await gpu_free(hub)
    return seconds


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def main(runs: int, image: str, with_credits: bool) -> None:
    load_before = loadavg()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        oidc = stack.enter_context(running_provider(tmp / "oidc.log"))
        env = {}
        if with_credits:
            from tests.fixtures.credits import running_credits_service

            service = stack.enter_context(
                running_credits_service(f"sqlite:///{tmp / 'credits.sqlite'}", tmp / "credits")
            )
            env = {"GPUHUB_CREDITS_URL": service.url, "GPUHUB_CREDITS_TOKEN": service.hub_token}
        else:
            env = {"GPUHUB_CREDITS": "off"}
        homes = tmp / "homes"
        homes.mkdir()
        (tmp / "profiles.json").write_text(json.dumps(PROFILES))
        hub = Hub(
            tmp,
            {
                **env,
                "GPUHUB_PROFILES": str(tmp / "profiles.json"),
                "GPUHUB_GPUS": "simulated:1",
                "GPUHUB_WORKSPACE": str(homes / "{username}"),
                "GPUHUB_WORKSPACE_ROOT": str(homes),
                "GPUHUB_IMAGE": image,
            },
            extra_config="c.JupyterHub.log_level = 'INFO'\n",
            oidc=oidc,
        )
        await hub.start()
        try:
            members = []
            for name in ("ann", "ben"):
                (homes / name).mkdir()
                os.chown(homes / name, 1000, 100)
                token = await hub.create_user(name)
                if with_credits:
                    async with service.client(admin=True) as admin:
                        await admin.grant(name, "1000.00", key=f"bench-grant-{name}")
                r = await hub.spawn(name, {"profile": "cpu"})
                assert r.status_code in (201, 202), r.text
                await hub.wait_ready(name)
                members.append(Member(hub, name, token))
            ann, ben = members
            await ann.start("python3", "warm.ipynb")  # warm-up, not counted
            await ann.start("gpuhub-gpu", "warm.ipynb")
            await gpu_free(hub)
            local, gpu, parts = [], [], []
            for i in range(runs):
                order = ("python3", "gpuhub-gpu") if i % 2 else ("gpuhub-gpu", "python3")
                for spec in order:
                    where = parts if spec == "gpuhub-gpu" else None
                    seconds = await ann.start(spec, f"start-{i}.ipynb", where)
                    (local if spec == "python3" else gpu).append(seconds)
                await gpu_free(hub)
            handoffs, handoff_parts = [], []
            for i in range(runs):
                first, second = (ann, ben) if i % 2 == 0 else (ben, ann)
                handoffs.append(await hand_off(hub, first, second, handoff_parts))
        except BaseException:
            client = docker.APIClient()
            for c in hub.containers(client):
                logs = client.logs(c["Id"], tail=40).decode(errors="replace")
                print(f"--- {c['Names'][0]} ---\n{logs}", file=sys.stderr)
            print(f"--- hub ---\n{hub.log()[-4000:]}", file=sys.stderr)
            raise
        finally:
            await hub.close(docker.APIClient())
    print(
        f"load average before {load_before}, after {loadavg()} ({os.cpu_count()} cores); "
        f"{runs} runs each; image {image}; credits {'on' if with_credits else 'off'}"
    )
    med_local, med_gpu = statistics.median(local), statistics.median(gpu)
    print(f"local CPU kernel start: median {med_local:.3f} s  runs {[round(x, 3) for x in local]}")
    print(f"GPU kernel start:       median {med_gpu:.3f} s  runs {[round(x, 3) for x in gpu]}")
    gap = med_gpu - med_local
    print(f"  GPU - local: {gap:.3f} s (target <= 1.5 s: {'met' if gap <= 1.5 else 'NOT met'})")
    for part, what in (
        ("session", "the session answered (the provisioner asked the hub)"),
        ("hub", "request to docker create: the hub's start (checks, GPU, debit)"),
        ("docker", "docker create to started"),
        ("kernel", "started to the first answer: gpuhub-kernel, ipykernel, the channels"),
    ):
        print(f"    {part:<8}: median {statistics.median(x[part] for x in parts):.3f} s  ({what})")
    med = statistics.median(handoffs)
    print(
        f"hand-off, shutdown to the next kernel's answer: median {med:.3f} s, "
        f"max {max(handoffs):.3f} s  runs {[round(x, 3) for x in handoffs]} "
        f"(target median <= 1 s: {'met' if med <= 1.0 else 'NOT met'})"
    )
    for part, what in (
        ("release", "the shutdown until the hub released the GPU (docker stop)"),
        ("start", "the release until the next container is created (grant, debit)"),
        ("docker", "docker create to started"),
        ("kernel", "started to the cell's answer: gpuhub-kernel, ipykernel, the channels"),
    ):
        values = [x[part] for x in handoff_parts]
        print(f"    {part:<8}: median {statistics.median(values):.3f} s  ({what})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--image", default="gpuhub/base:latest")
    parser.add_argument("--credits", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.image, args.credits))
