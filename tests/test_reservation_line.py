"""The line and the pool under a reservation's window: the group's members first, nobody
else granted a GPU the window holds now or within its warning time.

The real line (hub database on SQLite), the real GPU pool on a simulated inventory of two
GPUs, the Docker backend's grants (:class:`PoolGrants`) and the hub's ``Reservations``,
its windows set as a pass would have read them.  And what a start is told of a window
ahead (``next_stop``): everyone but the group's members.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from hub_ext.common.server_key import ServerKey
from hub_ext.docker.inventory import SimulatedInventory
from hub_ext.docker.pool import AllocationRefused, GPUPool
from hub_ext.docker.pool_line import PoolGrants
from hub_ext.docker.pool_reservations import PoolReservations
from hub_ext.line import Line
from hub_ext.reservations.enforce import Reservations
from hub_ext.reservations.policy import Window

NOW = datetime.now(UTC)


def lab(start: datetime) -> Window:
    return Window(1, "ml101", "ML101", "gpu", 1, start, start + timedelta(hours=2))


@pytest.fixture
async def node(hub_db):
    """(pool, line, reservations): dan holds one of the two GPUs; bob is in ml101."""
    pool = GPUPool(inventory=SimulatedInventory(count=2))
    await pool.devices()
    line = Line(update_interval=0.05, backfill_age=0)
    line.attach(hub_db, PoolGrants(pool, line))
    rules = Reservations(warning=900)
    rules.backend = PoolReservations(pool, line)
    rules.members = {"ml101": {"bob"}}
    pool.closure = rules.closed_to
    line.backend.reservations = rules
    pool.take(pool._devices, ServerKey("dan", ""))
    return pool, line, rules


async def wait(line, user):
    await line.join(
        (user, ""),
        profile="gpu",
        profile_name="PyTorch",
        units="gpu",
        count=1,
        user_options={"profile": "gpu"},
    )
    return asyncio.ensure_future(line.wait_turn((user, ""), lambda _: None))


async def test_a_member_of_the_group_gets_the_reserved_gpu_before_those_ahead(node):
    pool, line, rules = node
    rules.open = [lab(NOW - timedelta(minutes=1))]
    with pytest.raises(AllocationRefused, match="1 GPU reserved for ML101 until"):
        pool.take(pool._devices, ServerKey("amy", ""))  # the one free GPU is ml101's
    eve = await wait(line, "eve")  # first in line, not in ml101
    bob = await wait(line, "bob")
    assert (await asyncio.wait_for(bob, 2)).owner == ("bob", "")  # the group goes ahead
    await asyncio.sleep(0.1)  # several of the line's own checks
    assert not eve.done() and line.position(("eve", "")) == 1
    eve.cancel()


async def test_nobody_else_is_granted_a_gpu_about_to_be_reserved(node):
    pool, line, rules = node
    rules.soon = [lab(NOW + timedelta(minutes=5))]
    eve = await wait(line, "eve")
    await asyncio.sleep(0.2)  # several of the line's own checks
    assert not eve.done()
    rules.soon = []  # the reservation is deleted: the GPU is anyone's
    line.dispatch()
    assert (await asyncio.wait_for(eve, 2)).owner == ("eve", "")


async def test_a_start_is_told_of_another_groups_window_hours_ahead_and_a_member_is_not(
    node, hub_db
):
    """How long a start may run (``next_stop``), for a window beyond the warning time as a
    pass reads it: told to everyone but the group's members."""
    from jupyterhub import orm

    from hub_ext.reservations import store
    from hub_ext.reservations.rules import Spec

    _, _, rules = node
    orm.Base.metadata.create_all(hub_db.get_bind())
    bob = orm.User(name="bob")
    hub_db.add_all([bob, orm.Group(name="ml101", users=[bob])])
    hub_db.commit()
    start = NOW.replace(microsecond=0) + timedelta(hours=2)
    store.ensure_table(hub_db)
    store.insert(hub_db, Spec("ml101", 1, start, start + timedelta(hours=2)), "boss", NOW)
    rules.members, rules.db = {}, hub_db
    rules._read(rules.now())
    assert rules.next_stop("eve", "gpu").start == start
    assert rules.next_stop("bob", "gpu") is None
    assert rules.start_notice(rules.next_stop("eve", "gpu")).startswith(
        f"1 GPU is reserved for ml101 from {start:%a %Y-%m-%d %H:%M} UTC to "
    )
