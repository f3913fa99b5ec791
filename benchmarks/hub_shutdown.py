"""Hub shutdown: SIGTERM until the hub process has exited, with a member's server running.

    .venv/bin/python benchmarks/hub_shutdown.py [--runs 5]

The hub runs as the README's first command does (the managed credits service and
jupyterhub-idle-culler as its services, ``cleanup_servers=False``); one member's CPU server
is running and stays running across the restarts.  Each run restarts the hub, sends SIGTERM
and times until the process is gone.  Prints the median and, from the hub's log of the last
run, the seconds between its shutdown steps (where the time goes).  Target: under 5 s.
``--after-kill``: the hub is first killed with SIGKILL and started again, as after a crash
(the case where services used to be left running, and the new hub's crash-looped).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402

#: JupyterHub's log lines that mark a step of its shutdown (jupyterhub/app.py cleanup()).
STEPS = re.compile(r"Received signal|Cleaning up|Stopping service|Cleaning up proxy|"
                   r"Cleaning up single-user|Leaving single-user|...done|Exited|Stopping")
_STAMP = re.compile(r"^\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})")


def shutdown_steps(log: str) -> list[tuple[float, str]]:
    """(seconds since the signal, line) for the shutdown lines after the last signal."""
    lines = log.splitlines()
    start = max((i for i, ln in enumerate(lines) if "Received signal" in ln), default=None)
    if start is None:
        return []
    steps, first = [], None
    for line in lines[start:]:
        stamp = _STAMP.match(line)
        if not stamp or not STEPS.search(line):
            continue
        when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        first = first if first is not None else when
        steps.append((when - first, line[_STAMP.match(line).end():].strip()[:110]))
    return steps


async def one_shutdown(hub: Hub) -> float:
    tic = time.perf_counter()
    hub.proc.send_signal(signal.SIGTERM)
    while hub.proc.poll() is None:
        await asyncio.sleep(0.01)
    return time.perf_counter() - tic


async def main(runs: int, after_kill: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp, \
            running_provider(Path(tmp) / "oidc.log") as oidc:
        hub = Hub(Path(tmp), {}, oidc=oidc)
        await hub.start()
        seconds = []
        try:
            await hub.create_user("bench")
            r = await hub.spawn("bench", {"profile": "cpu"})
            assert r.status_code in (201, 202), r.text
            await hub.wait_ready("bench")
            if after_kill:
                hub.kill(signal.SIGKILL)
                await hub.start()
            for _ in range(runs):
                seconds.append(await one_shutdown(hub))
                await hub.start()
                assert await hub.running("bench"), "the member's server did not survive"
            log = hub.log()
        finally:
            await hub.close(docker.APIClient())
    print(f"SIGTERM to exit : median {statistics.median(seconds):.2f} s  "
          f"runs {[round(s, 2) for s in seconds]}  (target < 5 s)")
    print("last run, seconds after the signal:")
    for at, line in shutdown_steps(log):
        print(f"  {at:6.2f}  {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--after-kill", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.after_kill))
