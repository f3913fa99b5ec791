"""Debit throughput of the reference credits service, on SQLite and on PostgreSQL.

Starts the real service (``python -m hub_ext.credits.service``) on 127.0.0.1 with a fresh
database, grants one account plenty of credits, then times debits of 0.01 credits made
through :class:`hub_ext.credits.client.CreditsClient`:

- sequential: one debit at a time (latency-bound: one request, one database commit);
- concurrent: ``--concurrency`` debits in flight at once on one account, so every debit
  waits for the account's lock (the worst case for the ledger).

PostgreSQL runs with fsync on (``durable=True``), as in production; SQLite runs in WAL
mode with ``synchronous=NORMAL``, the service's setting.  The client and the service
share this machine's cores, so figures are a floor, not a ceiling.  All traffic stays on
the loopback interface and every loop is bounded.

    .venv/bin/python benchmarks/credits_throughput.py [--sequential 500] [--concurrent 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from hub_ext.credits.client import CreditsClient  # noqa: E402
from tests.fixtures.credits import (  # noqa: E402
    PostgresUnavailable,
    running_credits_service,
    running_postgres,
)


async def sequential(client: CreditsClient, username: str, count: int) -> tuple[float, list]:
    latencies = []
    start = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        await client.debit(username, "0.01", key=f"seq-{uuid.uuid4().hex}")
        latencies.append(time.perf_counter() - t0)
    return count / (time.perf_counter() - start), latencies


async def concurrent(
    client: CreditsClient, username: str, count: int, concurrency: int
) -> tuple[float, list]:
    latencies = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            t0 = time.perf_counter()
            await client.debit(username, "0.01", key=f"con-{uuid.uuid4().hex}")
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(count)))
    return count / (time.perf_counter() - start), latencies


def summary(name: str, rate: float, latencies: list) -> str:
    ms = sorted(1000 * x for x in latencies)
    p95 = ms[int(0.95 * (len(ms) - 1))]
    return (
        f"  {name:<32} {rate:8.0f} debits/s   "
        f"p50 {statistics.median(ms):6.1f} ms   p95 {p95:6.1f} ms"
    )


async def bench(service, args) -> list[str]:
    username = f"bench-{uuid.uuid4().hex[:8]}"
    async with service.client(admin=True) as admin:
        await admin.grant(username, "1000000.00", key=f"bench-grant-{username}")
    async with service.client(timeout=60) as client:
        await sequential(client, username, 20)  # warm-up: connections, caches
        seq = await sequential(client, username, args.sequential)
        con = await concurrent(client, username, args.concurrent, args.concurrency)
        account = await client.balance(username)
    expected = 1000000 - (20 + args.sequential + args.concurrent) / 100
    assert float(account.balance) == expected, (account.balance, expected)
    return [
        summary(f"sequential ({args.sequential})", *seq),
        summary(f"concurrent ({args.concurrent}, {args.concurrency} in flight)", *con),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--concurrent", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args(argv)

    for backend in args.backends.split(","):
        with ExitStack() as stack:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            if backend == "sqlite":
                db_url = f"sqlite:///{workdir / 'credits.sqlite'}"
            else:
                try:
                    server = stack.enter_context(running_postgres(durable=True))
                except PostgresUnavailable as exc:
                    print(f"{backend}: skipped ({exc})")
                    continue
                db_url = server.create_database("bench")
            service = stack.enter_context(running_credits_service(db_url, workdir))
            print(f"{backend}:")
            for line in asyncio.run(bench(service, args)):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
