"""Culling in a real hub: idle GPUs, busy GPUs, maximum age, the idle culler service's scopes.

Everything is real: JupyterHub and its proxy, Docker containers, jupyterhub-idle-culler as
the hub-managed service, the reference credits service, and GPUs read through the real
pynvml bindings from the NVML stand-in, whose utilization the tests rewrite while the hub
runs.  The hub's clock (``c.Culler.utcnow``, ``c.CreditsHook.utcnow``) is a file the test
moves (:class:`MovableClock`); the idle culler service runs on real time.

The "gpu" profile costs 4 credits per hour (1.00 per 15-minute interval), lets its GPU
idle 45 minutes and runs 2 hours at most.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.hub import eventually, terminal_run
from tests.test_slurm_pages import hub_runs

pytestmark = [pytest.mark.docker, pytest.mark.hub]

GPU = "GPU-11111111-2222-3333-4444-000000000000"
PROFILES = [
    {"display_name": "CPU only", "slug": "cpu", "default": True},
    {
        "display_name": "One GPU",
        "slug": "gpu",
        "gpus": 1,
        "credits_per_hour": 4,
        "gpu_idle_timeout": 2700,
        "cull_max_age": 7200,
    },
]


def node(utilization: int) -> dict:
    """A one-GPU node whose GPU reports ``utilization`` percent."""
    return {
        "devices": [
            {
                "uuid": GPU,
                "name": "Stand-in",
                "memory_total_mib": 16384,
                "memory_used_mib": 512,
                "utilization_gpu": utilization,
            }
        ]
    }


@pytest.fixture
def member(credits_username) -> str:
    """A member no other test knows (the ledger is shared by the session)."""
    return credits_username


@pytest.fixture
def clock(movable_clock):
    return movable_clock


@pytest.fixture
def culling_hub(gpu_hub):
    async def make(doc: dict, extra_config: str = "", **env):
        return await gpu_hub(doc, PROFILES, extra_config, **env)

    return make


async def spawn_ready(hub, user, profile):
    r = await hub.spawn(user, {"profile": profile})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready(user)


async def home_page(browser) -> str:
    r = await browser.get("/hub/home")
    assert r.status_code == 200, r.text[:500]
    return r.text


async def culls(hub, reason: str) -> float:
    """gpuhub_culls_total{reason=...} from the hub's /hub/metrics (0 before the first)."""
    r = await hub.client.get("/hub/metrics", headers={"Authorization": f"token {hub.admin_token}"})
    r.raise_for_status()
    m = re.search(rf'^gpuhub_culls_total{{reason="{reason}"}} ([0-9.]+)$', r.text, re.M)
    return float(m.group(1)) if m else 0.0


def usage(hub, *args: str) -> str:
    """``gpuhub usage ARGS`` run with the hub's environment, as an admin would."""
    done = subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "usage", *args],
        capture_output=True,
        text=True,
        env=hub.env,
        cwd=hub.tmp,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_idle_gpu_server_is_culled_and_the_member_told_why(
    culling_hub, clock, ledger_admin, member, docker_client
):
    hub = await culling_hub(node(utilization=0))
    browser = await hub.login(member)
    await ledger_admin.grant(member, "10.00", key=f"test-grant-{member}")
    await spawn_ready(hub, member, "gpu")

    clock.at(2700 - 60)  # a minute before the profile's 45 minutes
    await asyncio.sleep(1)  # several culler passes
    assert await hub.running(member)

    clock.at(2700 + 1)
    await eventually(lambda: hub.stopped(member), what="the idle GPU server culled")
    assert hub.containers(docker_client) == []
    r = await hub.api("GET", "/gpuhub/availability")
    assert r.json()["free"] == 1, r.text
    assert (
        f"Culling {member} (profile gpu, GPU(s) {GPU}): GPU(s) idle for 45 min, "
        "limit 45 min (idle_gpu)" in hub.log()
    )
    assert await culls(hub, "idle_gpu") == 1
    assert "Your server was stopped after 45 min with an idle GPU." in await home_page(browser)

    # the run is on record: 2701 s on one GPU; 4 intervals paid, 899 s of the last refunded
    # (the period is given: the hub's clock ran ahead of the real one)
    period = [
        "--since",
        time.strftime("%Y-%m-%d", time.gmtime(clock.start - 86400)),
        "--until",
        time.strftime("%Y-%m-%d", time.gmtime(clock.start + 2 * 86400)),
    ]
    assert usage(hub, *period, "--csv").splitlines() == [
        "user,servers,gpu_hours,credits,line_starts,average_wait_min",
        f"{member},1,0.75,3.01,0,-",
    ]
    by_group = usage(hub, *period, "--by", "group", "--csv").splitlines()
    assert by_group == [
        "group,servers,gpu_hours,credits,line_starts,average_wait_min",
        "gpu-members,1,0.75,3.01,0,-",
    ]


async def test_busy_gpu_server_is_never_culled_as_idle(culling_hub, clock, ledger_admin, member):
    # the idle culler service stops servers after 2 s without activity (real time)
    hub = await culling_hub(node(utilization=85), GPUHUB_CULL_IDLE_TIMEOUT="2")
    idle, busy = member + "i", member + "b"
    idle_browser = await hub.login(idle)
    await hub.login(busy)
    await ledger_admin.grant(busy, "10.00", key=f"test-grant-{busy}")
    await spawn_ready(hub, busy, "gpu")
    await spawn_ready(hub, idle, "cpu")

    # nobody types in either server; the idle culler stops the one without a busy GPU
    await eventually(lambda: hub.stopped(idle), what="the idle CPU server culled")
    page = await home_page(idle_browser)
    assert re.search(r"Your server was stopped after \d+ s without activity\.", page), page
    assert f"Culling server {idle} (inactive for" in hub.log()  # the culler's own log
    assert await culls(hub, "idle") == 1
    await asyncio.sleep(2.5)  # two more of the idle culler's passes
    assert await hub.running(busy)
    model = await hub.server(busy)
    assert model["last_activity"] > model["started"]  # kept active by its GPU

    clock.at(2700 + 600)  # well past the profile's GPU idle timeout
    await asyncio.sleep(1)  # several culler passes
    assert await hub.running(busy)
    assert await culls(hub, "idle_gpu") == 0


