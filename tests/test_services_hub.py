"""The hub's managed services (the reference credits service, jupyterhub-idle-culler) live
and die with it: a hub killed with SIGKILL leaves none behind, and the next hub starts each
at the first try (hub_ext/ops/service_guard.py); a hub stopped with SIGTERM first stops its
own periodic passes (hub_ext/common/periodic.py), then each service at the first signal
JupyterHub sends, whatever signals the hub was started with ignoring."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from jupyterhub.utils import random_port

from hub_ext.credits.client import CreditsClient
from hub_ext.credits.errors import CreditsError
from hub_ext.credits.hubconfig import ADMIN_TOKEN_FILE, HUB_TOKEN_FILE, api_url
from hub_ext.ops import service_guard
from tests.fixtures.hub import eventually
from tests.test_credits_hub import FAST, PROFILES, ledger


def processes_mentioning(text: str) -> dict[int, list[str]]:
    """pid -> command line of every process whose command line contains ``text``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(text in part for part in argv):
                found[int(entry.name)] = argv
    return found


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rpartition(")")[2].split()[1])


def service_pids(hub) -> dict[str, int]:
    """name -> pid of the hub's services, from their command lines."""
    pids = {}
    for pid, argv in processes_mentioning(str(hub.state_dir)).items():
        for name, module in (
            ("credits", "hub_ext.credits.service"),
            ("idle-culler", "jupyterhub_idle_culler"),
        ):
            if module in argv:
                pids[name] = pid
    return pids


@pytest.mark.docker
@pytest.mark.hub
async def test_services_die_with_a_killed_hub_and_start_at_once_after(hub_factory):
    hub = await hub_factory()
    first = await eventually(lambda: _both(hub), what="both services running")
    assert all(parent_of(pid) == hub.proc.pid for pid in first.values())

    hub.kill(signal.SIGKILL)
    left = await eventually(
        lambda: _none_left(hub), timeout=5, what="no service process of the killed hub"
    )
    assert left

    log_before = len(hub.log())
    await hub.start()
    second = await eventually(lambda: _both(hub), what="both services of the new hub")
    assert all(parent_of(pid) == hub.proc.pid for pid in second.values())
    token = (hub.state_dir / HUB_TOKEN_FILE).read_text().strip()
    url = api_url(type("S", (), {"credits_port": int(hub.env["GPUHUB_CREDITS_PORT"])}))
    async with httpx.AsyncClient() as client:
        r = await client.get(
            url + "v1/accounts/nobody", headers={"Authorization": f"Bearer {token}"}
        )
    assert r.status_code == 404, r.text  # the new service answers for the ledger
    new_log = hub.log()[log_before:]
    assert "Address already in use" not in new_log
    assert "exited with status" not in new_log
    assert set(service_pids(hub).values()) == set(second.values())  # none restarted


async def _both(hub):
    pids = service_pids(hub)
    return pids if set(pids) == {"credits", "idle-culler"} else None


async def _none_left(hub):
    return not processes_mentioning(str(hub.state_dir))


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_service_gets_sigterm_when_its_parent_dies(tmp_path):
    pid_file = tmp_path / "services" / "sleeper.pid"
    # a stand-in hub: it starts the guarded service, prints its pid, then waits
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            "from hub_ext.ops.service_guard import guarded\n"
            f"p = subprocess.Popen(guarded({SLEEPER!r}, 'sleeper', {str(tmp_path)!r}, "
            "os.getpid()), start_new_session=True)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        service = int(parent.stdout.readline())
        assert_eventually(lambda: pid_file.exists() and _argv(service) == SLEEPER)
        assert int(pid_file.read_text()) == service
        parent.kill()
        parent.wait()
        assert_eventually(lambda: _argv(service) is None)
    finally:
        parent.kill()


def test_a_stale_copy_from_an_earlier_hub_is_stopped_before_the_new_one_starts(tmp_path):
    pid_file = tmp_path / "services" / "sleeper.pid"
    stale = subprocess.Popen(SLEEPER, start_new_session=True)
    try:
        pid_file.parent.mkdir()
        pid_file.write_text(f"{stale.pid}\n")
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # x"])
        new = subprocess.Popen(service_guard.guarded(SLEEPER, "sleeper", tmp_path, os.getpid()))
        assert stale.wait(30) == -signal.SIGTERM
        assert_eventually(lambda: pid_file.read_text().strip() == str(new.pid))
        assert other.poll() is None  # another command is never touched
    finally:
        for p in (stale, other, new):
            p.kill()
            p.wait()


def test_a_copy_left_by_a_hub_without_the_guard_is_stopped_too(tmp_path):
    orphan = subprocess.Popen(SLEEPER, start_new_session=True)  # no pid file names it
    new = subprocess.Popen(service_guard.guarded(SLEEPER, "sleeper", tmp_path, os.getpid()))
    try:
        assert orphan.wait(30) == -signal.SIGTERM
        assert_eventually(lambda: _argv(new.pid) == SLEEPER)  # and the new one runs
    finally:
        for p in (orphan, new):
            p.kill()
            p.wait()


