"""Many servers on one hub: spawn-to-ready and the GPU refusal with 50 servers running,
against the same on an empty hub, memory per server and the hub's own CPU while idle.

    .venv/bin/python benchmarks/many_servers.py [--servers 50] [--runs 5]
                                                [--image gpuhub/base:latest]

One hub (``jupyterhub_config.py``, real proxy, real containers, credits off) on a simulated
node of one GPU, which a GPU server of member ``holder`` holds throughout, so that a GPU
start is refused ("No GPU free") in both phases:

1. empty hub (only the holder): ``--runs`` spawns of a CPU server until ready (the
   progress stream's ``ready``; the server is stopped after each) and ``--runs`` x 5 GPU
   refusals (POST until the 409);
2. ``--servers`` CPU servers started, five at a time, each until ready; then the memory of
   each container (Docker's stats, one shot: ``usage`` less ``total_inactive_file``, as
   ``docker stats`` computes it on cgroup v1) and the hub process's CPU while nothing
   happens (``utime + stime`` of ``/proc/<pid>/stat`` over ``--idle`` seconds), and the
   servers' own CPU meanwhile (their cgroups' ``cpuacct.usage``);
3. the same spawns (the 51st server) and refusals as in 1;
4. the servers stopped, the same again: the empty hub's figures are the medians of 1 and 4
   together, since the load of a shared machine drifts while the servers start.

Prints the medians and the ratios full/empty (target <= 1.2), and of each spawn the hub's
own work (``benchmarks/spawn_latency.breakdown``: the spawn less the container's time from
``docker create`` to its first answer), which tells the hub's share of a change from the
machine's (50 servers share its cores with the new one).  Before starting the
servers it checks, from the first five, that the rest fit in the machine's available
memory (``MemAvailable``) with 2 GiB to spare, and stops with the figures if not.

The hub's server limits would refuse the 22nd server here (``GPUHUB_ACTIVE_SERVER_LIMIT``
defaults to one server per GiB of memory, 21 on 24 GiB) and more than 20 starting at once
(``GPUHUB_CONCURRENT_SPAWN_LIMIT``): this benchmark sets the active limit to
``--servers`` + 10 and starts five at a time.  Every container the hub made is removed at
the end, also when the benchmark fails (``Hub.close``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.spawn_latency import hub_refusal, hub_spawn  # noqa: E402
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402

MIB = 1024**2
HEADROOM = 2 * 1024**3  # bytes of memory left free


def container_memory(client: docker.APIClient, container: str) -> int:
    """Bytes of memory a container uses, as ``docker stats`` shows it (cgroup v1)."""
    stats = client.stats(container, stream=False, one_shot=True)["memory_stats"]
    return stats["usage"] - stats.get("stats", {}).get("total_inactive_file", 0)


def available_memory() -> int:
    """``MemAvailable`` of ``/proc/meminfo``, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_cpu(pid: int, seconds: float) -> float:
    """Share of one core that process ``pid`` used over ``seconds`` of waiting (0..1)."""
    before, tic = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - tic)


async def measure(hub: Hub, runs: int) -> dict:
    """Spawn-to-ready of a CPU server (``probe``), the hub's own part of it (see
    ``spawn_latency.breakdown``) and the GPU refusal (``refused``), in seconds."""
    spawns, parts = [], []
    for _ in range(runs):
        seconds, where = await hub_spawn(hub, "probe", "cpu")
        spawns.append(seconds)
        parts.append(where["hub"])
        await hub.stop_server("probe")
    refusals = [await hub_refusal(hub, "refused") for _ in range(runs * 5)]
    return {
        "spawn": statistics.median(spawns),
        "spawns": spawns,
        "hub": statistics.median(parts),
        "hubs": parts,
        "refusal": statistics.median(refusals),
        "refusals": refusals,
    }


def containers_cpu(ids: list[str]) -> float:
    """CPU seconds the containers ``ids`` used so far (cgroup v1 ``cpuacct.usage``)."""
    return (
        sum(int(Path(f"/sys/fs/cgroup/cpuacct/docker/{i}/cpuacct.usage").read_text()) for i in ids)
        / 1e9
    )


async def start_servers(hub: Hub, names: list[str], at_once: int = 5) -> None:
    for i in range(0, len(names), at_once):
        batch = names[i : i + at_once]
        answers = await asyncio.gather(*(hub.spawn(n, {"profile": "cpu"}) for n in batch))
        for name, r in zip(batch, answers, strict=True):
            assert r.status_code in (201, 202), (name, r.text)
        await asyncio.gather(*(hub.wait_ready(n, timeout=180) for n in batch))


