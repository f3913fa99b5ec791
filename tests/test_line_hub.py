"""The line of members waiting for a GPU, in a real hub with real containers.

One simulated GPU unless a test says otherwise; credits off except where a test is about
them.  A member joins the line by asking to wait (``user_options["wait"]``); the spawn
request stays pending (JupyterHub answers 202 after its ``slow_spawn_timeout``), so the
tests send it in the background and watch the member's place through
``GET /hub/api/gpuhub/line``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from hub_ext.common.runs import ServerRun
from hub_ext.ops.board import CLI_TOKEN_FILE
from tests.fixtures.hub import eventually

pytestmark = [pytest.mark.docker, pytest.mark.hub]

PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {"display_name": "PyTorch", "slug": "gpu", "gpus": 1},
    {"display_name": "PyTorch again", "slug": "gpu-b", "gpus": 1},
    {"display_name": "Staff only", "slug": "staff", "gpus": 1, "allowed_groups": ["staff"]},
    {"display_name": "Paid", "slug": "paid", "gpus": 1, "credits_per_hour": 4},
]

QUICK = "c.Line.update_interval = 0.2\nc.GPUPool.refresh_interval = 0.2\n"


@pytest.fixture
async def line_hub(hub_factory, tmp_path):
    """A hub factory: ``make(gpus=1, extra_config="", **env)``; members get tokens with
    ``hub.tokens[name]`` after ``await add(hub, name)``."""
    path = tmp_path / "profiles.json"
    path.write_text(json.dumps(PROFILES))

    async def make(gpus: int = 1, extra_config: str = "", **env):
        env.setdefault("GPUHUB_CREDITS", "off")
        hub = await hub_factory(
            extra_config=QUICK + extra_config,
            GPUHUB_PROFILES=str(path),
            GPUHUB_GPUS=f"simulated:{gpus}",
            **env,
        )
        hub.tokens, hub.pending = {}, []
        hubs.append(hub)
        return hub

    hubs = []
    yield make
    for hub in hubs:  # the spawn requests still pending when the test ended
        for task in hub.pending:
            task.cancel()
        await asyncio.gather(*hub.pending, return_exceptions=True)


async def add(hub, *names):
    for name in names:
        hub.tokens[name] = await hub.create_user(name)


async def places(hub, name: str) -> list[dict]:
    r = await hub.api("GET", "/gpuhub/line", token=hub.tokens[name])
    assert r.status_code == 200, r.text
    return r.json()["places"]


async def position(hub, name: str) -> int | None:
    mine = await places(hub, name)
    return mine[0]["position"] if mine else None


async def join_line(hub, name: str, profile: str = "gpu", server: str = ""):
    """Ask to wait for ``profile``; returns once ``name`` has a place in line."""
    hub.pending.append(
        asyncio.create_task(hub.spawn(name, {"profile": profile, "wait": True}, server=server))
    )
    return await eventually(lambda: position(hub, name), what=f"{name} in line")


async def start(hub, name: str, profile: str = "gpu"):
    r = await hub.spawn(name, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(name)


def runs_of(hub, name: str) -> list[ServerRun]:
    engine = create_engine(f"sqlite:///{hub.state_dir / 'jupyterhub.sqlite'}")
    try:
        with Session(engine) as s:
            return list(s.scalars(select(ServerRun).where(ServerRun.username == name)))
    finally:
        engine.dispose()


async def test_waiting_members_start_in_turn_without_asking_again(line_hub):
    hub = await line_hub()
    await add(hub, "alice", "bob", "carol")
    await start(hub, "alice")
    assert await join_line(hub, "bob") == 1
    assert await join_line(hub, "carol") == 2
    sentence = (await places(hub, "carol"))[0]["sentence"]
    assert sentence.startswith("You are 2nd in line for 1 GPU (PyTorch). Estimated wait: ")

    await hub.stop_server("alice")
    await hub.wait_ready("bob")  # no further request from bob
    assert await position(hub, "carol") == 1
    assert await places(hub, "bob") == []
    [run] = runs_of(hub, "bob")
    assert run.line_wait_s is not None and run.line_wait_s > 0  # the start came from the line
    [alice_run] = runs_of(hub, "alice")
    assert alice_run.line_wait_s is None


async def test_newcomer_arriving_as_a_gpu_frees_does_not_overtake_the_line(line_hub):
    hub = await line_hub()
    await add(hub, "alice", "bob", "dave")
    await start(hub, "alice")
    await join_line(hub, "bob")
    holder, waiter = "alice", "bob"
    for _ in range(20):
        # dave asks again and again while the holder stops and the waiter's server starts
        stopping = asyncio.create_task(hub.stop_server(holder))
        asked = 0
        while True:  # dave asks before the first look, so every round sees him ask
            newcomer = await hub.spawn("dave", {"profile": "gpu"})
            asked += 1
            assert newcomer.status_code == 409, newcomer.text
            assert "No GPU free" in newcomer.json()["message"]
            if await hub.running(waiter):
                break
        assert asked >= 1
        await stopping
        assert await hub.stopped("dave")
        await join_line(hub, holder)
        holder, waiter = waiter, holder


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
async def test_line_keeps_its_order_through_a_restart(line_hub, docker_client, signum):
    hub = await line_hub()
    await add(hub, "alice", "bob", "carol", "dave")
    await start(hub, "alice")
    for name in ("bob", "carol", "dave"):
        await join_line(hub, name)
    hub.kill(signum)
    for task in hub.pending:
        task.cancel()
    hub.pending.clear()
    await hub.start()

    assert [await position(hub, n) for n in ("bob", "carol", "dave")] == [1, 2, 3]
    assert await hub.running("alice")  # still holds the GPU; nobody was started on it

    async def all_waiting():
        return all([(await places(hub, n))[0]["waiting"] for n in ("bob", "carol", "dave")])

    await eventually(all_waiting, timeout=60, what="the waiting spawns started again")
    assert [await position(hub, n) for n in ("bob", "carol", "dave")] == [1, 2, 3]
    await hub.stop_server("alice")
    await hub.wait_ready("bob")
    assert [await position(hub, n) for n in ("carol", "dave")] == [1, 2]
    running = [c for c in hub.containers(docker_client) if c["State"] == "running"]
    assert len(running) == 1  # one GPU, one server


async def test_leaving_the_line_or_stopping_the_pending_server_ends_the_place(line_hub):
    hub = await line_hub()
    await add(hub, "alice", "bob", "carol")
    await start(hub, "alice")
    await join_line(hub, "bob")
    await join_line(hub, "carol")

    r = await hub.api("DELETE", "/gpuhub/line/bob/", token=hub.tokens["bob"])
    assert r.status_code == 204, r.text
    await eventually(lambda: hub.stopped("bob"), what="bob's pending server gone")
    assert await places(hub, "bob") == []
    assert await position(hub, "carol") == 1

    r = await hub.api("DELETE", "/gpuhub/line/carol/", token=hub.tokens["bob"])
    assert r.status_code == 403, r.text  # nobody else's place
    await hub.stop_server("carol")
    assert await places(hub, "carol") == []
    await hub.stop_server("alice")
    assert await hub.stopped("bob") and await hub.stopped("carol")  # nobody started


async def test_place_expires_after_the_maximum_wait(line_hub):
    hub = await line_hub(extra_config="c.Line.max_wait = 3\n")
    await add(hub, "alice", "bob")
    await start(hub, "alice")
    await join_line(hub, "bob")
    await eventually(lambda: hub.stopped("bob"), what="bob's place expired")
    assert await places(hub, "bob") == []
    assert "expired: no GPU freed within 3 s" in hub.log()


async def test_member_limit_counts_places_and_one_place_per_profile(line_hub):
    hub = await line_hub(GPUHUB_MAX_GPUS_PER_USER="1", GPUHUB_NAMED_SERVER_LIMIT="2")
    await add(hub, "alice", "bob")
    await start(hub, "alice")
    await join_line(hub, "bob")
    r = await hub.spawn("bob", {"profile": "gpu", "wait": True}, server="second")
    assert r.status_code == 409, r.text
    assert "You are already in line for PyTorch (your default server)" in r.json()["message"]
    r = await hub.spawn("bob", {"profile": "gpu-b", "wait": True}, server="third")
    assert r.status_code == 409, r.text
    assert r.json()["message"].startswith(
        "You already hold or wait for 1 GPU(s) and each member may hold 1."
    )
    assert [p["server"] for p in await places(hub, "bob")] == [""]


async def test_refusals_instead_of_a_place(line_hub, credits_service):
    hub = await line_hub(
        GPUHUB_CREDITS="on",
        GPUHUB_CREDITS_URL=credits_service.url,
        GPUHUB_CREDITS_TOKEN=credits_service.hub_token,
    )
    poor = f"p{uuid.uuid4().hex[:10]}"
    await add(hub, "alice", poor)
    await start(hub, "alice")  # the free GPU profile: nobody pays

    r = await hub.spawn(poor, {"profile": "paid", "wait": True})
    assert r.status_code == 402, r.text  # cannot pay: refused, not queued
    assert "your balance is 0.00." in r.json()["message"]
    r = await hub.spawn(poor, {"profile": "staff", "wait": True})
    assert r.status_code == 400, r.text  # forged: a profile not open to this member
    assert "The profile 'staff' is not open to your groups." in r.json()["message"]
    r = await hub.spawn(poor, {"profile": "gpu"})
    assert r.status_code == 409, r.text  # no GPU and no wait asked: refused as before
    assert r.json()["message"].startswith("No GPU free: all 1 GPUs are in use.")
    assert await places(hub, poor) == []


async def progress_messages(client, name: str, until: str) -> list[str]:
    """The messages of ``name``'s progress event stream, read until one contains ``until``."""
    xsrf = next((c.value for c in client.cookies.jar if c.name == "_xsrf"), "")
    seen = []
    async with client.stream(
        "GET", f"/hub/api/users/{name}/server/progress", headers={"X-XSRFToken": xsrf}
    ) as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                seen.append(json.loads(line[5:]).get("message", ""))
                if until in seen[-1]:
                    return seen
    raise AssertionError(f"no {until!r} in {seen}")


