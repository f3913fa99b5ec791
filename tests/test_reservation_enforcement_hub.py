"""Reservations enforced in a real hub: the warning, the stop at the start (across a kill -9),
the group first, the others refused with the reason, the line served after the window.

Everything is real: JupyterHub and its proxy, Docker containers, the OIDC provider (whose
groups claim makes JupyterHub's groups), the reference credits service, and two GPUs read
through the real pynvml bindings from the NVML stand-in.  The hub's clock
(``c.Reservations.utcnow``, ``c.Culler.utcnow``, ``c.CreditsHook.utcnow``) is a file the
test moves (:class:`MovableClock`): the reservation starts an hour after the test does.

The "gpu" profile costs 4 credits per hour (1.00 per 15-minute interval).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from hub_ext.common.runs import ServerRun
from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.fixtures.hub import eventually
from tests.fixtures.oidc import MEMBERS

pytestmark = [pytest.mark.docker, pytest.mark.hub]

GPUS = [f"GPU-24242424-0000-0000-0000-00000000000{i}" for i in (0, 1)]
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "One GPU", "slug": "gpu", "gpus": 1, "credits_per_hour": 4},
]
START, END = 3600, 7200  # the window, in seconds after the test's start


def node() -> dict:
    """Two busy GPUs (no GPU-idle cull while the clock jumps)."""
    return {
        "devices": [
            {
                "uuid": uuid,
                "name": "Stand-in",
                "memory_total_mib": 16384,
                "memory_used_mib": 0,
                "utilization_gpu": 90,
            }
            for uuid in GPUS
        ]
    }


def hhmm(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M UTC")


def until(start: float, end: float) -> str:
    """A window's end as sentences write it: "16:00 UTC", with its date when the window
    began on another day ("Thu 2027-01-07 22:34 UTC")."""
    a, b = (datetime.fromtimestamp(t, UTC) for t in (start, end))
    return hhmm(end) if a.date() == b.date() else f"{b:%a %Y-%m-%d %H:%M} UTC"


def span(start: float, end: float) -> str:
    """ "from Tue 2026-12-08 14:00 UTC to 16:00 UTC"."""
    return f"from {datetime.fromtimestamp(start, UTC):%a %Y-%m-%d %H:%M} UTC to {until(start, end)}"


async def home(browser) -> str:
    r = await browser.get("/hub/home")
    assert r.status_code == 200, r.text[:500]
    return r.text


async def page_says(browser, text: str) -> bool:
    return text in await home(browser)


async def ledger(admin, user) -> list[tuple[str, str]]:
    return [(t.kind, str(t.amount)) async for t in admin.iter_transactions(user)][::-1]


def last_run(hub, name: str) -> ServerRun:
    engine = create_engine(f"sqlite:///{hub.state_dir / 'jupyterhub.sqlite'}")
    try:
        with Session(engine) as s:
            return list(
                s.scalars(
                    select(ServerRun).where(ServerRun.username == name).order_by(ServerRun.id)
                )
            )[-1]
    finally:
        engine.dispose()


async def spawn_ready(hub, user):
    r = await hub.spawn(user, {"profile": "gpu"})
    assert r.status_code in (201, 202), r.text
    return await hub.wait_ready(user)


async def test_a_reservation_stops_a_non_member_at_its_start_and_serves_its_group_first(
    gpu_hub, movable_clock, ledger_admin, credits_username, docker_client
):
    clock = movable_clock
    # the line's own checks are rare: a grant at the window's end comes from the end itself
    hub = await gpu_hub(
        node(),
        PROFILES,
        clock.hub_config("Reservations")
        + "c.Reservations.check_interval = 0.2\nc.Line.update_interval = 30\n",
    )
    amy, dan, eve, bob = (f"{credits_username}-{n}" for n in ("amy", "dan", "eve", "bob"))
    await hub.login(bob, groups=[MEMBERS, "ml101"])  # makes the group ml101
    browsers = {name: await hub.login(name) for name in (amy, dan, eve)}
    for name in (amy, dan, eve, bob):
        await ledger_admin.grant(name, "10.00", key=f"test-grant-{name}")
    await spawn_ready(hub, amy)
    await spawn_ready(hub, dan)  # the most recently started: the one to make way

    # 1 of the 2 GPUs for ml101, from an hour from now for an hour
    cli = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    at = lambda s: datetime.fromtimestamp(clock.start + s, UTC).isoformat()  # noqa: E731
    r = await hub.api(
        "POST",
        "/gpuhub/reservations",
        token=cli,
        json={"group": "ml101", "gpus": 1, "start": at(START), "end": at(END)},
    )
    assert r.status_code == 201, r.text
    window = f"1 GPU is reserved for ml101 {span(clock.start + START, clock.start + END)}"

    clock.at(START - 800)  # within the 15 minutes' warning (the pass comes late: 15 min left)
    await eventually(
        lambda: page_says(
            browsers[dan],
            f"Your server will be stopped in about 15 min: {window}, and it holds a GPU they need.",
        ),
        what="the warning on dan's home page",
    )
    assert "will be stopped" not in await home(browsers[amy])  # one GPU is enough

    # the hub dies at the window's start, before it stopped anyone; the next one does it
    hub.kill()
    clock.at(START + 300)
    await hub.start()
    await eventually(lambda: hub.stopped(dan), what="dan's server stopped")
    assert await hub.running(amy)
    run = last_run(hub, dan)
    assert (run.stop_reason, run.stop_detail) == (
        "reservation",
        f"{window}, and your server held a GPU they need",
    )
    assert f"Your server was stopped: {window}" in await home(browsers[dan])
    # five intervals paid (0 to 4), two thirds of the last refunded
    expected = [("grant", "10.00")] + [("debit", "1.00")] * 5 + [("refund", "0.66")]
    await eventually(lambda: _equals(ledger(ledger_admin, dan), expected), what=str(expected))

    # the free GPU is the group's: eve is refused with the reason, on the card too
    reason = f"1 GPU reserved for ml101 until {until(clock.start + START, clock.start + END)}"
    r = await hub.spawn(eve, {"profile": "gpu"})
    assert r.status_code == 409 and reason in r.json()["message"], r.text
    spawn_page = await browsers[eve].get("/hub/spawn")
    assert reason in spawn_page.text
    # eve waits in line for it; bob, in ml101, passes her and starts on it at once
    waiting = asyncio.create_task(hub.spawn(eve, {"profile": "gpu", "wait": True}))
    try:
        await eventually(lambda: _in_line(hub, browsers[eve]), what="eve in line")
        model = await spawn_ready(hub, bob)
        assert model["ready"]
        board = (await hub.api("GET", "/gpuhub/gpus", token=cli)).json()
        assert board["reserved"] == [f"{reason} (1 held by its members)"], board
        # bob's stop frees the reserved GPU, which stays the group's
        await hub.stop_server(bob)
        await asyncio.sleep(1.5)  # several passes and line checks
        assert await _in_line(hub, browsers[eve])
        # the window ends: the GPU goes to the head of the line at once
        clock.at(END + 1)
        await eventually(
            lambda: _not(_in_line(hub, browsers[eve])),
            timeout=3,
            what="eve's turn at the window's end",
        )
        await hub.wait_ready(eve)
    finally:
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)


async def test_a_window_that_begins_at_once_warns_a_non_member_before_it_stops_her(
    gpu_hub, movable_clock, ledger_admin, credits_username
):
    """Issue 28: both GPUs reserved from now for 30 days stopped alice's server (she is not
    in the group) at the next pass, 9 s later: the warning time never came, because the
    window was open before any warning.  Now she is warned at once and stopped when the
    warning time (15 minutes) is up; the sentences carry the dates."""
    clock = movable_clock
    hub = await gpu_hub(
        node(), PROFILES, clock.hub_config("Reservations") + "c.Reservations.check_interval = 0.2\n"
    )
    alice, bob = f"{credits_username}-alice", f"{credits_username}-bob"
    await hub.login(bob, groups=[MEMBERS, "ml101"])  # makes the group ml101
    browser = await hub.login(alice)
    await ledger_admin.grant(alice, "10.00", key=f"test-grant-{alice}")
    await spawn_ready(hub, alice)

    cli = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()
    start, end = clock.start, clock.start + 30 * 86400
    r = await hub.api(
        "POST",
        "/gpuhub/reservations",
        token=cli,
        json={
            "group": "ml101",
            "gpus": 2,
            "start": datetime.fromtimestamp(start, UTC).isoformat(),
            "end": datetime.fromtimestamp(end, UTC).isoformat(),
        },
    )
    assert r.status_code == 201, r.text
    window = f"2 GPUs are reserved for ml101 {span(start, end)}"
    assert until(start, end) != hhmm(end)  # the end's date is named
    await eventually(
        lambda: page_says(
            browser,
            f"Your server will be stopped in about 15 min: {window}, and it holds a GPU they need.",
        ),
        what="the warning on alice's home page",
    )
    await asyncio.sleep(2)  # ten passes
    assert await hub.running(alice)
    clock.at(600)
    await eventually(
        lambda: page_says(browser, "Your server will be stopped in about 5 min: "),
        what="5 minutes left",
    )
    assert await hub.running(alice)
    clock.at(901)
    await eventually(lambda: hub.stopped(alice), what="alice's server stopped")
    run = last_run(hub, alice)
    assert (run.stop_reason, run.stop_detail) == (
        "reservation",
        f"{window}, and your server held a GPU they need",
    )
    assert f"Your server was stopped: {window}" in await home(browser)


async def _not(awaitable) -> bool:
    return not await awaitable


async def _equals(awaitable, expected) -> bool:
    return await awaitable == expected


async def _in_line(hub, browser) -> bool:
    r = await hub.browser_api(browser, "GET", "/gpuhub/line")
    assert r.status_code == 200, r.text
    return bool(r.json()["places"])
