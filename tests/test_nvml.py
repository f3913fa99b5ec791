"""NVMLInventory through the real pynvml bindings.

Everywhere but the ``gpu`` test, NVML is the stand-in built from tests/nvml_standin, loaded
by pynvml in a child Python process through LD_LIBRARY_PATH (a process loads
libnvidia-ml.so.1 once, so each test gets its own).  The child keeps NVML initialised
between reads, as the hub does.

Imports stay minimal (pytest, pynvml, hub_ext.docker.inventory, hub_ext.docker.nvml): the
``gpu`` test runs on a GPU machine that has nvidia-ml-py and little else.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import json
import os
import select
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pynvml
import pytest

from hub_ext.culling.rules import GPUActivity
from hub_ext.docker.inventory import InventoryError, SimulatedInventory
from hub_ext.docker.nvml import NVMLInventory
from hub_ext.docker.pool import AllocationRefused, GPUPool, ServerKey

ROOT = Path(__file__).resolve().parent.parent

# The child: one NVMLInventory, driven by "read" / "close" lines on stdin, answering JSON lines.
_CHILD = r"""
import json, sys
from hub_ext.docker.inventory import InventoryError
from hub_ext.docker.nvml import NVMLInventory

inventory = NVMLInventory()
for line in sys.stdin:
    try:
        if line.strip() == "read":
            reply = {"devices": [device.to_dict() for device in inventory.read()]}
        else:
            inventory.close()
            reply = {"closed": True}
    except InventoryError as e:
        reply = {"inventory_error": str(e)}
    print(json.dumps(reply), flush=True)
"""


class InventoryProcess:
    """A child Python process holding one NVMLInventory, for reads across file changes."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            env={**os.environ, **env},
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str, timeout: float = 30) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            raise AssertionError(f"inventory child gave no answer: {self.proc.stderr.read()}")
        return json.loads(line)

    def read(self) -> list[dict]:
        reply = self.ask("read")
        assert "devices" in reply, reply
        return reply["devices"]

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def inventory_process():
    """Start a child NVMLInventory with the given environment; stopped after the test."""
    started = []

    def start(env: dict[str, str]) -> InventoryProcess:
        started.append(InventoryProcess(env))
        return started[-1]

    yield start
    for child in started:
        child.stop()


def read_once(inventory_process, node) -> list[dict]:
    child = inventory_process(node.env)
    return child.read()


A100 = "NVIDIA A100-SXM4-40GB"
GPU0 = "GPU-5a1e0000-0000-4000-8000-000000000000"
GPU1 = "GPU-5a1e0000-0000-4000-8000-000000000001"
MIG0 = "MIG-9b2c0000-0000-5000-8000-000000000000"
MIG1 = "MIG-9b2c0000-0000-5000-8000-000000000001"


def gpu(uuid: str, **fields) -> dict:
    return {"uuid": uuid, "name": A100, "memory_total_mib": 40960, **fields}


def test_inventory_reports_each_gpu_with_its_memory_utilization_and_temperature(
    nvml_node, inventory_process
):
    nvml_node.write(
        {
            "devices": [
                gpu(GPU0, memory_used_mib=1024, utilization_gpu=37, temperature=41),
                gpu(GPU1, name="NVIDIA H100 80GB HBM3", memory_total_mib=81559, index=1),
            ]
        }
    )

    first, second = read_once(inventory_process, nvml_node)

    assert first["uuid"] == GPU0
    assert first["index"] == 0
    assert first["name"] == A100
    assert (first["memory_total_mib"], first["memory_used_mib"]) == (40960, 1024)
    assert (first["utilization_pct"], first["temperature_c"]) == (37, 41)
    assert (first["healthy"], first["health_reason"]) == (True, "")
    assert (first["mig_mode"], first["mig_devices"], first["parent_uuid"]) == (False, [], None)
    assert second["uuid"] == GPU1
    assert second["index"] == 1
    assert second["name"] == "NVIDIA H100 80GB HBM3"
    assert (second["memory_total_mib"], second["memory_used_mib"]) == (81559, 0)
    assert second["temperature_c"] is None, "no temperature sensor: NOT_SUPPORTED is None"


def test_compute_processes_are_listed_with_their_memory_in_mib(nvml_node, inventory_process):
    nvml_node.write(
        {
            "devices": [
                gpu(
                    GPU0,
                    processes=[
                        {"pid": 4242, "used_memory_mib": 1536},
                        {"pid": 4343},  # the driver does not say: NVML_VALUE_NOT_AVAILABLE
                    ],
                ),
                gpu(GPU1),
            ]
        }
    )

    first, second = read_once(inventory_process, nvml_node)

    assert first["processes"] == [
        {"pid": 4242, "used_memory_mib": 1536},
        {"pid": 4343, "used_memory_mib": None},
    ]
    assert second["processes"] == []