async def main(servers: int, runs: int, image: str, idle: float) -> None:
    client = docker.APIClient(timeout=120)
    with tempfile.TemporaryDirectory() as tmp, running_provider(Path(tmp) / "oidc.log") as oidc:
        profiles = Path(tmp) / "profiles.json"
        profiles.write_text(
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
        hub = Hub(
            Path(tmp),
            {
                "GPUHUB_PROFILES": str(profiles),
                "GPUHUB_CREDITS": "off",
                "GPUHUB_GPUS": "simulated:1",
                "GPUHUB_ACTIVE_SERVER_LIMIT": str(servers + 10),
            },
            extra_config="c.JupyterHub.log_level = 'INFO'\n",
            oidc=oidc,
        )
        members = [f"m{i:03d}" for i in range(servers)]
        try:
            await hub.start()
            r = await hub.api(
                "POST", "/users", json={"usernames": ["holder", "probe", "refused", *members]}
            )
            assert r.status_code == 201, r.text
            r = await hub.spawn("holder", {"profile": "gpu"})
            assert r.status_code in (201, 202), r.text
            await hub.wait_ready("holder")
            await measure(hub, 1)  # warm-up, not counted
            before = await measure(hub, runs)

            await start_servers(hub, members[:5])
            first = [
                container_memory(client, c["Id"])
                for c in hub.containers(client)
                if c["Labels"].get("io.gpuhub.user") in members[:5]
            ]
            need = statistics.mean(first) * (servers - 5)
            if need + HEADROOM > available_memory():
                sys.exit(
                    f"{servers} servers do not fit: {statistics.mean(first) / MIB:.0f} MiB "
                    f"each, {available_memory() / MIB:.0f} MiB available"
                )
            await start_servers(hub, members[5:])
            running = [
                c for c in hub.containers(client) if c["Labels"].get("io.gpuhub.user") in members
            ]
            assert len(running) == servers, len(running)
            memory = [container_memory(client, c["Id"]) for c in running]
            ids = [c["Id"] for c in running]
            servers_cpu = containers_cpu(ids)
            hub_cpu = await idle_cpu(hub.proc.pid, idle)
            servers_cpu = (containers_cpu(ids) - servers_cpu) / idle
            full = await measure(hub, runs)
            for i in range(0, servers, 10):  # and empty again: the machine's load drifts
                await asyncio.gather(*(hub.stop_server(n) for n in members[i : i + 10]))
            again = await measure(hub, runs)
            empty = {
                key: statistics.median(before[key + "s"] + again[key + "s"])
                for key in ("spawn", "hub", "refusal")
            }
        finally:
            await hub.close(client)
    print(
        f"{servers} running CPU servers ({image}) on one hub; {runs} spawns and "
        f"{runs * 5} refusals per phase; load average "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}, {os.cpu_count()} cores"
    )
    for what, key, unit in (
        ("spawn-to-ready of a CPU server", "spawn", "s"),
        ("  of it the hub's own work", "hub", "s"),
        ("GPU refusal (POST until the 409)", "refusal", "ms"),
    ):
        scale = 1000 if unit == "ms" else 1
        ratio = full[key] / empty[key]
        print(
            f"  {what}: empty hub {empty[key] * scale:.3f} {unit} (before "
            f"{statistics.median(before[key + 's']) * scale:.3f}, after "
            f"{statistics.median(again[key + 's']) * scale:.3f}), with {servers} servers "
            f"{full[key] * scale:.3f} {unit}: {ratio:.2f}x (target <= 1.2: "
            f"{'met' if ratio <= 1.2 else 'NOT met'})"
        )
    print(
        f"  memory per server: median {statistics.median(memory) / MIB:.0f} MiB, "
        f"max {max(memory) / MIB:.0f} MiB, all {servers}: {sum(memory) / MIB:.0f} MiB"
    )
    print(
        f"  the hub's own CPU while idle with {servers} servers: {100 * hub_cpu:.1f}% of "
        f"one core over {idle:.0f} s; the {servers} servers together "
        f"{100 * servers_cpu:.1f}%"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", default="gpuhub/base:latest")
    parser.add_argument(
        "--idle", type=float, default=30.0, help="seconds over which the hub's idle CPU is measured"
    )
    args = parser.parse_args()
    asyncio.run(main(args.servers, args.runs, args.image, args.idle))