async def test_max_age_warns_the_member_then_stops_even_a_busy_server(
    culling_hub, clock, ledger_admin, member
):
    hub = await culling_hub(node(utilization=90))
    browser = await hub.login(member)
    await ledger_admin.grant(member, "10.00", key=f"test-grant-{member}")
    await spawn_ready(hub, member, "gpu")

    clock.at(7200 - 800)  # within the 15-minute warning
    warning = (
        "Your server will be stopped in about 13 min: the gpu profile allows 2 h "
        "per server. Save your work."
    )
    await eventually(lambda: _contains(home_page(browser), warning), what="the warning")
    assert await hub.running(member)

    clock.at(7200 + 1)
    await eventually(lambda: hub.stopped(member), what="the old server culled")
    page = await home_page(browser)
    assert (
        "Your server was stopped after running for 2 h, the longest the gpu profile allows." in page
    )
    assert warning not in page
    assert await culls(hub, "max_age") == 1


async def _contains(awaitable, text) -> bool:
    return text in await awaitable


def culler_token(hub) -> str:
    """The API token JupyterHub gave its idle culler service (from the process itself)."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"jupyterhub_idle_culler" in cmdline and any(
            str(hub.state_dir).encode() in part for part in cmdline
        ):
            env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
            return env["JUPYTERHUB_API_TOKEN"]
    raise AssertionError("no idle culler process for this hub")


async def test_culler_token_cannot_do_more_than_its_scopes(hub_factory):
    hub = await hub_factory()
    await hub.create_user("alice")
    token = await eventually(lambda: _culler_token(hub), what="the idle culler running")

    r = await hub.api("GET", "/user", token=token)
    assert r.status_code == 200, r.text
    assert r.json()["kind"] == "service" and r.json()["name"] == "idle-culler"
    # the culler README's list, and the user names JupyterHub implies with it
    assert set(r.json()["scopes"]) == {
        "list:users",
        "read:users:activity",
        "read:servers",
        "delete:servers",
        "read:users:name",
    }
    # what it needs works
    assert (await hub.api("GET", "/users?state=ready", token=token)).status_code == 200
    # anything else is refused
    for method, path, body in [
        ("POST", "/users/alice/server", {}),
        ("DELETE", "/users/alice", None),
        ("PATCH", "/users/alice", {"admin": True}),
        ("POST", "/users/alice/tokens", {}),
        ("POST", "/users/mallory", {}),
        ("GET", "/gpuhub/gpus", None),
        ("GET", "/proxy", None),
    ]:
        r = await hub.api(method, path, token=token, json=body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    assert (await hub.api("GET", "/users/alice")).json()["servers"] == {}
    assert (await hub.api("GET", "/users/alice")).json()["admin"] is False


async def _culler_token(hub) -> str | None:
    try:
        return culler_token(hub)
    except AssertionError:
        return None


#: Typed in a member's terminal: make her server (the terminal shell's parent) the first
#: process the OOM killer takes (oom_score_adj, which a process may raise for another of
#: its own), say so, then allocate past the profile's memory limit.
HOG = (
    'python3 -c \'import os; p = open("/proc/%d/stat" % os.getppid()).read(); '
    'open("/proc/%s/oom_score_adj" % p.rsplit(")", 1)[1].split()[1], "w")'
    '.write("1000"); print("HOG" + "GING", flush=True); '
    "hog = [bytearray(32 * 2**20) for _ in range(40)]'"
)


async def test_a_server_killed_past_its_memory_is_recorded_and_the_member_told_why(
    hub_factory, tmp_path, docker_client
):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        json.dumps(
            [
                {
                    "display_name": "Small CPU",
                    "slug": "small",
                    "default": True,
                    "spawner_override": {"mem_limit": "300M"},
                }
            ]
        )
    )
    hub = await hub_factory(
        "c.GPUDockerSpawner.poll_interval = 1\n",
        GPUHUB_CREDITS="off",
        GPUHUB_PROFILES=str(profiles),
    )
    token = await hub.create_user("oom-alice")
    browser = await hub.login("oom-alice")
    await spawn_ready(hub, "oom-alice", "small")
    await terminal_run(hub, "oom-alice", token, HOG, expect="HOGGING", timeout=30)

    await eventually(
        lambda: hub.stopped("oom-alice"),
        timeout=60,
        what="the server stopped by the kernel past its memory limit",
    )
    [run] = [r for r in hub_runs(hub) if r.username == "oom-alice"]
    assert run.stop_reason == "out_of_memory"
    assert run.stop_detail == (
        "out of memory: the server used more than its 300M (Docker: OOMKilled, exit code 137)"
    )
    message = (
        "Your server was stopped: it used more than its 300 MB of memory. Save your "
        "work more often, use less memory, or choose a profile with more."
    )
    assert message in await home_page(browser)

    await spawn_ready(hub, "oom-alice", "small")  # shown until she starts it again
    assert message not in await home_page(browser)
