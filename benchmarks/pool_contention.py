"""Pool contention: 200 concurrent spawn requests against 8 GPUs.

    .venv/bin/python benchmarks/pool_contention.py [--requests 200] [--gpus 8] [--nvml]
    .venv/bin/python benchmarks/pool_contention.py --driver   # on a machine with GPUs
    .venv/bin/python benchmarks/pool_contention.py --hub [--db sqlite|postgres|both]

Drives the spawner's reservation step (``GPUPool.allocate``) from 200 concurrent tasks on
one event loop, the way the hub runs concurrent spawns, and reports:

- how many got GPUs (must be exactly ``--gpus``) and whether any device was double-booked;
- refusal latency p50/p99: from the request to the refusal (target p99 < 50 ms);
- the longest event-loop stall while it ran, seen by a 1 ms ticker (target < 10 ms).

With ``--nvml`` the inventory is read through the real pynvml bindings from the NVML
stand-in (tests/nvml_standin, built with gcc), with a 2 s refresh interval as in the hub.
With ``--driver`` it is read from the machine's own NVIDIA driver (a GPU machine): the
GPUs are the driver's, and exactly its free ones (no compute process) must be granted.

With ``--hub`` the same rush goes through a real hub instead, on SQLite and on PostgreSQL
(``--db``): ``--requests`` concurrent ``POST /hub/api/users/<name>/server`` of a one-GPU
profile against a simulated node of ``--gpus`` GPUs (real proxy, real containers for the
winners, credits off), reporting the requests that got a server, double bookings (from the
containers' labels), and the HTTP latency of the refusals as a client sees it --
JupyterHub's own request handling included, which the pool-only figures leave out
(:mod:`benchmarks.hub_rush`; target p99 < 500 ms).
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def build_standin(out: Path) -> Path:
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wl,-soname,libnvidia-ml.so.1",
            "-o",
            str(out / "libnvidia-ml.so.1"),
            str(REPO / "tests" / "nvml_standin" / "libnvidia-ml.c"),
            "-lpthread",
        ],
        check=True,
    )
    return out


async def ticker(stalls: list[float], stop: asyncio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        stalls.append(now - last - 0.001)
        last = now


async def run(requests: int, gpus: int, inventory) -> dict:
    from hub_ext.docker.pool import AllocationRefused, GPUPool, ServerKey

    pool = GPUPool(inventory=inventory, refresh_interval=2.0)
    free = pool.summary(await pool.devices()).free  # the hub has read it before the rush
    pool._read_at = float("-inf")  # ...but the rush starts with a stale cache
    stalls: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.ensure_future(ticker(stalls, stop))
    await asyncio.sleep(0.01)
    refusals, granted = [], []

    async def spawn(i: int):
        tic = time.perf_counter()
        try:
            granted.append(await pool.allocate(ServerKey(f"user{i}"), 1))
        except AllocationRefused:
            refusals.append(time.perf_counter() - tic)

    await asyncio.gather(*(spawn(i) for i in range(requests)))
    stop.set()
    await tick
    uuids = [u for a in granted for u in a.uuids]
    refusals.sort()
    return {
        "free": free,
        "granted": len(granted),
        "double_booked": len(uuids) - len(set(uuids)),
        "refused": len(refusals),
        "refusal_p50_ms": 1000 * statistics.median(refusals),
        "refusal_p99_ms": 1000 * refusals[int(0.99 * (len(refusals) - 1))],
        "max_loop_stall_ms": 1000 * max(stalls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--nvml", action="store_true")
    parser.add_argument(
        "--driver",
        action="store_true",
        help="the machine's own NVIDIA driver instead of a simulated node",
    )
    parser.add_argument(
        "--hub",
        action="store_true",
        help="through a real hub and proxy (HTTP latency of the refusals)",
    )
    parser.add_argument(
        "--db",
        choices=("sqlite", "postgres", "both"),
        default="both",
        help="the hub's database with --hub",
    )
    parser.add_argument(
        "--limits",
        choices=("none", "default"),
        default="none",
        help="with --hub: the hub's server limits off, or its defaults",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="OUT",
        help="with --hub: py-spy samples of the hub during the rush, as "
        "collapsed stacks in OUT.sqlite.txt and OUT.postgres.txt",
    )
    args = parser.parse_args()
    if args.hub:
        from benchmarks.hub_rush import report, run_hub

        passed = True
        for db in ("sqlite", "postgres") if args.db == "both" else (args.db,):
            profile = args.profile and args.profile.with_suffix(f".{db}.txt")
            result = asyncio.run(run_hub(args.requests, args.gpus, db, args.limits, profile))
            passed &= report(result, args.requests, args.gpus, args.limits)
        if not passed:
            sys.exit("FAIL: wrong number of grants, a double booking or another answer")
        return
    doc = {
        "devices": [
            {"uuid": f"GPU-bench-{i:04d}", "memory_total_mib": 16384} for i in range(args.gpus)
        ]
    }
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node.json"
        node.write_text(json.dumps(doc))
        if args.nvml and "NVML_STANDIN_JSON" not in os.environ:
            # the stand-in must be on LD_LIBRARY_PATH when the process starts
            lib = build_standin(Path(tmp))
            env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "NVML_STANDIN_JSON": str(node)}
            sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)
        if args.nvml or args.driver:
            from hub_ext.docker.nvml import NVMLInventory

            inventory = NVMLInventory()
            label = (
                "this machine's NVIDIA driver via pynvml"
                if args.driver
                else "NVML stand-in via pynvml"
            )
        else:
            from hub_ext.docker.inventory import SimulatedInventory

            inventory, label = SimulatedInventory(path=str(node)), "simulated (JSON)"
        result = asyncio.run(run(args.requests, args.gpus, inventory))
    print(f"inventory            : {label}")
    print(f"requests / free GPUs : {args.requests} / {result['free']}")
    print(f"granted              : {result['granted']}  (double-booked: {result['double_booked']})")
    print(
        f"refusal latency      : p50 {result['refusal_p50_ms']:.2f} ms, "
        f"p99 {result['refusal_p99_ms']:.2f} ms  (target p99 < 50 ms)"
    )
    print(f"longest loop stall   : {result['max_loop_stall_ms']:.2f} ms  (target < 10 ms)")
    expected = result["free"] if args.driver else args.gpus
    if result["granted"] != expected or result["double_booked"]:
        sys.exit("FAIL: wrong number of grants or a double booking")


if __name__ == "__main__":
    main()
