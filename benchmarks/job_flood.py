"""The hub API while a member floods refused notebook-job requests: ``job_flood.py``.

A real hub (``jupyterhub_config.py``, the real proxy, credits off, log level INFO, one
simulated GPU, members' workspaces in host folders) and two members: alice, whose workspace
holds a notebook of 14 MiB (``--mib``), and bob, who only reads his own model.  A probe, in
this process, sends bob's ``GET /hub/api/user`` every 50 ms for ``--seconds``, first
with the hub idle, then while a flood runs in a child process of its own (so that the
flood's client work never delays the probe's): ``--clients`` connections of alice's (12, as
in issue 28), each posting job requests back to back, of one kind:

- ``parameters``: her big notebook with parameters over the job's 8 KiB of options: 413,
  a refusal decided from the request alone (before issue 28's fix the hub read and parsed
  the notebook first, in its event loop);
- ``notebook``: a file of 14 MiB that is not a notebook the hub takes (nbformat 3): 400, a
  refusal that needs all of the file read and parsed (in a thread and a child process, one
  request of the member's at a time: hub_ext/jobs/intake.py).

Printed per phase: the probe's p50, p99 and max (ms), and the flood's answers (count per
status, per second).  Target: the probe's p99 during each flood within 2x of idle.  Run
with ``PYTHONPATH`` at another checkout to measure its hub instead (the hub is started
with this process's environment).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: the job request of each flood kind (the notebook's name in alice's workspace)
FLOODS = {
    "parameters": {
        "input_uri": "big.ipynb",
        "runtime_environment_name": "gpu",
        "parameters": {f"p{i}": "x" * 900 for i in range(10)},
    },
    "notebook": {"input_uri": "not-a-notebook.ipynb", "runtime_environment_name": "gpu"},
}
TARGET = 2.0


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else float("nan")


def big_notebook(mib: float, nbformat: int = 4) -> bytes:
    """A notebook of about ``mib`` MiB, code cells with printed outputs (``nbformat`` 3:
    not one the hub takes, but only a parse of all of it tells)."""
    line = "loss 0.123456789 accuracy 0.987654321 " * 2 + "\n"
    cell = {
        "cell_type": "code",
        "metadata": {},
        "source": "for step in range(100):\n    print(step)",
        "execution_count": 1,
        "outputs": [{"output_type": "stream", "name": "stdout", "text": [line] * 40}],
    }
    size = len(json.dumps(cell))
    cells = [cell] * max(1, int(mib * 2**20 / size))
    nb = {"cells": cells, "metadata": {}, "nbformat_minor": 5, "nbformat": nbformat}
    return json.dumps(nb).encode()


def workspace(root: Path, user: str, files: dict[str, bytes]) -> None:
    """``user``'s workspace under ``root``, owned by uid 1000 as a member's, with ``files``."""
    path = root / user
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
        os.chown(path / name, 1000, 100)
    os.chown(path, 1000, 100)
    path.chmod(0o700)


async def probe(url: str, token: str, seconds: float, every: float = 0.05) -> list[float]:
    """Seconds of each ``GET /hub/api/user`` with ``token``, one sent every ``every``
    seconds for ``seconds`` whether the ones before were answered or not (a slow hub does
    not make the probe send less: no coordinated omission)."""
    headers = {"Authorization": f"token {token}"}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=20)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=120, limits=limits
    ) as client:

        async def one() -> float:
            tic = time.perf_counter()
            r = await client.get("/hub/api/user")
            assert r.status_code == 200, r.text
            return time.perf_counter() - tic

        tasks = []
        start = time.monotonic()
        for i in range(int(seconds / every)):
            await asyncio.sleep(max(0.0, start + i * every - time.monotonic()))
            tasks.append(asyncio.create_task(one()))
        return list(await asyncio.gather(*tasks))


async def flood(url: str, token: str, kind: str, clients: int, seconds: float) -> dict:
    """``clients`` connections posting ``kind``'s job request back to back for ``seconds``;
    returns ``{status: count}``."""
    counts: dict[int, int] = {}
    headers = {"Authorization": f"token {token}"}
    deadline = time.monotonic() + seconds

    async def one():
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
            while time.monotonic() < deadline:
                r = await client.post("/hub/api/gpuhub/jobs", json=FLOODS[kind])
                counts[r.status_code] = counts.get(r.status_code, 0) + 1

    await asyncio.gather(*(one() for _ in range(clients)))
    return counts


def summary(times: list[float]) -> dict:
    ms = [1000 * t for t in times]
    return {
        "n": len(ms),
        "p50": statistics.median(ms),
        "p99": percentile(ms, 0.99),
        "max": max(ms),
    }


async def run(seconds: float, clients: int, mib: float) -> list[tuple[str, dict, dict]]:
    """Idle, then each flood, each followed by an idle phase again; returns (phase, probe
    figures, flood answers)."""
    import docker

    from tests.fixtures.hub import Hub
    from tests.fixtures.oidc import running_provider

    with tempfile.TemporaryDirectory() as tmp, running_provider(Path(tmp) / "oidc.log") as oidc:
        homes = Path(tmp) / "homes"
        homes.mkdir()
        workspace(
            homes,
            "alice",
            {
                "big.ipynb": big_notebook(mib),
                "not-a-notebook.ipynb": big_notebook(mib, nbformat=3),
            },
        )
        profiles = Path(tmp) / "profiles.json"
        profiles.write_text(json.dumps([{"display_name": "GPU", "slug": "gpu", "gpus": 1}]))
        hub = Hub(
            Path(tmp),
            {
                "GPUHUB_PROFILES": str(profiles),
                "GPUHUB_CREDITS": "off",
                "GPUHUB_GPUS": "simulated:1",
                "GPUHUB_WORKSPACE": str(homes / "{username}"),
                "GPUHUB_WORKSPACE_ROOT": str(homes),
                "GPUHUB_JOB_NOTEBOOK_MAX_MIB": str(int(mib) + 6),
            },
            extra_config="c.JupyterHub.log_level = 'INFO'\n",
            oidc=oidc,
        )
        client = docker.APIClient()
        results = []
        try:
            await hub.start()
            alice, bob = await hub.create_user("alice"), await hub.create_user("bob")
            await probe(hub.url, bob, 2)  # warm: connections, the user's first activity
            for kind in ["idle", *FLOODS]:
                child = None
                if kind != "idle":
                    child = subprocess.Popen(
                        [
                            sys.executable,
                            __file__,
                            "--flood",
                            kind,
                            hub.url,
                            alice,
                            str(clients),
                            str(seconds + 2),
                        ],
                        stdout=subprocess.PIPE,
                        text=True,
                    )
                    await asyncio.sleep(1)  # the flood under way
                times = await probe(hub.url, bob, seconds)
                answers = json.loads(child.communicate(timeout=300)[0]) if child else {}
                results.append((kind, summary(times), answers))
                await asyncio.sleep(2)  # the hub idle again
        finally:
            await hub.close(client)
    return results


def report(results: list[tuple[str, dict, dict]], seconds: float, clients: int, mib: float):
    """Print the figures; True when every flood's p99 is within :data:`TARGET` x idle."""
    idle = results[0][1]
    print(
        f"the hub API (bob's GET /hub/api/user every 50 ms) while alice floods "
        f"refused job requests ({clients} connections, {seconds:g} s each, notebook "
        f"{mib:g} MiB); target p99 within {TARGET:g}x idle"
    )
    ok = True
    for kind, probe_figures, answers in results:
        ratio = probe_figures["p99"] / idle["p99"]
        flood_words = ""
        if answers:
            total = sum(answers.values())
            flood_words = f"; flood answered {total} ({total / (seconds + 2):.1f}/s): " + ", ".join(
                f"{n} x {code}" for code, n in sorted(answers.items())
            )
        print(
            f"  {kind:<11} p50 {probe_figures['p50']:6.1f} ms  p99 {probe_figures['p99']:6.1f} ms"
            f"  max {probe_figures['max']:7.1f} ms  ({probe_figures['n']} probes, p99 "
            f"{ratio:.2f}x idle){flood_words}"
        )
        ok = ok and ratio <= TARGET
    return ok


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--flood":
        kind, url, token, clients, seconds = argv[1:6]
        counts = asyncio.run(flood(url, token, kind, int(clients), float(seconds)))
        print(json.dumps({str(k): v for k, v in counts.items()}))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--mib", type=float, default=14)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.seconds, args.clients, args.mib))
    return 0 if report(results, args.seconds, args.clients, args.mib) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
