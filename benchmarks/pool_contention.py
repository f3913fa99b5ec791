"""Pool contention: 200 concurrent spawn requests against 8 GPUs.

    .venv/bin/python benchmarks/pool_contention.py [--requests 200] [--gpus 8] [--nvml]

Drives the spawner's reservation step (``GPUPool.allocate``) from 200 concurrent tasks on
one event loop, the way the hub runs concurrent spawns, and reports:

- how many got GPUs (must be exactly ``--gpus``) and whether any device was double-booked;
- refusal latency p50/p99: from the request to the refusal (target p99 < 50 ms);
- the longest event-loop stall while it ran, seen by a 1 ms ticker (target < 10 ms).

With ``--nvml`` the inventory is read through the real pynvml bindings from the NVML
stand-in (tests/nvml_standin, built with gcc), with a 2 s refresh interval as in the hub.
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
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libnvidia-ml.so.1", "-o",
                    str(out / "libnvidia-ml.so.1"),
                    str(REPO / "tests" / "nvml_standin" / "libnvidia-ml.c"), "-lpthread"],
                   check=True)
    return out


async def ticker(stalls: list[float], stop: asyncio.Event) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        stalls.append(now - last - 0.001)
        last = now


async def run(requests: int, gpus: int, inventory) -> dict:
    from hub_ext.pool import AllocationRefused, GPUPool, ServerKey

    pool = GPUPool(inventory=inventory, refresh_interval=2.0)
    await pool.devices()  # the hub has read the inventory before the rush
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
    args = parser.parse_args()
    doc = {"devices": [{"uuid": f"GPU-bench-{i:04d}", "memory_total_mib": 16384}
                       for i in range(args.gpus)]}
    with tempfile.TemporaryDirectory() as tmp:
        node = Path(tmp) / "node.json"
        node.write_text(json.dumps(doc))
        if args.nvml and "NVML_STANDIN_JSON" not in os.environ:
            # the stand-in must be on LD_LIBRARY_PATH when the process starts
            lib = build_standin(Path(tmp))
            env = {**os.environ, "LD_LIBRARY_PATH": str(lib), "NVML_STANDIN_JSON": str(node)}
            sys.exit(subprocess.run([sys.executable, *sys.argv], env=env).returncode)
        if args.nvml:
            from hub_ext.nvml import NVMLInventory

            inventory, label = NVMLInventory(), "NVML stand-in via pynvml"
        else:
            from hub_ext.inventory import SimulatedInventory

            inventory, label = SimulatedInventory(path=str(node)), "simulated (JSON)"
        result = asyncio.run(run(args.requests, args.gpus, inventory))
    print(f"inventory            : {label}")
    print(f"requests / GPUs      : {args.requests} / {args.gpus}")
    print(f"granted              : {result['granted']}  (double-booked: "
          f"{result['double_booked']})")
    print(f"refusal latency      : p50 {result['refusal_p50_ms']:.2f} ms, "
          f"p99 {result['refusal_p99_ms']:.2f} ms  (target p99 < 50 ms)")
    print(f"longest loop stall   : {result['max_loop_stall_ms']:.2f} ms  (target < 10 ms)")
    if result["granted"] != args.gpus or result["double_booked"]:
        sys.exit("FAIL: wrong number of grants or a double booking")


if __name__ == "__main__":
    main()
