"""Hub shutdown: SIGTERM until the hub process has exited, set up as the README's demo.

    .venv/bin/python benchmarks/hub_shutdown.py [--runs 5] [--sigint-default] [--after-kill]

The hub runs what ``scripts/demo.sh`` runs (SQLite, the managed credits service and
jupyterhub-idle-culler as its services, the credits meter, a simulated node of two GPUs,
the built-in profiles, 10 credits for each member at first login, ``cleanup_servers=False``)
and is started the way a script starts the demo in the background (``scripts/demo.sh &``):
with SIGINT ignored, which its services inherit unless their guard gives it back
(hub_ext/ops/service_guard.py).  ``--sigint-default`` starts it as from a terminal instead.
Two members log in and each runs a PyTorch server (one simulated GPU each, metered); the
servers stay running across the restarts.  Each run sends SIGTERM, times until the
process is gone, and starts the hub again.  Prints the machine's load, the median, and for
the last run the shutdown's phases from the hub's log (where the time goes).
Target: under 5 s.  ``--after-kill``: the hub is first killed with SIGKILL and started
again, as after a crash (the case where services used to be left running).

It does not run ``scripts/demo.sh`` itself, whose set-up step would rebuild the shared
images from this checkout; it uses the test harness's hub (tests/fixtures/hub.py) with the
demo's settings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.fixtures.hub import Hub  # noqa: E402
from tests.fixtures.oidc import running_provider  # noqa: E402

MEMBERS = ("alice", "bob")
#: The demo's settings that differ from the harness's hub (scripts/demo.sh); every
#: GPUHUB_CREDITS_* of the caller's environment is cleared, so the hub runs its own service.
DEMO_ENV = {
    "GPUHUB_INITIAL_CREDITS": "10",
    "GPUHUB_GPUS": "simulated:2",
    "GPUHUB_DOCKER_NETWORK": "host",
    "GPUHUB_PROFILES": "",
}

#: The hub's log lines that begin a phase of its shutdown, in order (jupyterhub/app.py
#: cleanup(), jupyterhub/services/service.py stop(), hub_ext/common/periodic.py).
PHASES = [
    ("Received signal", "signal received"),
    ("Stopping the hub's", "periodic passes (hub_ext/common/periodic.py)"),
    ("Stopping service credits", "credits service: SIGINT until gone"),
    ("Stopping service idle-culler", "idle culler: SIGINT until gone"),
    ("Leaving single-user servers", "servers left running"),
    ("Cleaning up proxy", "configurable-http-proxy"),
    ("...done", "JupyterHub's clean-up done; then cancelled tasks, interpreter exit"),
]
_STAMP = re.compile(r"^\[\w (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})")


def phases(log: str, exited_at: float) -> list[tuple[float, float, str, str]]:
    """(seconds after the signal, seconds the phase took, phase, log line) for the last
    shutdown in ``log``; ``exited_at``: the wall-clock time the process was gone."""
    lines = log.splitlines()
    start = max((i for i, ln in enumerate(lines) if "Received signal" in ln), default=None)
    if start is None:
        return []
    found: list[tuple[float, str, str]] = []
    for line in lines[start:]:
        stamp = _STAMP.match(line)
        if not stamp:
            continue
        for marker, name in PHASES:
            if marker in line and not any(n == name for _, n, _ in found):
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
                found.append((when, name, line[stamp.end() :].strip()[:90]))
    found.append((exited_at, "process gone", ""))
    first = found[0][0]
    return [
        (at - first, (found[i + 1][0] - at) if i + 1 < len(found) else 0.0, name, text)
        for i, (at, name, text) in enumerate(found)
    ]


async def one_shutdown(hub: Hub) -> tuple[float, float]:
    """(seconds from SIGTERM to exit, wall-clock time of the exit)."""
    tic = time.perf_counter()
    hub.proc.send_signal(signal.SIGTERM)
    while hub.proc.poll() is None:
        await asyncio.sleep(0.01)
    return time.perf_counter() - tic, time.time()


async def main(runs: int, after_kill: bool, sigint_default: bool) -> None:
    env = {**{k: "" for k in os.environ if k.startswith("GPUHUB_CREDITS")}, **DEMO_ENV}
    with tempfile.TemporaryDirectory() as tmp, running_provider(Path(tmp) / "oidc.log") as oidc:
        hub = Hub(Path(tmp), env, oidc=oidc, sigint_ignored=not sigint_default)
        await hub.start()
        seconds = []
        try:
            for name in MEMBERS:
                await hub.login(name)  # the demo's first login grants 10 credits
                r = await hub.spawn(name, {"profile": "pytorch"})
                assert r.status_code in (201, 202), r.text
            for name in MEMBERS:
                await hub.wait_ready(name)
            if after_kill:
                hub.kill(signal.SIGKILL)
                await hub.start()
            load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            for _ in range(runs):
                took, exited_at = await one_shutdown(hub)
                seconds.append(took)
                log = hub.log()
                await hub.start()
                for name in MEMBERS:
                    assert await hub.running(name), f"{name}'s server did not survive"
            print(f"machine: {load}")
            print(
                f"started as {'from a terminal' if sigint_default else 'scripts/demo.sh &'}"
                f"; {len(MEMBERS)} members' PyTorch servers running"
            )
            print(
                f"SIGTERM to exit : median {statistics.median(seconds):.2f} s  "
                f"runs {[round(s, 2) for s in seconds]}  (target < 5 s)"
            )
            print("last run: at (s after the signal)  took (s)  phase")
            for at, took, name, text in phases(log, exited_at):
                print(
                    f"  {at:6.2f}  {took:6.2f}  {name}"
                    + (f"\n                  {text}" if text else "")
                )
        finally:
            if hub.proc.poll() is None:  # however long it takes (Hub.close waits 30 s)
                await one_shutdown(hub)
            await hub.close(docker.APIClient())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--after-kill", action="store_true")
    parser.add_argument(
        "--sigint-default",
        action="store_true",
        help="start the hub with SIGINT at its default (as from a terminal)",
    )
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.after_kill, args.sigint_default))
