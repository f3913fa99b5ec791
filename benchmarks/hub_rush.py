"""The rush through a real hub: ``pool_contention.py --hub``.

``requests`` concurrent ``POST /hub/api/users/<name>/server`` of a one-GPU profile, each
from that member's own browser session (logged in through the OIDC provider beforehand:
cookie and ``X-XSRFToken``, as JupyterHub's home page sends it), against a simulated node
of ``gpus`` GPUs: our hub (``jupyterhub_config.py``, real proxy, real containers for the
winners, credits off, log level INFO), its database SQLite in the state directory or a
fresh PostgreSQL cluster (``tests/fixtures/credits.running_postgres``, durable: fsync on,
as in production).

Each answer is sorted by what became of its start, not only by its status code: a 201 or a
202 whose server became ready was granted; a 202 whose start was refused later (JupyterHub
answers 202 once a start takes longer than ``c.JupyterHub.slow_spawn_timeout``, 10 s, and
the start may still be refused after that) is a late refusal; 409 is a refusal by the GPU
pool (or the line), 429 one by the hub's server limits.  The refusal latency is the HTTP
round trip as a client sees it, JupyterHub's own request handling included; for scale,
the same rush of ``GET /hub/api/users/<name>`` (the member's own model: token check, user
lookup, nothing started) is timed first against the same hub.  Double bookings are counted
from the running containers' device labels.

The hub's server limits (``GPUHUB_CONCURRENT_SPAWN_LIMIT``, 20 by default, and
``GPUHUB_ACTIVE_SERVER_LIMIT``, one per GiB of memory, both counting pending starts) answer
most of such a rush with 429 before the pool is asked.  ``limits="none"`` (the default) sets
both to 0, so that the rush measures the GPU refusal itself; ``limits="default"`` keeps the
hub's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.fixtures.oidc import MEMBERS

#: the hub's server limits during the rush (see the module doc)
LIMITS = {
    "none": {"GPUHUB_CONCURRENT_SPAWN_LIMIT": "0", "GPUHUB_ACTIVE_SERVER_LIMIT": "0"},
    "default": {},
}


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by the nearest-rank method, in the same unit."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))] if ordered else float("nan")


@contextlib.contextmanager
def hub_database(kind: str):
    """``(env, label)`` for the hub's database: ``sqlite`` (the default in the state
    directory) or ``postgres`` (a fresh durable cluster, removed on exit)."""
    if kind == "sqlite":
        yield {}, "SQLite"
        return
    from tests.fixtures.credits import running_postgres

    with running_postgres(durable=True) as server:
        yield {"GPUHUB_DB_URL": server.create_database("hub")}, "PostgreSQL"


async def outcome(hub, user: str, timeout: float = 120) -> str:
    """``ready`` or ``refused`` (the server went away) for a start answered 201/202."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = await hub.server(user)
        if model is None or not model.get("pending") and not model["ready"]:
            return "refused"
        if model["ready"]:
            return "ready"
        await asyncio.sleep(0.2)
    return "timeout"


@contextlib.contextmanager
def sampled(pid: int, out: Path | None):
    """py-spy samples of process ``pid`` while the block runs, written to ``out`` as
    collapsed stacks (``py-spy record --format raw``); nothing when ``out`` is None."""
    if out is None:
        yield
        return
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    spy = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "200",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1)  # py-spy attaches
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)


async def member(hub, user: str, logins: asyncio.Semaphore):
    """A browser of ``user``'s, logged in through the OIDC provider (cookies): members click
    "Start" minutes after they logged in, so JupyterHub does not refresh their login during
    the rush (``c.Authenticator.auth_refresh_age``, 300 s)."""
    async with logins:
        browser = await hub.login(user, groups=[MEMBERS])
    browser.timeout = httpx.Timeout(120)
    return browser


async def anonymous(client: httpx.AsyncClient) -> float:
    """Seconds for ``GET /hub/api/`` (JupyterHub's version: no login, no database) from a
    ``client`` of its own holding no cookie: the proxy, tornado and the client under the
    same rush, the floor under any answer of the hub's."""
    tic = time.perf_counter()
    r = await client.get("/hub/api/")
    assert r.status_code == 200, r.text
    return time.perf_counter() - tic


