"""Culling without a hub: the decision, the culler's bookkeeping, the idle culler's arbiter.

The decision (:func:`assess`) is a pure function.  The culler's lifecycle is driven through
its hook methods with :class:`RunningServer`, a spawner double that holds a server until
told otherwise, over a real SQLite database and a simulated GPU inventory.  The arbiter runs
inside jupyterhub-idle-culler's own ``IdleCuller`` application, loading the configuration
file the hub writes.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from jupyterhub.utils import utcnow as hub_utcnow
from prometheus_client import REGISTRY
from sqlalchemy import select
from sqlalchemy.orm import Session
from traitlets import TraitError

from hub_ext.common.notices import notices
from hub_ext.common.runs import ServerRun
from hub_ext.culling.arbiter import CONFIG_TEXT, ENV, ProfileIdleLimits
from hub_ext.culling.culler import Culler
from hub_ext.culling.rules import (
    Limits,
    assess,
    cull_message,
    duration,
    out_of_memory_message,
)
from hub_ext.docker.inventory import SimulatedInventory
from hub_ext.docker.pool import GPUPool, ServerKey, gpu_units_of
from hub_ext.spawn.stopping import stop_server

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
GPU0, GPU1 = "GPU-a0", "GPU-a1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def verdict(
    now=0,
    *,
    started=0,
    watching=0,
    gpu_idle=2700,
    max_age=0,
    devices=(GPU0,),
    utilization=None,
    last_busy=None,
    warning=900,
):
    return assess(
        now=at(now),
        started_at=at(started),
        watching_since=at(watching),
        limits=Limits(gpu_idle_timeout=gpu_idle, max_age=max_age),
        devices=devices,
        utilization={GPU0: 0, GPU1: 0, **(utilization or {})},
        last_busy={k: at(v) for k, v in (last_busy or {}).items()},
        busy_utilization=1,
        warning=warning,
    )


# -- the decision ------------------------------------------------------------------------------


def test_gpu_idle_past_the_profiles_timeout_is_culled():
    assert verdict(2699).cull is None
    v = verdict(2700)
    assert (v.cull, v.gpu_idle_for, v.busy) == ("idle_gpu", 2700, False)


def test_busy_gpu_is_active_and_never_idle():
    v = verdict(99999, utilization={GPU0: 1})
    assert (v.busy, v.cull, v.gpu_idle_for) == (True, None, 0)


def test_idle_time_counts_from_the_last_busy_reading():
    assert verdict(3000, last_busy={GPU0: 1000}).gpu_idle_for == 2000
    assert verdict(3000, last_busy={GPU0: 1000}).cull is None


@pytest.mark.parametrize(
    ("utilization", "why"),
    [
        pytest.param({GPU0: None}, "NVML gives no utilization (MIG device, lost GPU)", id="none"),
        pytest.param({GPU1: 0}, "the device is not in this reading at all", id="missing"),
    ],
)
def test_unknown_utilization_is_never_idle(utilization, why):
    v = assess(
        now=at(99999),
        started_at=at(0),
        watching_since=at(0),
        limits=Limits(gpu_idle_timeout=60),
        devices=(GPU0,),
        utilization=utilization,
        last_busy={},
        busy_utilization=1,
        warning=0,
    )
    assert (v.cull, v.busy, v.gpu_idle_for) == (None, False, 0), why


def test_one_busy_device_keeps_a_two_gpu_server_active():
    v = verdict(5000, devices=(GPU0, GPU1), utilization={GPU1: 40})
    assert v.busy and v.cull is None


def test_after_a_hub_restart_idle_time_counts_from_the_restart():
    v = verdict(3000, watching=2000)  # readings before 2000 were lost with the old process
    assert (v.gpu_idle_for, v.cull) == (1000, None)


def test_cpu_server_and_zero_timeout_are_never_culled_for_gpu_idleness():
    assert verdict(99999, devices=()).cull is None
    assert verdict(99999, gpu_idle=0).cull is None


def test_max_age_warns_within_the_window_then_culls_even_when_busy():
    assert verdict(7200 - 901, max_age=7200, utilization={GPU0: 90}).stop_in is None
    v = verdict(7200 - 900, max_age=7200, utilization={GPU0: 90})
    assert (v.cull, v.stop_in) == (None, 900)
    v = verdict(7200, max_age=7200, utilization={GPU0: 90})
    assert (v.cull, v.age) == ("max_age", 7200)


def test_max_age_wins_when_both_are_due():
    assert verdict(8000, max_age=7200, gpu_idle=60).cull == "max_age"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(40, "40 s", id="seconds"),
        pytest.param(2700, "45 min", id="minutes"),
        pytest.param(7200, "2 h", id="hours"),
        pytest.param(7500, "2 h 5 min", id="hours-minutes"),
    ],
)
def test_durations_read_as_people_say_them(seconds, text):
    assert duration(seconds) == text


def test_cull_messages_name_the_reason():
    assert cull_message("idle_gpu", "server", 2701, "gpu") == (
        "Your server was stopped after 45 min with an idle GPU."
    )
    assert cull_message("idle", "server 'lab'", 3700, "cpu") == (
        "Your server 'lab' was stopped after 62 min without activity."
    )
    assert cull_message("max_age", "server", 28800, "pytorch") == (
        "Your server was stopped after running for 8 h, the longest the pytorch profile allows."
    )


def test_out_of_memory_message_names_the_limit_in_sizes_people_read():
    assert out_of_memory_message("server", 400 * 2**20) == (
        "Your server was stopped: it used more than its 400 MB of memory. Save your work "
        "more often, use less memory, or choose a profile with more."
    )
    assert "its 1.5 GB of memory" in out_of_memory_message("server 'lab'", 1.5 * 2**30)
    assert "its 16 GB of memory" in out_of_memory_message("server", 16 * 2**30)
    # a profile that asked Slurm for memory itself (req_memory): no mem_limit to name
    assert out_of_memory_message("server", None).startswith(
        "Your server was stopped: it used more than its memory limit."
    )


def test_culler_traits_validate_at_assignment():
    with pytest.raises(TraitError, match="'check_interval' trait of a Culler .* above 0"):
        Culler(check_interval=0)
    with pytest.raises(TraitError, match="'busy_utilization' trait of a Culler .* less than 1"):
        Culler(busy_utilization=0)
    with pytest.raises(TraitError, match="'busy_utilization' trait .* greater than 100"):
        Culler(busy_utilization=101)
    with pytest.raises(TraitError, match="'max_age_warning' trait of a Culler .* less than 0"):
        Culler(max_age_warning=-1)


# -- the culler's bookkeeping ------------------------------------------------------------------


class RunningServer:
    """A spawner double: one running server with GPUDockerSpawner's attributes, until
    :meth:`gone` (its container vanished) or the test calls the hooks for a stop."""

    def __init__(self, db: Session, username: str, devices=(), profile="gpu", **limits):
        self.user = SimpleNamespace(
            name=username,
            groups=[SimpleNamespace(name="ml101")],
            orm_user=SimpleNamespace(last_activity=None),
        )
        self.name = ""
        self.db = db
        self.hook_state: dict = {}
        self.server = object()
        self.pending = None
        self.profile_slug = profile
        self.allocation = SimpleNamespace(uuids=tuple(devices)) if devices else None
        self.orm_spawner = SimpleNamespace(last_activity=datetime(2020, 1, 1))
        self._log_name = username
        self.gpu_idle_timeout = limits.get("gpu_idle_timeout", 0)
        self.cull_max_age = limits.get("cull_max_age", 0)
        self.cull_idle_timeout = limits.get("cull_idle_timeout", 0)

    def gone(self) -> None:
        self.server = None
        self.hook_state = {}


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def db(hub_db):
    return hub_db


class Node:
    """A one-GPU node for the simulated inventory; ``node(85)`` sets its utilization."""

    def __init__(self, path):
        self.path = path
        self(0)

    def __call__(self, utilization: int) -> None:
        self.path.write_text(
            json.dumps({"devices": [{"uuid": GPU0, "utilization_gpu": utilization}]})
        )


@pytest.fixture
def node(tmp_path) -> Node:
    return Node(tmp_path / "node.json")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def culler(node, clock) -> Culler:
    pool = GPUPool(inventory=SimulatedInventory(path=str(node.path)), refresh_interval=0)
    return Culler(gpu_units=gpu_units_of(pool), utcnow=clock)


def the_run(db) -> ServerRun:
    [run] = db.scalars(select(ServerRun)).all()
    return run


def culls(reason: str) -> float:
    return REGISTRY.get_sample_value("gpuhub_culls_total", {"reason": reason}) or 0.0


def name(prefix: str) -> str:
    """A username no other test uses (notices and metrics live as long as the process)."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_a_run_is_recorded_from_start_to_stop(culler, clock, db):
    server = RunningServer(db, name("alice"), devices=(GPU0,))
    await culler.before_container(server)
    clock.now = at(600)
    await culler.after_stop(server)
    run = the_run(db)
    assert (run.username, run.profile, run.devices, run.groups) == (
        server.user.name,
        "gpu",
        [GPU0],
        ["ml101"],
    )
    assert (run.started_at, run.stopped_at, run.stop_reason) == (
        T0.replace(tzinfo=None),
        at(600).replace(tzinfo=None),
        "stopped",
    )
    assert notices().for_user(server.user.name) == []


