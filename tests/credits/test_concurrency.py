"""Concurrent debits never take a balance below zero, on SQLite and on PostgreSQL.

The requests really are concurrent: 100 connections at once to the real service, whose
worker threads run the ledger writes in parallel (PostgreSQL row locks; SQLite's
``BEGIN IMMEDIATE``).  A second service process on the same database shows the guarantee
comes from the database, not from one process's event loop.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import httpx
import pytest

from tests.fixtures.credits import running_credits_service

CONCURRENT = 100


async def debit_all(services, username: str, count: int, *, same_key: bool = False):
    """``count`` debits of 1.00 at once, spread over ``services``; the answers."""
    limits = httpx.Limits(max_connections=CONCURRENT, max_keepalive_connections=0)
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60, limits=limits) for s in services]
    shared_key = f"same-{uuid.uuid4().hex}"
    try:

        async def one(n: int) -> httpx.Response:
            service = services[n % len(services)]
            return await clients[n % len(services)].post(
                f"/v1/accounts/{username}/debits",
                json={"amount": "1.00"},
                headers={
                    "Authorization": f"Bearer {service.hub_token}",
                    "Idempotency-Key": shared_key if same_key else f"debit-{n:04d}-{uuid.uuid4()}",
                },
            )

        return await asyncio.gather(*(one(n) for n in range(count)))
    finally:
        for client in clients:
            await client.aclose()


async def grant_and_read(service, username: str, amount: str):
    async with service.client(admin=True) as admin:
        await admin.grant(username, amount, key=f"grant-{uuid.uuid4()}")
    return service


async def final_state(service, username):
    async with service.client() as hub:
        account = await hub.balance(username)
        entries = [e async for e in hub.iter_transactions(username)]
    return account, entries


async def test_100_concurrent_debits_against_10_credits_take_exactly_10(
    any_credits_service, credits_username
):
    await grant_and_read(any_credits_service, credits_username, "10.00")
    responses = await debit_all([any_credits_service], credits_username, CONCURRENT)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 10, 402: 90}, statuses
    account, entries = await final_state(any_credits_service, credits_username)
    assert str(account.balance) == "0.00"
    debits = [e for e in entries if e.kind == "debit"]
    assert len(debits) == 10
    assert sorted(str(e.balance) for e in debits) == [f"{n}.00" for n in range(10)]
    refused = [r.json() for r in responses if r.status_code == 402]
    assert all(body["error"] == "insufficient_credits" for body in refused)


async def test_concurrent_retries_with_one_key_debit_once(any_credits_service, credits_username):
    await grant_and_read(any_credits_service, credits_username, "10.00")
    responses = await debit_all([any_credits_service], credits_username, 50, same_key=True)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 1, 200: 49}, statuses
    assert len({r.json()["transaction_id"] for r in responses}) == 1
    account, _ = await final_state(any_credits_service, credits_username)
    assert str(account.balance) == "9.00"


async def test_two_service_processes_on_one_database_still_take_exactly_10(
    any_credits_service, credits_username, tmp_path
):
    with running_credits_service(any_credits_service.db_url, tmp_path) as second:
        await grant_and_read(any_credits_service, credits_username, "10.00")
        responses = await debit_all([any_credits_service, second], credits_username, CONCURRENT)
    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 10, 402: 90}, statuses
    account, _ = await final_state(any_credits_service, credits_username)
    assert str(account.balance) == "0.00"


@pytest.mark.postgres
async def test_postgres_variant_is_really_postgres(credits_service_pg):
    assert credits_service_pg.db_url.startswith("postgresql+psycopg://")
