"""The pool on its own: exclusive, concurrency-safe, health- and outside-use-aware."""

from __future__ import annotations

import asyncio
import json

import pytest

from hub_ext.docker.inventory import SimulatedInventory
from hub_ext.docker.pool import AllocationRefused, GPUPool, ServerKey


def node(tmp_path, devices):
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"devices": devices}))
    return path


def gpu(i, **extra):
    return {"uuid": f"GPU-{i:04d}", "index": i, **extra}


@pytest.fixture
def make_pool(tmp_path):
    def make(devices, **traits):
        path = node(tmp_path, devices)
        return GPUPool(
            inventory=SimulatedInventory(path=str(path)), refresh_interval=0, **traits
        ), path

    return make


async def test_allocation_is_exclusive(make_pool):
    pool, _ = make_pool([gpu(0), gpu(1)])
    a = await pool.allocate(ServerKey("alice"), 1)
    b = await pool.allocate(ServerKey("bob"), 1)
    assert set(a.uuids).isdisjoint(b.uuids)
    with pytest.raises(AllocationRefused) as e:
        await pool.allocate(ServerKey("carol"), 1)
    assert e.value.reason == "no_gpu_free"
    assert "all 2 GPUs are in use" in e.value.message


async def test_named_servers_are_separate_owners(make_pool):
    pool, _ = make_pool([gpu(0), gpu(1)])
    a = await pool.allocate(ServerKey("alice", ""), 1)
    b = await pool.allocate(ServerKey("alice", "second"), 1)
    assert a.uuids != b.uuids


async def test_allocate_twice_for_one_owner_is_idempotent(make_pool):
    pool, _ = make_pool([gpu(0), gpu(1)])
    a = await pool.allocate(ServerKey("alice"), 1)
    again = await pool.allocate(ServerKey("alice"), 1)
    assert again is a
    assert pool.summary().free == 1


async def test_release_is_idempotent(make_pool):
    pool, _ = make_pool([gpu(0)])
    await pool.allocate(ServerKey("alice"), 1)
    assert pool.release(ServerKey("alice")) is not None
    assert pool.release(ServerKey("alice")) is None
    assert pool.summary().free == 1


async def test_many_concurrent_spawns_cannot_over_allocate(make_pool):
    pool, _ = make_pool([gpu(i) for i in range(8)])

    async def one(i):
        try:
            return await pool.allocate(ServerKey(f"user{i}"), 1)
        except AllocationRefused:
            return None

    results = await asyncio.gather(*(one(i) for i in range(200)))
    won = [r for r in results if r]
    assert len(won) == 8
    uuids = [u for r in won for u in r.uuids]
    assert len(set(uuids)) == 8


@pytest.mark.parametrize(
    "sick",
    [
        pytest.param({"lost": True}, id="gpu-is-lost"),
        pytest.param({"ecc_uncorrected_volatile": 3}, id="uncorrectable-ecc"),
    ],
)
async def test_unhealthy_device_is_never_handed_out(make_pool, sick):
    pool, _ = make_pool([gpu(0, **sick), gpu(1)])
    a = await pool.allocate(ServerKey("alice"), 1)
    assert a.uuids == ("GPU-0001",)
    with pytest.raises(AllocationRefused):
        await pool.allocate(ServerKey("bob"), 1)
    s = pool.summary()
    assert (s.total, s.free, s.unhealthy, s.allocated) == (2, 0, 1, 1)


async def test_device_used_outside_the_hub_is_skipped(make_pool):
    pool, _ = make_pool([gpu(0, processes=[{"pid": 4242, "used_memory_mib": 900}]), gpu(1)])
    a = await pool.allocate(ServerKey("alice"), 1)
    assert a.uuids == ("GPU-0001",)
    assert pool.summary().outside == 1


async def test_device_freed_outside_becomes_available_after_refresh(make_pool, tmp_path):
    pool, path = make_pool([gpu(0, processes=[{"pid": 1}])])
    with pytest.raises(AllocationRefused):
        await pool.allocate(ServerKey("alice"), 1)
    path.write_text(json.dumps({"devices": [gpu(0)]}))
    assert (await pool.allocate(ServerKey("alice"), 1)).uuids == ("GPU-0000",)


async def test_per_user_limit_counts_all_servers(make_pool):
    pool, _ = make_pool([gpu(i) for i in range(4)], max_gpus_per_user=2)
    await pool.allocate(ServerKey("alice", ""), 1)
    await pool.allocate(ServerKey("alice", "two"), 1)
    with pytest.raises(AllocationRefused) as e:
        await pool.allocate(ServerKey("alice", "three"), 1)
    assert e.value.reason == "user_limit"
    assert "Stop one of your other servers" in e.value.message
    await pool.allocate(ServerKey("bob"), 2)


async def test_mig_slices_are_allocatable_units(make_pool):
    migs = [{"uuid": f"MIG-{i}", "profile": "1g.5gb"} for i in range(2)]
    pool, _ = make_pool([gpu(0, mig_mode=True, mig_devices=migs), gpu(1)])
    a = await pool.allocate(ServerKey("alice"), 1, mig_profile="1g.5gb")
    assert a.uuids[0].startswith("MIG-")
    whole = await pool.allocate(ServerKey("bob"), 1)
    assert whole.uuids == ("GPU-0001",)  # the MIG-mode GPU is never handed out whole
    with pytest.raises(AllocationRefused):
        await pool.allocate(ServerKey("carol"), 1, mig_profile="2g.10gb")


async def test_restore_rebuilds_and_refuses_double_booking(make_pool, caplog):
    pool, _ = make_pool([gpu(0), gpu(1)])
    pool.restore(ServerKey("alice"), ["GPU-0000"], since=1.0)
    pool.restore(ServerKey("bob"), ["GPU-0000", "GPU-0001"], since=2.0)
    assert pool.allocations[ServerKey("bob")].uuids == ("GPU-0001",)
    with pytest.raises(AllocationRefused):
        await pool.allocate(ServerKey("carol"), 1)


async def test_inventory_read_runs_off_the_event_loop(make_pool):
    import threading

    pool, _ = make_pool([gpu(0)])
    seen = []
    real = pool.inventory.read

    def read():
        seen.append(threading.current_thread() is threading.main_thread())
        return real()

    pool.inventory.read = read
    await pool.devices()
    assert seen == [False]


async def test_concurrent_callers_share_one_inventory_read(make_pool):
    pool, _ = make_pool([gpu(0)])
    calls = []
    real = pool.inventory.read

    def read():
        calls.append(1)
        return real()

    pool.inventory.read = read
    await asyncio.gather(*(pool.devices() for _ in range(50)))
    assert len(calls) == 1


async def test_unreadable_inventory_refuses_with_a_plain_reason(tmp_path):
    pool = GPUPool(inventory=SimulatedInventory(path=str(tmp_path / "missing.json")))
    with pytest.raises(AllocationRefused) as e:
        await pool.allocate(ServerKey("alice"), 1)
    assert e.value.reason == "inventory_error"
    assert "cannot be read" in e.value.message