def test_the_guard_does_not_start_a_service_whose_hub_is_gone(tmp_path):
    r = subprocess.run(
        service_guard.guarded(SLEEPER, "sleeper", tmp_path, hub_pid=1),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert "the hub (pid 1) is gone" in r.stderr


def test_every_managed_service_is_guarded_and_only_once(tmp_path):
    from traitlets.config import Config

    c = Config()
    c.JupyterHub.services = [{"name": "a", "command": ["x", "--y"]}, {"name": "tok"}]
    service_guard.guard_services(c, tmp_path, hub_pid=42)
    service_guard.guard_services(c, tmp_path, hub_pid=42)
    [a, tok] = c.JupyterHub.services
    assert a["command"] == [
        sys.executable,
        "-m",
        "hub_ext.ops.service_guard",
        "--hub-pid",
        "42",
        "--pid-file",
        str(tmp_path / "services" / "a.pid"),
        "--",
        "x",
        "--y",
    ]
    assert tok == {"name": "tok"}


def _argv(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1] or None
    except OSError:
        return None


def assert_eventually(check, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@pytest.mark.docker
@pytest.mark.hub
async def test_sigterm_stops_the_passes_then_each_service_at_its_first_signal(
    hub_factory, movable_clock, tmp_path, docker_client
):
    # started as `scripts/demo.sh &` from a script starts it: with SIGINT ignored, which
    # every service inherits unless its guard gives the signal back
    profiles = tmp_path / "profiles.json"
    profiles.write_text(PROFILES)
    no_credits_api = {k: "" for k in os.environ if k.startswith("GPUHUB_CREDITS")}
    hub = await hub_factory(
        extra_config=movable_clock.hub_config("CreditsHook") + FAST,
        sigint_ignored=True,
        GPUHUB_PROFILES=str(profiles),
        **{**no_credits_api, "GPUHUB_CREDITS_PORT": str(random_port())},
    )
    services = await eventually(lambda: _both(hub), what="both services running")
    async with credits_admin(hub) as admin:
        await eventually(lambda: _granted(admin, "ann", "10.00"), what="credits granted")
        await hub.create_user("ann")
        r = await hub.spawn("ann", {"profile": "gpu"})
        assert r.status_code in (201, 202), r.text
        await hub.wait_ready("ann")
        paid = [("grant", "10.00"), ("debit", "1.00")]
        assert await ledger(admin, "ann") == paid
    [before] = [(c["Id"], c["Labels"]["io.gpuhub.devices"]) for c in hub.containers(docker_client)]
    movable_clock.at(900)  # the second interval is due: a meter pass may be under way now

    hub.proc.send_signal(signal.SIGTERM)
    hub.proc.wait(120)  # a bound on a hang; the time it takes: benchmarks/hub_shutdown.py
    shutdown = hub.log().rpartition("Received signal SIGTERM")[2]
    assert "Stopping the hub's" in shutdown, "the periodic passes were not stopped"
    assert shutdown.index("Stopping the hub's") < shutdown.index("Cleaning up 2 services")
    for name, pid in services.items():
        assert f"Interrupting {pid}" in shutdown, name  # JupyterHub's first signal, SIGINT
        assert f"Terminating {pid}" not in shutdown, f"{name} did not stop on SIGINT"
    assert "Credits API" not in shutdown  # no call failed against the stopped service
    assert not processes_mentioning(str(hub.state_dir))

    await hub.start()
    await eventually(lambda: _both(hub), what="both services of the new hub")
    await eventually(lambda: hub.running("ann"), what="ann's server running after restart")
    assert [(c["Id"], c["Labels"]["io.gpuhub.devices"]) for c in hub.containers(docker_client)] == [
        before
    ]  # same container, same GPU
    async with credits_admin(hub) as admin:
        # the second interval charged once, whether before, during or after the shutdown
        await eventually(
            lambda: _ledger_is(admin, "ann", paid + [("debit", "1.00")]),
            what="ann's ledger: the grant and two debits",
        )


def credits_admin(hub) -> CreditsClient:
    """A client of the hub's own credits service, with its admin token."""
    token = (hub.state_dir / ADMIN_TOKEN_FILE).read_text().strip()
    url = api_url(type("S", (), {"credits_port": int(hub.env["GPUHUB_CREDITS_PORT"])}))
    return CreditsClient(url=url, token=token, max_attempts=1)


async def _granted(admin: CreditsClient, user: str, amount: str) -> bool:
    try:
        await admin.grant(user, amount, key=f"test-grant-{user}")
    except CreditsError:  # not listening yet
        return False
    return True


async def _ledger_is(admin: CreditsClient, user: str, expected) -> bool:
    return await ledger(admin, user) == expected
