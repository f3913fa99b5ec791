"""What one Slurm command costs the hub through a submit host: over ssh with one shared
connection (OpenSSH ControlMaster/ControlPersist, the default), over ssh with a connection
per command, and on the hub's own host; interleaved rounds, medians.

    .venv/bin/python benchmarks/submit_host.py [--runs 15]

Needs root and the test cluster with its login host (``scripts/slurm-cluster.sh start``
starts both; Debian ``openssh-server``): sshd in the ``ghslurm-login`` network namespace on
this machine, so the figures are ssh's and sshd's own work, no network in between.  The
commands go through :class:`hub_ext.slurm.submit.SubmitHost`, as the hub's do.

true:   ``true`` (the floor: a session, the remote login shell, one exec);
sinfo:  ``sinfo -h`` (the spawn page's read, slurmctld's answer included);
member: ``runuser -u <member> -- squeue -h -u <member>`` (batchspawner's status query).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from hub_ext.slurm.submit import DEFAULT_SSH, SubmitHost  # noqa: E402

SCRIPT = REPO / "scripts" / "slurm-cluster.sh"
DIR = Path(os.environ.get("GPUHUB_SLURM_DIR", "/srv/gpuhub-slurm"))
MEMBER = "ghbench-submit"


def login_settings() -> dict[str, str]:
    subprocess.run(["bash", str(SCRIPT), "start"], check=True, capture_output=True)
    out = subprocess.run(
        ["bash", str(SCRIPT), "login-env"], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


async def main(runs: int) -> None:
    settings = login_settings()
    try:
        pwd.getpwnam(MEMBER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", MEMBER], check=True)
    options = tuple(shlex.split(settings["GPUHUB_SLURM_SSH_OPTIONS"]))
    host = settings["GPUHUB_SLURM_SUBMIT_HOST"]
    ways = {
        "ssh, shared connection (default)": (
            SubmitHost(host, (*DEFAULT_SSH, *options)),
            settings["GPUHUB_SLURM_CONF"],
        ),
        "ssh, a connection per command": (
            SubmitHost(host, ("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", *options)),
            settings["GPUHUB_SLURM_CONF"],
        ),
        "the hub's own host": (SubmitHost(), str(DIR / "slurm.conf")),
    }
    commands = {
        "true": ["true"],
        "sinfo": ["sinfo", "-h"],
        "member": ["runuser", "-u", MEMBER, "--", "squeue", "-h", "-u", MEMBER],
    }
    times: dict[tuple[str, str], list[float]] = {}
    for submit, conf in ways.values():  # warm-up: the shared connection opens
        await submit.run(["true"], env={"SLURM_CONF": conf}, timeout=30)
    for _ in range(runs):
        for way, (submit, conf) in ways.items():
            for what, argv in commands.items():
                start = time.perf_counter()
                await submit.run(argv, env={"SLURM_CONF": conf}, timeout=30)
                times.setdefault((way, what), []).append(time.perf_counter() - start)
    print(f"medians of {runs} (min), seconds; load average {os.getloadavg()[0]:.1f}")
    print(f"{'':36}" + "".join(f"{what:>16}" for what in commands))
    for way in ways:
        print(
            f"{way:36}"
            + "".join(
                f"{statistics.median(times[way, w]):>9.3f} ({min(times[way, w]):.3f})"
                for w in commands
            )
        )
    subprocess.run(["userdel", MEMBER], capture_output=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    asyncio.run(main(parser.parse_args().runs))