def test_lost_gpu_is_reported_unhealthy_under_its_last_known_uuid(nvml_node, inventory_process):
    nvml_node.write({"devices": [gpu(GPU0), gpu(GPU1, utilization_gpu=80)]})
    child = inventory_process(nvml_node.env)
    assert [d["healthy"] for d in child.read()] == [True, True]

    nvml_node.write({"devices": [gpu(GPU0), gpu(GPU1, utilization_gpu=80, lost=True)]})
    healthy, lost = child.read()

    assert healthy["uuid"] == GPU0 and healthy["healthy"] is True
    assert lost["uuid"] == GPU1
    assert lost["index"] == 1
    assert lost["name"] == A100
    assert lost["healthy"] is False
    assert lost["health_reason"] == "GPU is lost (NVML_ERROR_GPU_IS_LOST)"
    assert (lost["memory_used_mib"], lost["utilization_pct"]) == (None, None)


def test_gpu_lost_before_the_first_read_is_reported_unhealthy_by_index(
    nvml_node, inventory_process
):
    nvml_node.write({"devices": [gpu(GPU0, lost=True), gpu(GPU1)]})

    lost, healthy = read_once(inventory_process, nvml_node)

    assert lost["uuid"] == "GPU-unknown-index-0", "NVML cannot give a lost GPU's UUID"
    assert lost["healthy"] is False
    assert "NVML_ERROR_GPU_IS_LOST" in lost["health_reason"]
    assert healthy["uuid"] == GPU1 and healthy["healthy"] is True


@pytest.mark.parametrize(
    ("ecc", "healthy", "reason"),
    [
        pytest.param(3, False, "3 volatile uncorrectable ECC error(s)", id="errors"),
        pytest.param(0, True, "", id="none"),
        pytest.param(None, True, "", id="ecc-not-supported"),
    ],
)
def test_volatile_uncorrectable_ecc_errors_make_a_gpu_unhealthy(
    nvml_node, inventory_process, ecc, healthy, reason
):
    fields = {} if ecc is None else {"ecc_uncorrected_volatile": ecc}
    nvml_node.write({"devices": [gpu(GPU0, **fields)]})

    (device,) = read_once(inventory_process, nvml_node)

    assert (device["healthy"], device["health_reason"]) == (healthy, reason)
    assert device["memory_total_mib"] == 40960, "an ECC-sick GPU still reports its values"


def test_mig_mode_lists_mig_devices_with_their_uuids_profiles_and_processes(
    nvml_node, inventory_process
):
    nvml_node.write(
        {
            "devices": [
                gpu(
                    GPU0,
                    mig_mode=True,
                    mig_devices=[
                        {
                            "uuid": MIG0,
                            "profile": "1g.5gb",
                            "memory_total_mib": 4864,
                            "memory_used_mib": 13,
                            "processes": [{"pid": 77}],
                        },
                        {"uuid": MIG1, "profile": "3g.20gb", "memory_total_mib": 19968},
                    ],
                ),
                gpu(GPU1, mig_mode=False),
            ]
        }
    )

    parent, plain = read_once(inventory_process, nvml_node)

    assert parent["mig_mode"] is True
    small, large = parent["mig_devices"]
    assert (small["uuid"], large["uuid"]) == (MIG0, MIG1)
    assert (small["mig_profile"], large["mig_profile"]) == ("1g.5gb", "3g.20gb")
    assert small["parent_uuid"] == large["parent_uuid"] == GPU0
    assert small["name"] == f"{A100} MIG 1g.5gb"
    assert (small["memory_total_mib"], small["memory_used_mib"]) == (4864, 13)
    assert small["processes"] == [{"pid": 77, "used_memory_mib": None}]
    assert large["processes"] == []
    assert small["utilization_pct"] is None, "NVML gives no utilization for a MIG device"
    assert small["healthy"] is True
    assert (plain["mig_mode"], plain["mig_devices"]) == (False, [])


def test_mig_devices_of_a_lost_gpu_stay_listed_as_unhealthy(nvml_node, inventory_process):
    mig = {"uuid": MIG0, "profile": "1g.5gb", "memory_total_mib": 4864}
    nvml_node.write({"devices": [gpu(GPU0, mig_mode=True, mig_devices=[mig])]})
    child = inventory_process(nvml_node.env)
    assert child.read()[0]["mig_devices"][0]["healthy"] is True

    nvml_node.write({"devices": [gpu(GPU0, mig_mode=True, mig_devices=[mig], lost=True)]})
    (parent,) = child.read()

    (slice_,) = parent["mig_devices"]
    assert (slice_["uuid"], slice_["parent_uuid"]) == (MIG0, GPU0)
    assert slice_["healthy"] is False
    assert slice_["health_reason"] == "GPU is lost (NVML_ERROR_GPU_IS_LOST)"