async def test_pages_offer_the_wait_and_show_the_place(line_hub):
    from tests.fixtures.oidc import ADMINS, MEMBERS

    hub = await line_hub()
    await add(hub, "alice", "carol")
    await start(hub, "alice")
    bob = await hub.login("bob")
    hub.tokens["bob"] = await hub.create_user("bob")
    page = (await bob.get("/hub/spawn")).text
    assert 'name="gpuhub_wait"\n            value="gpu" >Wait for a GPU</button>' in page
    assert "No GPU free: all 1 GPUs are in use." in page  # the refusal sentence stays

    xsrf = next(c.value for c in bob.cookies.jar if c.name == "_xsrf")
    r = await bob.post(
        "/hub/spawn/bob", data={"_xsrf": xsrf, "profile": "cpu", "gpuhub_wait": "gpu"}
    )
    assert r.status_code == 200, r.text[:500]
    assert await position(hub, "bob") == 1
    messages = await progress_messages(bob, "bob", "in line")
    assert "You are 1st in line for 1 GPU (PyTorch). Estimated wait: " in messages[-1]
    home = (await bob.get("/hub/home")).text
    assert "You are 1st in line for 1 GPU (PyTorch)." in home
    assert "Leave the line" in home

    boss = await hub.login("boss", groups=[MEMBERS, ADMINS])
    await join_line(hub, "carol")
    board = (await hub.browser_api(boss, "GET", "/gpuhub/gpus")).json()
    assert [(p["user"], p["position"], p["profile_name"]) for p in board["line"]] == [
        ("bob", 1, "PyTorch"),
        ("carol", 2, "PyTorch"),
    ]
    assert "Move to front" in (await boss.get("/hub/gpus")).text
    cli = (hub.state_dir / CLI_TOKEN_FILE).read_text().strip()  # reads the board only
    for method, path in (("POST", "/gpuhub/line/carol//front"), ("DELETE", "/gpuhub/line/bob/")):
        r = await hub.api(method, path, token=cli)
        assert r.status_code == 403, r.text
    r = await hub.browser_api(boss, "POST", "/gpuhub/line/carol//front")
    assert r.status_code == 200, r.text
    assert await position(hub, "carol") == 1 and await position(hub, "bob") == 2
    r = await hub.browser_api(bob, "POST", "/gpuhub/line/bob//front")
    assert r.status_code == 403, r.text  # members cannot jump the line
    r = await hub.browser_api(boss, "DELETE", "/gpuhub/line/bob/")
    assert r.status_code == 204, r.text
    await eventually(lambda: hub.stopped("bob"), what="bob's place removed")
    await hub.stop_server("alice")
    await hub.wait_ready("carol")


async def test_waiting_members_do_not_use_up_the_hubs_server_limits(line_hub):
    """A place in line holds nothing, so it does not count against the limits on servers
    starting at once or running at once: with both limits at 2 and two members waiting,
    a CPU server still starts, and the limit still refuses the next one in a sentence."""
    hub = await line_hub(GPUHUB_CONCURRENT_SPAWN_LIMIT="2", GPUHUB_ACTIVE_SERVER_LIMIT="2")
    await add(hub, "alice", "bob", "carol", "dave", "erin")
    await start(hub, "alice")
    assert await join_line(hub, "bob") == 1
    assert await join_line(hub, "carol") == 2

    await start(hub, "dave", profile="cpu")  # two waiting spawns are not "starting"

    r = await hub.spawn("erin", {"profile": "cpu"})  # alice and dave run: 2 of 2
    assert r.status_code == 429, r.text
    assert "servers" in r.json()["message"] and "Try again" in r.json()["message"]
    assert await position(hub, "bob") == 1 and await position(hub, "carol") == 2