async def test_a_stop_the_hub_makes_for_credits_is_recorded_as_such(culler, clock, db):
    server = RunningServer(db, name("dora"), devices=(GPU0,))
    await culler.before_container(server)

    async def user_stop(server_name):  # JupyterHub's User.stop runs the spawner's hooks
        assert server.stop_reason == "credits"
        await culler.after_stop(server)

    server.user.stop = user_stop
    before = culls("idle")
    clock.now = at(900)
    await stop_server(server, "credits")
    run = the_run(db)
    assert (run.stopped_at, run.stop_reason) == (at(900).replace(tzinfo=None), "credits")
    assert server.stop_reason is None
    assert culls("idle") == before  # not a cull: no cull notice, no count
    assert notices().for_user(server.user.name) == []


async def test_a_failed_start_leaves_no_run(culler, db):
    server = RunningServer(db, name("alice"))
    await culler.before_container(server)
    await culler.undo(server)
    assert db.scalars(select(ServerRun)).all() == []


@pytest.mark.parametrize(
    "answered_before_the_stop",
    [
        pytest.param(True, id="202-stop-still-pending"),
        pytest.param(False, id="204-stop-done"),
    ],
)
async def test_stop_by_the_idle_culler_service_is_a_cull(culler, db, answered_before_the_stop):
    server = RunningServer(db, name("carol"))
    await culler.before_container(server)
    server.orm_spawner.last_activity = hub_utcnow(with_tz=False) - timedelta(minutes=62)
    before = culls("idle")
    if answered_before_the_stop:
        culler.service_stopped(server.user.name, "")
        await culler.after_stop(server)
    else:
        await culler.after_stop(server)
        culler.service_stopped(server.user.name, "")
    assert the_run(db).stop_reason == "idle"
    assert culls("idle") == before + 1
    assert notices().for_user(server.user.name) == [
        "Your server was stopped after 62 min without activity."
    ]