def test_utilization_change_is_seen_without_restarting_the_process(nvml_node, inventory_process):
    nvml_node.write({"devices": [gpu(GPU0, utilization_gpu=5)]})
    child = inventory_process(nvml_node.env)
    assert child.read()[0]["utilization_pct"] == 5

    for utilization in (95, 40, 41):
        nvml_node.write({"devices": [gpu(GPU0, utilization_gpu=utilization)]})
        assert child.read()[0]["utilization_pct"] == utilization


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(
            {
                "devices": [
                    gpu(
                        GPU0,
                        memory_used_mib=300,
                        utilization_gpu=12,
                        temperature=50,
                        processes=[{"pid": 9, "used_memory_mib": 300}, {"pid": 10}],
                    ),
                    {"uuid": GPU1},
                ]
            },
            id="whole-gpus",
        ),
        pytest.param(
            {
                "devices": [
                    gpu(
                        GPU0,
                        mig_mode=True,
                        mig_devices=[
                            {
                                "uuid": MIG0,
                                "profile": "2g.10gb",
                                "memory_total_mib": 9856,
                                "processes": [{"pid": 5, "used_memory_mib": 100}],
                            }
                        ],
                    )
                ]
            },
            id="mig",
        ),
        pytest.param(
            {"devices": [gpu(GPU0, ecc_uncorrected_volatile=2), gpu(GPU1, temperature=30)]},
            id="ecc",
        ),
    ],
)
def test_nvml_and_simulated_inventories_agree_on_one_node_description(
    nvml_node, inventory_process, doc
):
    nvml_node.write(doc)

    through_nvml = read_once(inventory_process, nvml_node)

    simulated = [d.to_dict() for d in SimulatedInventory(path=str(nvml_node.path)).read()]
    assert through_nvml == simulated


def test_close_shuts_nvml_down_idempotently_and_a_later_read_reopens_it(
    nvml_node, inventory_process
):
    nvml_node.write({"devices": [gpu(GPU0)]})
    child = inventory_process(nvml_node.env)
    assert [d["uuid"] for d in child.read()] == [GPU0]

    assert child.ask("close") == {"closed": True}
    assert child.ask("close") == {"closed": True}

    assert [d["uuid"] for d in child.read()] == [GPU0]


def test_missing_nvml_library_raises_inventory_error_naming_the_simulated_setting(
    tmp_path, inventory_process
):
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has a real libnvidia-ml; it cannot be made to go missing")
    child = inventory_process({"LD_LIBRARY_PATH": str(tmp_path), "NVML_STANDIN_JSON": ""})

    reply = child.ask("read")

    message = reply["inventory_error"]
    assert "NVML" in message and "NVIDIA driver" in message and "not found" in message
    assert "GPUHUB_GPUS=simulated:2" in message


def test_nvml_init_failure_raises_inventory_error(nvml_node, inventory_process):
    # The stand-in answers nvmlInit with NVML_ERROR_DRIVER_NOT_LOADED when it has no node.
    env = {**nvml_node.env, "NVML_STANDIN_JSON": str(nvml_node.path.with_name("absent.json"))}
    child = inventory_process(env)

    message = child.ask("read")["inventory_error"]

    assert "nvmlInit failed" in message and "NVML_ERROR_DRIVER_NOT_LOADED" in message
    assert "GPUHUB_GPUS=simulated:2" in message


@pytest.mark.gpu
def test_real_driver_reports_sane_devices():
    inventory = NVMLInventory()
    try:
        devices = inventory.read()
    except InventoryError as e:
        if isinstance(e.__cause__, pynvml.NVMLError_LibraryNotFound):
            pytest.skip("no NVIDIA driver here (NVMLError_LibraryNotFound)")
        raise
    finally:
        inventory.close()

    assert devices, "NVML is present but lists no GPU"
    assert len({d.uuid for d in devices}) == len(devices)
    for device in devices:
        assert device.uuid.startswith("GPU-"), device
        assert device.healthy, f"{device.uuid}: {device.health_reason}"
        assert device.memory_total_mib and device.memory_total_mib > 0, device
        assert 0 <= device.memory_used_mib <= device.memory_total_mib, device
        assert device.utilization_pct is None or 0 <= device.utilization_pct <= 100, device
        assert device.temperature_c is None or 0 < device.temperature_c < 120, device
        assert all(p.pid > 0 for p in device.processes), device
        assert device.mig_mode or not device.mig_devices, device
        for mig in device.mig_devices:
            assert mig.uuid.startswith("MIG-") and mig.parent_uuid == device.uuid, mig
            assert mig.mig_profile and "g." in mig.mig_profile, mig
            assert 0 < mig.memory_total_mib <= device.memory_total_mib, mig
        json.dumps(device.to_dict())


