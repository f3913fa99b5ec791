"""Credits in a real hub: the spawn-time debit, metering, refunds and refusals.

Everything is real: JupyterHub and its proxy, Docker containers on a simulated two-GPU
node, the reference credits service with its SQLite ledger, and the hub's own
``CreditsHook``.  Faults of the Credits API come from a real HTTP server in front of the
service (:class:`LedgerFaults`); metering time from a clock file the test moves
(:class:`MovableClock`).  Each priced profile here costs 4 credits per hour, so one
15-minute interval is 1.00 credit.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import time
import uuid
from decimal import Decimal

import httpx
import pytest
from jupyterhub.utils import random_port
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from hub_ext.common.runs import ServerRun
from hub_ext.credits.client import CreditsClient
from hub_ext.credits.hook import UNREACHABLE
from hub_ext.credits.hubconfig import ADMIN_TOKEN_FILE, HUB_TOKEN_FILE
from tests.fixtures.credits_faults import LedgerFaults, MovableClock
from tests.fixtures.hub import eventually, terminal_run
from tests.fixtures.oidc import ADMINS

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = json.dumps(
    [
        {"display_name": "CPU only", "slug": "cpu", "default": True},
        {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
        {"display_name": "Two GPUs", "slug": "gpu2", "gpus": 2, "credits_per_hour": 4},
        {
            "display_name": "Broken",
            "slug": "broken",
            "gpus": 1,
            "credits_per_hour": 4,
            "spawner_override": {"image": "gpuhub/no-such-image:latest"},
        },
        {
            "display_name": "Hangs",
            "slug": "hangs",
            "gpus": 1,
            "credits_per_hour": 4,
            "spawner_override": {"cmd": ["sh", "-c", "sleep 600", "--"]},
        },
        {
            "display_name": "Slow to answer",
            "slug": "slow",
            "gpus": 1,
            "credits_per_hour": 4,
            "spawner_override": {
                "cmd": ["sh", "-c", 'sleep 8; exec jupyterhub-singleuser "$@"', "--"]
            },
        },
    ]
)

# Quick failure detection, so that a refusal is the answer to the spawn request itself.
FAST = (
    "c.CreditsClient.timeout = 1\n"
    "c.CreditsClient.max_attempts = 2\n"
    "c.CreditsClient.backoff_base = 0.05\n"
    "c.CreditsHook.spawn_timeout = 3\n"
    "c.CreditsHook.meter_period = 0.2\n"
)


@pytest.fixture
def clock(tmp_path) -> MovableClock:
    return MovableClock(tmp_path / "clock")


@pytest.fixture
def faults(credits_service):
    double = LedgerFaults(credits_service.url)
    yield double
    double.close()


@pytest.fixture
def member() -> str:
    """A username no other test uses (the credits service is shared by the session)."""
    return f"m{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def admin(credits_service):
    async with credits_service.client(admin=True) as client:
        yield client


@pytest.fixture
def credits_hub(hub_factory, credits_service, clock, tmp_path):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(PROFILES)

    async def make(url: str | None = None, extra_config: str = "", **env):
        return await hub_factory(
            extra_config=clock.hub_config() + FAST + extra_config,
            GPUHUB_PROFILES=str(profiles),
            GPUHUB_CREDITS_URL=url or credits_service.url,
            GPUHUB_CREDITS_TOKEN=credits_service.hub_token,
            **env,
        )

    return make


async def grant(admin: CreditsClient, user: str, amount: str) -> None:
    await admin.grant(user, amount, key=f"test-grant-{uuid.uuid4().hex}")


async def ledger(admin: CreditsClient, user: str) -> list[tuple[str, str]]:
    """(kind, amount) of every entry, oldest first."""
    return [(t.kind, str(t.amount)) async for t in admin.iter_transactions(user)][::-1]


async def entries(admin: CreditsClient, user: str):
    return [t async for t in admin.iter_transactions(user)][::-1]


async def balance(admin: CreditsClient, user: str) -> Decimal:
    return (await admin.balance(user)).balance


async def settles(admin, user, expected, hub, seconds: float = 1.5):
    """The ledger reaches ``expected`` and stays there for ``seconds`` (several meter passes)."""
    try:
        await eventually(lambda: _equals(ledger(admin, user), expected), what=str(expected))
    except AssertionError:
        raise AssertionError(
            f"ledger {await ledger(admin, user)} != {expected}\n{hub.log()[-4000:]}"
        ) from None
    await asyncio.sleep(seconds)
    assert await ledger(admin, user) == expected


async def _equals(awaitable, expected) -> bool:
    return await awaitable == expected


async def spawn_ready(hub, user, profile="gpu"):
    r = await hub.spawn(user, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(user)


async def home_page(hub, member: str) -> str:
    browser = await hub.login(member)  # closed with the hub
    r = await browser.get("/hub/home")
    assert r.status_code == 200, r.text[:500]
    return r.text


async def running(hub, user) -> bool:
    model = (await hub.api("GET", f"/users/{user}")).json()["servers"].get("")
    return bool(model and model["ready"])


# -- the spawn-time debit ----------------------------------------------------------------------


async def spawn_with_progress(hub, user, profile) -> list[str]:
    """Spawn and read the spawn's progress messages (JupyterHub's progress event stream)."""
    spawn = asyncio.create_task(hub.spawn(user, {"profile": profile}))
    headers = {"Authorization": f"token {hub.admin_token}"}
    messages: list[str] = []
    deadline = time.monotonic() + 60
    while not messages and time.monotonic() < deadline:
        async with hub.client.stream(
            "GET", f"/hub/api/users/{user}/server/progress", headers=headers
        ) as r:
            if r.status_code != 200:
                await asyncio.sleep(0.02)
                continue
            async for line in r.aiter_lines():
                if line.startswith("data:"):
                    messages.append(json.loads(line[5:])["message"])
    r = await spawn
    assert r.status_code in (201, 202), r.text
    return messages


async def test_paid_spawn_debits_the_first_interval(credits_hub, admin, member, docker_client):
    hub = await credits_hub()
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    messages = await spawn_with_progress(hub, member, "gpu")
    await hub.wait_ready(member)
    assert "Debiting 1.00 credits for the first 15 minutes" in messages, messages
    assert "Debited 1.00 credits; your balance is 9.00" in messages, messages
    [grant_entry, debit] = await entries(admin, member)
    assert (debit.kind, debit.amount, debit.balance) == ("debit", Decimal("1.00"), Decimal("9.00"))
    assert debit.metadata["hub_user"] == member
    assert debit.metadata["interval"] == "0"
    assert debit.metadata["profile"] == "gpu"
    assert "15 min" in debit.reason


async def test_member_with_too_little_balance_is_refused_at_once(
    credits_hub, admin, member, docker_client
):
    hub = await credits_hub()
    await hub.create_user(member)
    await grant(admin, member, "0.50")
    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code == 402, r.text  # the answer to the request itself
    assert r.json()["message"].startswith(
        "This profile costs 4.00 credits per hour; your balance is 0.50."
    )
    assert hub.containers(docker_client) == []
    assert await ledger(admin, member) == [("grant", "0.50")]

    # a member who was never granted anything hears the same, with 0.00
    stranger = member + "x"
    await hub.create_user(stranger)
    r = await hub.spawn(stranger, {"profile": "gpu"})
    assert r.status_code == 402, r.text
    assert "your balance is 0.00." in r.json()["message"]

    # no GPU stayed reserved: another member gets both
    rich = member + "r"
    await hub.create_user(rich)
    await grant(admin, rich, "5.00")
    await spawn_ready(hub, rich, "gpu2")


async def test_free_profile_makes_no_api_call(credits_hub, faults, member):
    hub = await credits_hub(url=faults.url)
    await hub.create_user(member)
    await spawn_ready(hub, member, "cpu")
    await asyncio.sleep(1)  # several meter passes
    await hub.stop_server(member)
    await asyncio.sleep(0.5)
    assert faults.requests == []


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("hang", id="times-out"),
        pytest.param("error500", id="answers-500"),
        pytest.param("malformed", id="malformed-json"),
        pytest.param("refused", id="connection-refused"),
    ],
)
async def test_unreachable_api_refuses_the_spawn_and_keeps_nothing(
    credits_hub, clock, faults, admin, member, credits_service, docker_client, mode
):
    faults.set(mode)
    hub = await credits_hub(url=faults.url)
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    r = await hub.spawn(member, {"profile": "gpu2"})
    # the answer to the request itself: the hook gives up within its spawn_timeout,
    # before JupyterHub's slow_spawn_timeout would turn the answer into a 202
    assert r.status_code == 503, r.text
    assert r.json()["message"] == UNREACHABLE
    assert credits_service.hub_token not in r.text
    assert "Traceback" not in r.text
    assert hub.containers(docker_client) == []
    if mode != "refused":
        assert faults.requests, "the hub never asked the API"

    # the API is back: the same member gets both GPUs, and pays exactly once
    faults.set("forward")
    clock.at(1)  # a new run of the server (runs are told apart by their start time)
    await spawn_ready(hub, member, "gpu2")
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00")], hub)
    assert credits_service.hub_token not in hub.log()


async def test_debit_whose_answer_was_lost_is_refunded(credits_hub, clock, faults, admin, member):
    faults.set("answer_lost")
    hub = await credits_hub(url=faults.url)
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    r = await hub.spawn(member, {"profile": "gpu"})
    assert r.status_code == 503, r.text
    faults.set("forward")
    # the debit was made; the meter finds it and gives it back
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("refund", "1.00")], hub)
    clock.at(1)
    await spawn_ready(hub, member)
    assert await balance(admin, member) == Decimal("9.00")


async def test_a_stop_while_the_debit_is_unanswered_refunds_it(
    credits_hub, clock, faults, admin, member, docker_client
):
    # the member presses Stop while the spawn's debit is on its way: the ledger has it,
    # the hub has no answer yet; JupyterHub cancels the start, and the debit comes back
    faults.set("answer_lost")
    hub = await credits_hub(url=faults.url)
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    spawn = asyncio.create_task(hub.spawn(member, {"profile": "gpu"}))

    async def debit_made():
        return await ledger(admin, member) == [("grant", "10.00"), ("debit", "1.00")]

    await eventually(debit_made, what="the debit in the ledger")
    assert not spawn.done()  # the hub still waits for the debit's answer
    await hub.stop_server(member)
    await spawn
    faults.set("forward")
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("refund", "1.00")], hub)
    [refund] = [t for t in await entries(admin, member) if t.kind == "refund"]
    assert "was stopped before it started" in refund.reason
    assert hub.containers(docker_client) == []
    # nothing is held: the next start gets a GPU and pays once
    clock.at(1)
    await spawn_ready(hub, member)
    await settles(
        admin,
        member,
        [("grant", "10.00"), ("debit", "1.00"), ("refund", "1.00"), ("debit", "1.00")],
        hub,
    )


async def test_fail_open_starts_unpaid_and_charges_when_the_api_answers(
    credits_hub, faults, admin, member
):
    faults.set("error500")
    hub = await credits_hub(url=faults.url, GPUHUB_CREDITS_FAIL_OPEN="1")
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    await spawn_ready(hub, member)
    assert "starting it unpaid (fail_open)" in hub.log()
    assert await ledger(admin, member) == [("grant", "10.00")]
    faults.set("forward")
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00")], hub)
    assert await running(hub, member)


async def test_debit_before_a_failed_start_is_refunded(
    credits_hub, clock, admin, member, docker_client
):
    hub = await credits_hub()
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    r = await hub.spawn(member, {"profile": "broken"})
    assert r.status_code >= 400, r.text
    assert "not on this node" in r.json()["message"]
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("refund", "1.00")], hub)
    [_, debit, refund] = await entries(admin, member)
    assert refund.debit_id == debit.transaction_id
    assert hub.containers(docker_client) == []
    clock.at(1)
    await spawn_ready(hub, member, "gpu2")  # both GPUs are free again
    assert await balance(admin, member) == Decimal("9.00")


# -- metering ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "how",
    [pytest.param(signal.SIGTERM, id="clean-restart"), pytest.param(signal.SIGKILL, id="kill-9")],
)
async def test_three_intervals_across_a_hub_restart_then_a_pro_rata_refund(
    credits_hub, clock, admin, member, how
):
    hub = await credits_hub()
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    await spawn_ready(hub, member)
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00")], hub)

    clock.at(900)
    three = [("grant", "10.00"), ("debit", "1.00"), ("debit", "1.00")]
    await settles(admin, member, three, hub)

    await hub.restart(how)
    await settles(admin, member, three, hub)  # no interval charged twice
    assert await running(hub, member)
    assert "intervals [0, 1] paid" in hub.log()  # from spawner state, not replays
    assert ", replay)" not in hub.log()

    clock.at(1800)
    await settles(admin, member, three + [("debit", "1.00")], hub)

    clock.at(2025)  # a quarter of the third interval used
    await hub.stop_server(member)
    final = three + [("debit", "1.00"), ("refund", "0.75")]
    await settles(admin, member, final, hub)
    *_, last_debit, refund = await entries(admin, member)
    assert refund.debit_id == last_debit.transaction_id
    assert [t.metadata["interval"] for t in await entries(admin, member) if t.kind == "debit"] == [
        "0",
        "1",
        "2",
    ]
    assert await balance(admin, member) == Decimal("7.75")


async def test_hub_killed_mid_spawn_after_the_debit_keeps_no_credit(
    credits_hub, clock, admin, member, docker_client
):
    # the debit is made, the container exists, and the hub dies before it saves any state
    hub = await credits_hub(extra_config="c.GPUDockerSpawner.http_timeout = 5\n")
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    spawn = asyncio.create_task(hub.spawn(member, {"profile": "hangs"}))

    async def container_runs():  # created but not started yet would be a stopped server
        return [c for c in hub.containers(docker_client) if c["State"] == "running"]

    await eventually(container_runs, what="the container running")
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00")], hub, seconds=0)
    assert not spawn.done()  # Spawner.start has not returned: no state saved yet
    hub.kill(signal.SIGKILL)
    spawn.cancel()  # its answer died with the hub
    clock.at(300)  # a third of the paid interval passes while the hub is down
    await hub.start()
    # the restarted hub finds the server that never answered and stops it: what its
    # container's labels say was paid is settled, two thirds of the interval come back
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("refund", "0.66")], hub)
    assert hub.containers(docker_client) == []
    assert "re-adopted its hook state (credits, culling)" in hub.log()


async def test_servers_starting_when_the_hub_was_killed_are_adopted_by_the_next_hub(
    credits_hub, admin, member, docker_client
):
    # two servers are starting (containers up, debits made, not answering yet) when the
    # hub dies; the next hub finds them where their containers serve, not at the address
    # JupyterHub's database holds for a server that never got one
    hub = await credits_hub()
    members = [member + "a", member + "b"]
    tokens = {name: await hub.create_user(name) for name in members}
    for name in members:
        await grant(admin, name, "10.00")
    spawns = [asyncio.create_task(hub.spawn(name, {"profile": "slow"})) for name in members]

    async def both_containers_up():
        return [c["State"] for c in hub.containers(docker_client)] == ["running"] * 2

    await eventually(both_containers_up, what="both containers running")
    for name in members:
        await settles(admin, name, [("grant", "10.00"), ("debit", "1.00")], hub, seconds=0)
    assert not any(spawn.done() for spawn in spawns)  # both still starting
    before = {
        c["Labels"]["io.gpuhub.user"]: (c["Id"], c["Labels"]["io.gpuhub.devices"])
        for c in hub.containers(docker_client)
    }
    hub.kill(signal.SIGKILL)
    for spawn in spawns:
        spawn.cancel()
    await hub.start()

    for name in members:
        await eventually(
            lambda name=name: running(hub, name),
            timeout=90,
            what=f"{name}'s server ready under the new hub",
        )
    after = {
        c["Labels"]["io.gpuhub.user"]: (c["Id"], c["Labels"]["io.gpuhub.devices"])
        for c in hub.containers(docker_client)
    }
    assert after == before  # the same containers, not new ones
    boss = await hub.login("boss", groups=[ADMINS])
    board = (await hub.browser_api(boss, "GET", "/gpuhub/gpus")).json()["devices"]
    assert {d["uuid"]: d["owner"]["user"] for d in board if d["owner"]} == {
        devices: name for name, (_, devices) in before.items()
    }
    for name in members:
        out = await terminal_run(
            hub, name, tokens[name], "echo GPU=$NVIDIA_VISIBLE_DEVICES=END", expect="=END"
        )
        assert f"GPU={before[name][1]}=END" in out, out
        # metered once: the spawn's debit, no second one and no refund
        await settles(admin, name, [("grant", "10.00"), ("debit", "1.00")], hub)
    assert "does not appear to be running" not in hub.log()


# A hook after the credits hook that holds every start of the "gpu2" profile between its
# debit and its container (defined in the hub's config file: the hub imports hub_ext only)
STALL_AFTER_DEBIT = """
import asyncio
from traitlets.config import SingletonConfigurable