async def test_busy_gpu_moves_last_activity_to_now(culler, node, db):
    server = RunningServer(db, name("bob"), devices=(GPU0,), gpu_idle_timeout=60)
    await culler.before_container(server)
    node(85)
    await culler.cull_once()
    assert server.orm_spawner.last_activity > datetime(2020, 1, 1)
    assert server.user.orm_user.last_activity == server.orm_spawner.last_activity
    assert culler.activity.last_busy == {GPU0: T0}


async def test_member_is_warned_before_the_maximum_age(culler, clock, db):
    server = RunningServer(db, name("dave"), cull_max_age=7200)
    await culler.before_container(server)
    clock.now = at(7200 - 600)
    await culler.cull_once()
    assert notices().for_user(server.user.name) == [
        "Your server will be stopped in about 10 min: the gpu profile allows 2 h per "
        "server. Save your work."
    ]
    await culler.after_stop(server)  # stopped by the member: the warning goes
    assert notices().for_user(server.user.name) == []


async def test_server_gone_without_a_stop_ends_its_run_when_last_seen(culler, clock, db):
    server = RunningServer(db, name("erin"))
    await culler.before_container(server)
    clock.now = at(300)
    await culler.cull_once()
    server.gone()
    clock.now = at(900)
    await culler.cull_once()
    run = the_run(db)
    assert (run.stopped_at, run.stop_reason) == (at(300).replace(tzinfo=None), "gone")