async def run_hub(
    requests: int, gpus: int, db: str = "sqlite", limits: str = "none", profile: Path | None = None
) -> dict:
    """The rush once; returns its figures (latencies in ms).  ``profile``: where to write
    py-spy's samples of the hub during the rush (see :func:`sampled`)."""
    import docker

    from tests.fixtures.hub import NOTEBOOK_IMAGE, Hub
    from tests.fixtures.oidc import running_provider

    with (
        tempfile.TemporaryDirectory() as tmp,
        running_provider(Path(tmp) / "oidc.log") as oidc,
        hub_database(db) as (db_env, db_label),
    ):
        profiles = Path(tmp) / "profiles.json"
        profiles.write_text(
            json.dumps(
                [
                    {
                        "display_name": "gpu",
                        "slug": "gpu",
                        "gpus": 1,
                        "spawner_override": {"image": NOTEBOOK_IMAGE},
                    }
                ]
            )
        )
        hub = Hub(
            Path(tmp),
            {
                "GPUHUB_PROFILES": str(profiles),
                "GPUHUB_CREDITS": "off",
                "GPUHUB_GPUS": f"simulated:{gpus}",
                **LIMITS[limits],
                **db_env,
            },
            extra_config="c.JupyterHub.log_level = 'INFO'\n",
            oidc=oidc,
        )
        client = docker.APIClient()
        try:
            await hub.start()
            users = [f"user{i}" for i in range(requests)]
            logins = asyncio.Semaphore(8)
            browsers = dict(
                zip(
                    users,
                    await asyncio.gather(*(member(hub, u, logins) for u in users)),
                    strict=True,
                )
            )

            async def call(method: str, user: str, path: str, **kw):
                tic = time.perf_counter()
                r = await hub.browser_api(browsers[user], method, f"/users/{user}{path}", **kw)
                return r.status_code, time.perf_counter() - tic

            floor = await asyncio.gather(*(call("GET", u, "") for u in users))
            assert {code for code, _ in floor} == {200}, floor
            async with contextlib.AsyncExitStack() as stack:
                clients = [
                    await stack.enter_async_context(
                        httpx.AsyncClient(base_url=hub.url, timeout=120)
                    )
                    for _ in users
                ]
                transport = await asyncio.gather(*(anonymous(c) for c in clients))
            with sampled(hub.proc.pid, profile):
                answers = dict(
                    zip(
                        users,
                        await asyncio.gather(
                            *(call("POST", u, "/server", json={"profile": "gpu"}) for u in users)
                        ),
                        strict=True,
                    )
                )
            started = [u for u, (code, _) in answers.items() if code in (201, 202)]
            ends = dict(
                zip(started, await asyncio.gather(*(outcome(hub, u) for u in started)), strict=True)
            )
            held = [
                u
                for c in hub.containers(client)
                if c["State"] == "running"
                for u in c["Labels"]["io.gpuhub.devices"].split(",")
                if u
            ]
        finally:
            await hub.close(client)
    by_code: dict[int, list[float]] = {}
    for code, seconds in answers.values():
        by_code.setdefault(code, []).append(1000 * seconds)
    refusals = by_code.get(409, []) + by_code.get(429, [])
    return {
        "db": db_label,
        "granted": sum(end == "ready" for end in ends.values()),
        "late_refused": sum(end == "refused" for end in ends.values()),
        "not_ready": sum(end == "timeout" for end in ends.values()),
        "double_booked": len(held) - len(set(held)),
        "held": len(held),
        "refused_pool": len(by_code.get(409, [])),
        "refused_limits": len(by_code.get(429, [])),
        "other": sorted(c for c in by_code if c not in (201, 202, 409, 429)),
        "refusal_p50_ms": statistics.median(refusals) if refusals else float("nan"),
        "refusal_p99_ms": percentile(refusals, 0.99),
        "refusal_max_ms": max(refusals, default=float("nan")),
        "floor_p50_ms": 1000 * statistics.median(t for _, t in floor),
        "floor_p99_ms": 1000 * percentile([t for _, t in floor], 0.99),
        "transport_p50_ms": 1000 * statistics.median(transport),
        "transport_p99_ms": 1000 * percentile(transport, 0.99),
        "grant_p50_ms": statistics.median(
            [1000 * answers[u][1] for u, e in ends.items() if e == "ready"] or [float("nan")]
        ),
    }


def report(result: dict, requests: int, gpus: int, limits: str) -> bool:
    """Print one run's figures; True when it passed (exactly ``gpus`` granted, none
    double-booked, no other answer)."""
    limit = "the hub's default server limits" if limits == "default" else "no server limits"
    print(
        f"through a real hub on {result['db']}: {requests} concurrent spawn requests, "
        f"{gpus} simulated GPUs, {limit}"
    )
    print(
        f"  granted              : {result['granted']} (answer p50 "
        f"{result['grant_p50_ms']:.0f} ms); GPUs held by running containers "
        f"{result['held']}, double-booked {result['double_booked']}"
    )
    print(
        f"  refused              : {result['refused_pool']} by the pool (409), "
        f"{result['refused_limits']} by the server limits (429), {result['late_refused']} "
        f"after a 202; other answers: {result['other'] or 'none'}"
        + (f"; {result['not_ready']} never ready" if result["not_ready"] else "")
    )
    print(
        f"  refusal HTTP latency : p50 {result['refusal_p50_ms']:.0f} ms, "
        f"p99 {result['refusal_p99_ms']:.0f} ms, max {result['refusal_max_ms']:.0f} ms "
        f"(target p99 < 500 ms)"
    )
    print(
        f"  the same rush of GET /hub/api/users/<name> (JupyterHub's own request handling): "
        f"p50 {result['floor_p50_ms']:.0f} ms, p99 {result['floor_p99_ms']:.0f} ms"
    )
    print(
        f"  the same rush of GET /hub/api/ without a login (proxy, tornado, client): "
        f"p50 {result['transport_p50_ms']:.0f} ms, p99 {result['transport_p99_ms']:.0f} ms"
    )
    return (
        result["granted"] == gpus
        and not result["double_booked"]
        and not result["other"]
        and not result["not_ready"]
    )
