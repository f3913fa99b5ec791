"""Latency the credits hook adds to a spawn, against the real reference service on loopback.

Starts the reference service (``python -m hub_ext.credits.service``, SQLite in WAL mode, as
the hub runs it by default), grants one account plenty of credits, then times
:meth:`hub_ext.credits.hook.CreditsHook.before_container` -- the spawn-time debit, the only
credits step on a spawn's path -- for ``--spawns`` spawns of a priced profile, each a new
server run (so each is a real debit, never a replay).  For comparison it times the same call
for a free profile (no API call) and the refund of a failed start (``undo``, off the
success path).  Target: median below 20 ms.

The spawner is a stand-in with the attributes the hook reads (user, name, price, profile,
``hook_state``, ``emit``); everything from the hook down -- client, HTTP, service, ledger,
database -- is the real thing.  Its ``persist_state`` (the write-ahead record before the
debit) commits the state to a JupyterHub ``orm.Spawner`` row in a SQLite hub database, as
the hub's spawner does.  Client and service share this machine's cores.

    .venv/bin/python benchmarks/credits_hook.py [--spawns 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from jupyterhub import orm  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from hub_ext.credits.client import CreditsClient  # noqa: E402
from hub_ext.credits.hook import CreditsHook  # noqa: E402
from tests.fixtures.credits import running_credits_service  # noqa: E402


class _Member:
    def __init__(self, name: str):
        self.name = name


class SpawnerStandIn:
    """What CreditsHook reads and writes on a spawner; progress events are kept."""

    def __init__(self, username: str, server: str, credits_per_hour: float, db=None):
        self.db = db
        self.orm_spawner = None
        if db is not None:  # a row in the hub database, as JupyterHub keeps one per server
            orm_user = db.query(orm.User).filter_by(name=username).one_or_none()
            if orm_user is None:
                orm_user = orm.User(name=username)
                db.add(orm_user)
            self.orm_spawner = orm.Spawner(user=orm_user, name=server)
            db.add(self.orm_spawner)
            db.commit()
        self.user = _Member(username)
        self.name = server
        self.credits_per_hour = credits_per_hour
        self.profile_slug = "pytorch"
        self.hook_state: dict = {}
        self.events: list[tuple[int, str]] = []
        self._log_name = f"{username}:{server}"
        self.pending = "spawn"

    def emit(self, progress: int, message: str) -> None:
        self.events.append((progress, message))

    def persist_state(self) -> None:
        """As ``GPUDockerSpawner.persist_state``: the state into the row, committed."""
        if self.orm_spawner is not None:
            self.orm_spawner.state = {
                "gpuhub_hooks": {"version": 1, "hooks": dict(self.hook_state)}
            }
            self.db.commit()


def summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
    return (
        f"{label:<38} n={len(ms):<4} median {statistics.median(ms):7.2f} ms   "
        f"p95 {p95:7.2f} ms   max {ms[-1]:7.2f} ms"
    )


async def run(url: str, hub_token: str, admin_token: str, spawns: int, db) -> dict[str, list]:
    username = f"bench-{uuid.uuid4().hex[:8]}"
    async with CreditsClient(url=url, token=admin_token) as admin:
        await admin.grant(username, "100000.00", key=f"bench-grant-{username}")
    client = CreditsClient(url=url, token=hub_token)
    hook = CreditsHook(client=client, interval=900, meter_period=3600)
    times: dict[str, list] = {"first": [], "paid": [], "free": [], "undo": []}
    try:
        for i in range(spawns + 1):
            spawner = SpawnerStandIn(username, f"s{i}", 2.0, db)
            t0 = time.perf_counter()
            await hook.before_container(spawner)
            elapsed = time.perf_counter() - t0
            times["first" if i == 0 else "paid"].append(elapsed)
            assert spawner.hook_state["credits"]["debits"], "no debit made"
            t0 = time.perf_counter()
            await hook.undo(spawner)
            times["undo"].append(time.perf_counter() - t0)
        for i in range(spawns):
            spawner = SpawnerStandIn(username, f"free{i}", 0.0)
            t0 = time.perf_counter()
            await hook.before_container(spawner)
            times["free"].append(time.perf_counter() - t0)
        async with CreditsClient(url=url, token=admin_token) as admin:
            account = await admin.balance(username)
        assert account.balance == 100000, f"undo left {account.balance}"  # all refunded
    finally:
        await client.aclose()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spawns", type=int, default=200, help="spawns to time (default 200)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuhub-bench-") as tmp:
        workdir = Path(tmp)
        engine = create_engine(f"sqlite:///{workdir / 'jupyterhub.sqlite'}")
        orm.Base.metadata.create_all(engine)
        with (
            running_credits_service(f"sqlite:///{workdir / 'credits.sqlite'}", workdir) as service,
            Session(engine) as db,
        ):
            times = asyncio.run(
                run(service.url, service.hub_token, service.admin_token, args.spawns, db)
            )
        engine.dispose()
    paid = statistics.median(times["paid"]) * 1000
    print(summary("before_container, priced profile", times["paid"]))
    print(summary("before_container, first (connects)", times["first"]))
    print(summary("before_container, free profile", times["free"]))
    print(summary("undo (refund of a failed start)", times["undo"]))
    verdict = "meets" if paid < 20 else "MISSES"
    print(f"added latency per spawn: median {paid:.2f} ms ({verdict} the 20 ms target)")
    return 0 if paid < 20 else 1


if __name__ == "__main__":
    sys.exit(main())