async def test_restored_server_keeps_its_limits_and_counts_idleness_anew(culler, clock, db):
    server = RunningServer(db, name("frank"), devices=(GPU0,), gpu_idle_timeout=60)
    await culler.before_container(server)
    fresh = Culler(gpu_units=culler.gpu_units, utcnow=clock)  # the hub restarted
    restarted = RunningServer(db, server.user.name, devices=(GPU0,))  # configured anew
    restarted.hook_state = dict(server.hook_state)  # from spawner state
    clock.now = at(1000)
    fresh.restore(restarted)
    clock.now = at(1030)
    await fresh.cull_once()
    assert fresh.server_view(ServerKey(server.user.name, "")) == {
        "started_at": T0.isoformat(),
        "limits": Limits(60, 0, 0).to_dict(),
        "gpu_idle_for": 30.0,
        "stopping": None,
    }


# -- the idle culler's arbiter -----------------------------------------------------------------

PROFILES = [
    {"display_name": "CPU", "slug": "cpu", "default": True},
    {"display_name": "GPU", "slug": "gpu", "gpus": 1, "cull_idle_timeout": 1800},
    {"display_name": "Long", "slug": "long", "cull_idle_timeout": 0},
    {
        "display_name": "Sized",
        "slug": "sized",
        "profile_options": {
            "size": {
                "choices": {
                    "s": {"display_name": "S", "default": True},
                    "l": {"display_name": "L", "spawner_override": {"cull_idle_timeout": 600}},
                }
            }
        },
    },
]


@pytest.mark.parametrize(
    ("options", "limit"),
    [
        pytest.param({}, 3600, id="default-profile-uses-timeout"),
        pytest.param({"profile": "gpu"}, 1800, id="stricter-gpu-profile"),
        pytest.param({"profile": "long"}, 0, id="never"),
        pytest.param({"profile": "sized", "size": "l"}, 600, id="choice-override"),
        pytest.param({"profile": "gone"}, 3600, id="profile-removed-since"),
        pytest.param(None, 3600, id="no-options"),
        pytest.param({"profile": "gpu", "job": {"id": "j"}}, 0, id="notebook-job-never"),
    ],
)
def test_arbiter_applies_each_profiles_idle_timeout(options, limit):
    assert ProfileIdleLimits(PROFILES).limit(options, 3600) == limit


def test_arbiter_decides_as_the_culler_asks():
    arbiter = ProfileIdleLimits(PROFILES)
    gpu = {"name": "", "user_options": {"profile": "gpu"}}
    assert arbiter(inactive=timedelta(seconds=1800), inactive_limit=3600, server=gpu)
    assert not arbiter(inactive=timedelta(seconds=1799), inactive_limit=3600, server=gpu)
    never = {"name": "", "user_options": {"profile": "long"}}
    assert not arbiter(inactive=timedelta(days=30), inactive_limit=3600, server=never)
    assert arbiter.limits() == {1800.0, 0.0, 600.0}


def test_idle_culler_loads_the_arbiter_from_the_hubs_config_file(tmp_path, monkeypatch):
    from jupyterhub_idle_culler import IdleCuller

    config = tmp_path / "idle_culler_config.py"
    config.write_text(CONFIG_TEXT)
    monkeypatch.setenv(ENV, json.dumps(PROFILES))
    app = IdleCuller()
    app.load_config_file(str(config))
    arbiter = app.cull_arbiter_hook
    assert isinstance(arbiter, ProfileIdleLimits)
    assert arbiter.limit({"profile": "gpu"}, app.timeout) == 1800