from hub_ext.spawn.hooks import Hook

class StallAfterDebit(Hook, SingletonConfigurable):
    name = "stall"

    async def before_container(self, spawner):
        if spawner.profile_slug == "gpu2":
            spawner.log.info("Stalling the start of %s after its debit", spawner._log_name)
            await asyncio.sleep(600)

    async def undo(self, spawner):
        pass

c.GPUDockerSpawner.before_container_hooks.append(StallAfterDebit.instance())
"""


async def test_hub_killed_between_the_debit_and_the_container_refunds_the_debit(
    credits_hub, clock, admin, member, docker_client
):
    # the debit is made, no container exists yet, and the hub dies: the write-ahead
    # record in the hub database lets the restarted hub give the whole debit back
    hub = await credits_hub(extra_config=STALL_AFTER_DEBIT)
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    spawn = asyncio.create_task(hub.spawn(member, {"profile": "gpu2"}))
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00")], hub, seconds=0)
    await eventually(lambda: _contains(_log(hub), "after its debit"), what="the stall")
    assert hub.containers(docker_client) == []
    hub.kill(signal.SIGKILL)
    spawn.cancel()
    clock.at(300)
    await hub.start()
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("refund", "1.00")], hub)
    assert await balance(admin, member) == Decimal("10.00")
    [refund] = [t for t in await entries(admin, member) if t.kind == "refund"]
    assert "did not finish" in refund.reason
    # nothing is held: the member's server is gone and both GPUs are free
    assert await hub.stopped(member)
    assert (await hub.api("GET", "/gpuhub/availability")).json()["free"] == 2


async def _log(hub) -> str:
    return hub.log()


async def test_admin_stop_refunds_the_unused_credits(credits_hub, clock, admin, member):
    # no meter passes at all: the stop itself settles
    hub = await credits_hub(extra_config="c.CreditsHook.meter_period = 3600\n")
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    await spawn_ready(hub, member)
    clock.at(300)  # a third of the interval used
    r = await hub.api("DELETE", f"/users/{member}/server")  # the admin's token
    assert r.status_code in (202, 204), r.text
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("refund", "0.66")], hub)


@pytest.mark.parametrize(
    "how",
    [pytest.param(signal.SIGTERM, id="clean-restart"), pytest.param(signal.SIGKILL, id="kill-9")],
)
async def test_refund_owed_while_the_api_was_down_survives_a_hub_restart(
    credits_hub, clock, faults, admin, member, docker_client, how
):
    hub = await credits_hub(url=faults.url)
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    await spawn_ready(hub, member)
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00")], hub)

    faults.set("refused")  # the Credits API cannot be reached
    clock.at(300)  # a third of the interval used
    await hub.stop_server(member)  # the stop itself succeeds and frees the GPU
    assert hub.containers(docker_client) == []
    assert (await hub.api("GET", "/gpuhub/availability")).json()["free"] == 2
    assert await ledger(admin, member) == [("grant", "10.00"), ("debit", "1.00")]

    hub.kill(how)  # before the API came back: the refund is owed by the next hub
    faults.set("forward")
    clock.at(5000)  # time passes; the refund is for the stop, not for the restart
    await hub.start()
    owed = [("grant", "10.00"), ("debit", "1.00"), ("refund", "0.66")]
    await settles(admin, member, owed, hub)
    [_, debit, refund] = await entries(admin, member)
    assert refund.debit_id == debit.transaction_id

    await hub.restart()
    await settles(admin, member, owed, hub)  # settled once: nothing more after a restart
    assert await balance(admin, member) == Decimal("9.66")


async def test_server_whose_container_vanished_is_settled_without_stop(
    credits_hub, clock, admin, member, docker_client
):
    hub = await credits_hub()
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    await spawn_ready(hub, member)
    hub.kill(signal.SIGKILL)
    for c in hub.containers(docker_client):
        docker_client.remove_container(c["Id"], force=True)
    clock.at(450)
    await hub.start()  # JupyterHub finds it dead and clears its state without stop()
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("refund", "0.50")], hub)
    assert not await running(hub, member)


async def test_api_down_while_running_keeps_the_server_and_retries(
    credits_hub, clock, faults, admin, member
):
    hub = await credits_hub(url=faults.url, extra_config="c.CreditsHook.grace_period = 0\n")
    await hub.create_user(member)
    await grant(admin, member, "10.00")
    await spawn_ready(hub, member)
    for mode in ("refused", "error500", "hang"):
        faults.set(mode)
        clock.at(900)
        await asyncio.sleep(2)
        assert await running(hub, member), mode
        assert await ledger(admin, member) == [("grant", "10.00"), ("debit", "1.00")]
    faults.set("forward")
    await settles(admin, member, [("grant", "10.00"), ("debit", "1.00"), ("debit", "1.00")], hub)
    assert await running(hub, member)


async def test_server_stops_after_the_grace_period_when_credits_run_out(
    credits_hub, clock, admin, member, docker_client
):
    hub = await credits_hub()
    await hub.create_user(member)
    await grant(admin, member, "1.00")
    await spawn_ready(hub, member)
    assert await balance(admin, member) == Decimal("0.00")

    clock.at(900)  # the second interval cannot be paid: the grace period begins
    await eventually(
        lambda: _contains(home_page(hub, member), "Your credits ran out"), what="grace notice"
    )
    assert "balance 0.00" in await home_page(hub, member)
    assert await running(hub, member)

    clock.at(900 + 299)
    await asyncio.sleep(1)
    assert await running(hub, member)

    clock.at(900 + 301)
    await eventually(lambda: _not(running(hub, member)), what="server stopped")
    page = await home_page(hub, member)
    assert "Your server was stopped because your credits ran out (balance 0.00)." in page
    assert await ledger(admin, member) == [("grant", "1.00"), ("debit", "1.00")]
    await eventually(lambda: _empty(hub.containers(docker_client)), what="container removed")
    # the run record says why it ended
    engine = create_engine(f"sqlite:///{hub.state_dir / 'jupyterhub.sqlite'}")
    with Session(engine) as db:
        assert [(r.username, r.stop_reason) for r in db.scalars(select(ServerRun))] == [
            (member, "credits")
        ]
    engine.dispose()


async def test_credits_added_in_the_grace_period_keep_the_server(credits_hub, clock, admin, member):
    hub = await credits_hub()
    await hub.create_user(member)
    await grant(admin, member, "1.00")
    await spawn_ready(hub, member)
    clock.at(900)
    await eventually(
        lambda: _contains(home_page(hub, member), "Your credits ran out"), what="grace notice"
    )
    await grant(admin, member, "5.00")
    await settles(
        admin,
        member,
        [("grant", "1.00"), ("debit", "1.00"), ("grant", "5.00"), ("debit", "1.00")],
        hub,
    )
    clock.at(900 + 600)
    await asyncio.sleep(1)
    assert await running(hub, member)
    assert "Your credits ran out" not in await home_page(hub, member)


async def _contains(awaitable, text) -> bool:
    return text in await awaitable


async def _not(awaitable) -> bool:
    return not await awaitable


async def _empty(value) -> bool:
    return not value


# -- the default: the reference service managed by the hub -------------------------------------


async def test_default_runs_the_reference_service_for_the_hub(hub_factory, clock, tmp_path, member):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(PROFILES)
    port = random_port()
    env = {k: "" for k in os.environ if k.startswith("GPUHUB_CREDITS")}
    hub = await hub_factory(
        extra_config=clock.hub_config() + FAST,
        GPUHUB_PROFILES=str(profiles),
        GPUHUB_CREDITS_PORT=str(port),
        **env,
    )
    admin_token = (hub.state_dir / ADMIN_TOKEN_FILE).read_text().strip()
    for name in (HUB_TOKEN_FILE, ADMIN_TOKEN_FILE):
        assert stat.S_IMODE((hub.state_dir / name).stat().st_mode) == 0o600
    assert admin_token not in hub.log()

    url = f"http://127.0.0.1:{port}/services/credits/"
    async with CreditsClient(url=url, token=admin_token, max_attempts=1) as admin:

        async def up():
            try:
                await admin.grant(member, "3.00", key=f"test-grant-{member}")
                return True
            except Exception:  # noqa: BLE001 - not listening yet
                return False

        await eventually(up, what="managed credits service answering")
        await hub.create_user(member)
        await spawn_ready(hub, member)
        assert await ledger(admin, member) == [("grant", "3.00"), ("debit", "1.00")]

    # and through the proxy, under the service's prefix
    async with httpx.AsyncClient() as http:
        r = await http.get(
            f"{hub.url}/services/credits/v1/accounts/{member}",
            headers={"Authorization": f"Bearer {admin_token}"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["balance"] == "2.00"


# -- affordability before the GPU -------------------------------------------------------------


async def test_members_who_cannot_pay_never_hold_the_gpu(
    credits_hub, clock, admin, member, docker_client
):
    # one GPU, four members without credits and one who can pay, all at once: the ones
    # who cannot pay are refused before they reserve anything, so the GPU is never held
    # by a start that is refused anyway and nobody hears "No GPU free"
    hub = await credits_hub(GPUHUB_GPUS="simulated:1")
    poor = [f"{member}p{i}" for i in range(4)]
    for name in [member, *poor]:
        await hub.create_user(name)
    await grant(admin, member, "50.00")
    for round_ in range(20):
        clock.at(round_)  # each round is a new run of the server
        everyone = [member, *poor]
        answers = await asyncio.gather(*(hub.spawn(name, {"profile": "gpu"}) for name in everyone))
        said = {name: (r.status_code, r.text) for name, r in zip(everyone, answers, strict=True)}
        assert not any("No GPU free" in text for _, text in said.values()), (round_, said)
        assert said[member][0] in (201, 202), (round_, said)
        for name in poor:
            code, text = said[name]
            assert code == 402, (round_, said)
            assert json.loads(text)["message"].startswith(
                "This profile costs 4.00 credits per hour; your balance is 0.00."
            ), text
        await hub.wait_ready(member)
        await hub.stop_server(member)
    assert [kind for kind, _ in await ledger(admin, member)].count("debit") == 20