@pytest.mark.gpu
def test_real_gpu_used_outside_the_hub_is_never_handed_out():
    # what a lab's "check nvidia-smi first" rule was for: a process of no server holds
    # memory on every GPU of the machine; the pool refuses them all, then frees them
    count = real_gpu_count()
    holder = cuda_process(HOLD_EVERY_GPU, count, "holding")
    asyncio.run(_refused_while_held_then_free(holder, count))


def real_gpu_count() -> int:
    """The machine's GPUs as NVML counts them; the test is skipped without a driver."""
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError_LibraryNotFound:
        pytest.skip("no NVIDIA driver here (NVMLError_LibraryNotFound)")
    return count


def cuda_process(script: str, arg, ready: str) -> subprocess.Popen:
    """``script`` (:data:`CUDA` and more) run with ``arg``, once it printed ``ready``; the
    test is skipped when it found no CUDA driver library."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(arg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    if line.startswith("skip"):
        pytest.skip(line.strip())
    assert line.startswith(ready), line + child.stderr.read()
    return child


async def _refused_while_held_then_free(holder: subprocess.Popen, count: int) -> None:
    pool = GPUPool(inventory=NVMLInventory(), refresh_interval=0)
    try:
        devices = await pool.devices()
        assert all(d.processes for d in devices), [(d.uuid, d.processes) for d in devices]
        assert pool.summary(devices).outside == count
        with pytest.raises(AllocationRefused, match=f"all {count} GPUs are in use"):
            await pool.allocate(ServerKey("alice"), 1)
    finally:
        holder.kill()
        holder.wait()
    # the process is gone: NVML stops listing it within a moment
    for _ in range(50):
        if not any(d.processes for d in await pool.devices()):
            break
        await asyncio.sleep(0.1)
    allocation = await pool.allocate(ServerKey("alice"), 1)
    assert len(allocation.uuids) == 1 and allocation.uuids[0].startswith("GPU-")


@pytest.mark.gpu
def test_real_gpu_computing_reads_busy_to_the_culler_and_idle_after():
    # the GPU-idle culler's signal (c.Culler.busy_utilization, default 1%) on a real device:
    # a process computing on GPU 0 makes it busy; once it ends, GPU 0 reads idle again
    real_gpu_count()
    worker = cuda_process(COMPUTE_ON_GPU_0, 30, "computing")
    inventory = NVMLInventory()
    try:
        gpu0 = next(d for d in inventory.read() if d.index == 0)
        busy = GPUActivity()
        for _ in range(100):
            busy.observe(inventory.read(), datetime.now(UTC), 1)
            if gpu0.uuid in busy.last_busy:
                break
            time.sleep(0.1)
        assert gpu0.uuid in busy.last_busy, "GPU 0 never read busy while a process computed"
        worker.kill()
        worker.wait()
        samples = []
        for _ in range(100):  # NVML's utilization is a sample over the last second or so
            units = inventory.read()
            samples.append(next(d for d in units if d.index == 0).utilization_pct)
            idle = GPUActivity()
            idle.observe(units, datetime.now(UTC), 1)
            if gpu0.uuid not in idle.last_busy:
                break
            time.sleep(0.1)
        assert gpu0.uuid not in idle.last_busy, f"GPU 0 still busy after the process: {samples}"
    finally:
        worker.kill()
        worker.wait()
        inventory.close()


# Driver-level CUDA for a process outside the hub, through the driver's own library
# (libcuda, beside NVML in every NVIDIA driver); it prints "skip: ..." and exits without it.
# ``memory_on(index, size)`` makes GPU ``index`` current and allocates ``size`` bytes there.
CUDA = """
import ctypes, sys, time
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(f"skip: no CUDA driver library to use a GPU with ({e})", flush=True)
    sys.exit(0)

def check(rc, what):
    if rc != 0:
        print(f"failed: {what} returned CUDA error {rc}", flush=True)
        sys.exit(1)

def memory_on(index, size):
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    check(cuda.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)), "cuMemAlloc")
    return ptr

check(cuda.cuInit(0), "cuInit")
"""

# Computes on GPU 0 for argv[1] seconds: memsets of 1 GiB, each a kernel.
COMPUTE_ON_GPU_0 = (
    CUDA
    + """
ptr = memory_on(0, 1 << 30)
print("computing", flush=True)
end = time.monotonic() + float(sys.argv[1])
value = 0
while time.monotonic() < end:
    value += 1
    check(cuda.cuMemsetD32_v2(ptr, ctypes.c_uint(value), ctypes.c_size_t(1 << 28)), "cuMemsetD32")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
"""
)

# A process outside the hub: a CUDA context and 256 MiB on each of argv[1] GPUs.
HOLD_EVERY_GPU = (
    CUDA
    + """
held = [memory_on(i, 256 << 20) for i in range(int(sys.argv[1]))]
print("holding", flush=True)
time.sleep(300)
"""
)
