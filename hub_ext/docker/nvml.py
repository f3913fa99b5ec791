"""The production inventory: the node's GPUs as the NVIDIA driver reports them, through NVML.

NVML is reached through pynvml (the ``nvidia-ml-py`` module), which loads
``libnvidia-ml.so.1`` from the driver.  Every call below is documented in the NVML API
reference (https://docs.nvidia.com/deploy/nvml-api/); the section is named where a
behaviour comes from.

Health follows the reference's return codes: a GPU whose queries fail (most often
``NVML_ERROR_GPU_IS_LOST``, "the target GPU has fallen off the bus or is otherwise
inaccessible") or that counts volatile uncorrectable ECC errors is reported with
``healthy=False``; it is never an exception, so one sick GPU does not hide the others.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pynvml

from hub_ext.docker.inventory import Device, GPUProcess, Inventory, InventoryError

__all__ = ["NVMLInventory"]

_MIB = 1024 * 1024

_NO_DRIVER = (
    "NVML (libnvidia-ml.so.1, part of the NVIDIA driver) was not found on this node, so its "
    "GPUs cannot be listed. Install the NVIDIA driver, or run the hub where it is visible. "
    "A demo without GPUs must configure the simulated inventory explicitly, "
    "e.g. GPUHUB_GPUS=simulated:2; it is never used as a silent fallback."
)


class NVMLInventory(Inventory):
    """The GPUs of this node read through NVML; MIG devices nested in their GPU.

    NVML is initialised lazily on the first :meth:`read` (``nvmlInit``, once, under a lock)
    and shut down by :meth:`close`.  Units follow :class:`~hub_ext.docker.inventory.Device`: NVML
    gives memory in bytes, converted here to whole MiB (rounded down); utilization is the
    percentage of the last sample period (``nvmlDeviceGetUtilizationRates``); temperature is
    the GPU core sensor in degrees Celsius (``nvmlDeviceGetTemperature``,
    ``NVML_TEMPERATURE_GPU``).  A value the driver does not support
    (``NVML_ERROR_NOT_SUPPORTED``) is None.

    Indexes are NVML's enumeration order, stable while NVML stays initialised (Device
    Queries: ``nvmlDeviceGetHandleByIndex_v2``), so the UUID last read at an index names a
    GPU that has since been lost.  A GPU lost before it was ever read is reported under the
    placeholder ``GPU-unknown-index-<i>``.
    """

    kind = "nvml"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialised = False
        self._last_seen: dict[int, Device] = {}

    def read(self) -> list[Device]:
        """Every GPU on the node, in NVML index order.  Blocking.

        Raises :class:`~hub_ext.docker.inventory.InventoryError` when NVML cannot be loaded or
        initialised (no driver) or cannot count the devices; a single sick GPU comes back
        with ``healthy=False`` and a ``health_reason`` instead.
        """
        with self._lock:
            self._init()
            try:
                count = pynvml.nvmlDeviceGetCount()
                return [self._read_gpu(index) for index in range(count)]
            except pynvml.NVMLError as e:
                raise InventoryError(f"NVML cannot list the GPUs: {_describe(e)}") from e
            except pynvml.NVMLLibraryMismatchError as e:
                raise InventoryError(
                    f"this NVIDIA driver's NVML is older than the nvidia-ml-py bindings: {e}"
                ) from e

    def close(self) -> None:
        """Shut NVML down (``nvmlShutdown``) if :meth:`read` initialised it.  Idempotent.

        A later :meth:`read` initialises NVML again.
        """
        with self._lock:
            if not self._initialised:
                return
            self._initialised = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass  # the driver went away; there is nothing left to release

    def _init(self) -> None:
        if self._initialised:
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as e:
            raise InventoryError(_NO_DRIVER) from e
        except pynvml.NVMLError as e:
            raise InventoryError(
                f"nvmlInit failed: {_describe(e)}. The NVIDIA driver is installed but not "
                "usable (not loaded, or a library/kernel module version mismatch; try "
                "nvidia-smi). A demo without GPUs must configure the simulated inventory "
                "explicitly, e.g. GPUHUB_GPUS=simulated:2."
            ) from e
        self._initialised = True
        self._last_seen.clear()  # indexes are only stable within one NVML session

    def _read_gpu(self, index: int) -> Device:
        uuid = None
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            device = self._read_whole_gpu(handle, uuid)
        except pynvml.NVMLError as e:
            return self._sick(index, uuid, e)
        self._last_seen[index] = device
        return device

    def _read_whole_gpu(self, handle, uuid: str) -> Device:
        index = pynvml.nvmlDeviceGetIndex(handle)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        utilization = _unless_unsupported(pynvml.nvmlDeviceGetUtilizationRates, handle)
        # Volatile uncorrectable ECC errors since the driver loaded (ECC: nvmlMemoryErrorType_t,
        # nvmlEccCounterType_t); NOT_SUPPORTED where ECC is off or absent, counted as none.
        ecc = _unless_unsupported(
            pynvml.nvmlDeviceGetTotalEccErrors,
            handle,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        mig_mode = _unless_unsupported(pynvml.nvmlDeviceGetMigMode, handle)
        mig_on = bool(mig_mode) and mig_mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE
        healthy, reason = True, ""
        if ecc:
            healthy, reason = False, f"{ecc} volatile uncorrectable ECC error(s)"
        return Device(
            uuid=uuid,
            index=index,
            name=name,
            memory_total_mib=memory.total // _MIB,
            memory_used_mib=memory.used // _MIB,
            utilization_pct=None if utilization is None else utilization.gpu,
            temperature_c=_unless_unsupported(
                pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU
            ),
            processes=_processes(handle),
            healthy=healthy,
            health_reason=reason,
            mig_mode=mig_on,
            mig_devices=self._read_mig_devices(handle, uuid, index) if mig_on else (),
        )

    def _read_mig_devices(self, handle, parent_uuid: str, index: int) -> tuple[Device, ...]:
        # Multi Instance GPU Management: the slots up to nvmlDeviceGetMaxMigDeviceCount are
        # probed; an empty slot answers NVML_ERROR_NOT_FOUND.
        migs = []
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError_NotFound:
                continue
            uuid = _text(pynvml.nvmlDeviceGetUUID(mig_handle))
            base = Device(uuid=uuid, index=index, parent_uuid=parent_uuid)
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(mig_handle)
                migs.append(
                    replace(
                        base,
                        name=_text(pynvml.nvmlDeviceGetName(mig_handle)),
                        memory_total_mib=memory.total // _MIB,
                        memory_used_mib=memory.used // _MIB,
                        processes=_processes(mig_handle),
                        mig_profile=_mig_profile(pynvml.nvmlDeviceGetAttributes(mig_handle)),
                    )
                )
            except pynvml.NVMLError as e:
                migs.append(replace(base, healthy=False, health_reason=_describe(e)))
        return tuple(migs)

    def _sick(self, index: int, uuid: str | None, error: pynvml.NVMLError) -> Device:
        """A GPU whose queries fail, under the identity it last had at this index."""
        reason = _describe(error)
        last = self._last_seen.get(index)
        if last is None or (uuid is not None and uuid != last.uuid):
            return Device(
                uuid=uuid or f"GPU-unknown-index-{index}",
                index=index,
                healthy=False,
                health_reason=reason,
            )
        migs = tuple(
            replace(
                mig,
                memory_used_mib=None,
                processes=(),
                healthy=False,
                health_reason=reason,
            )
            for mig in last.mig_devices
        )
        return Device(
            uuid=last.uuid,
            index=last.index,
            name=last.name,
            healthy=False,
            health_reason=reason,
            mig_mode=last.mig_mode,
            mig_devices=migs,
        )


def _processes(handle) -> tuple[GPUProcess, ...]:
    """Compute processes (``nvmlDeviceGetComputeRunningProcesses_v3``); used memory in MiB.

    pynvml turns ``NVML_VALUE_NOT_AVAILABLE`` into None (e.g. under MIG without privileges).
    """
    infos = _unless_unsupported(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
    return tuple(
        GPUProcess(
            pid=info.pid,
            used_memory_mib=None if info.usedGpuMemory is None else info.usedGpuMemory // _MIB,
        )
        for info in infos
    )


def _mig_profile(attributes) -> str | None:
    """The MIG profile name (``"1g.5gb"``, ``"1c.2g.10gb"``) from ``nvmlDeviceGetAttributes_v2``.

    As in the NVIDIA MIG User Guide: compute slices (when fewer than the GPU slices), GPU
    slices, and the memory in GB rounded up.
    """
    gpu_slices = attributes.gpuInstanceSliceCount
    if not gpu_slices:
        return None
    compute_slices = attributes.computeInstanceSliceCount
    memory_gb = -(-attributes.memorySizeMB // 1024)
    prefix = f"{compute_slices}c." if compute_slices and compute_slices != gpu_slices else ""
    return f"{prefix}{gpu_slices}g.{memory_gb}gb"


def _unless_unsupported(query, *args):
    """``query(*args)``, or None where NVML answers ``NVML_ERROR_NOT_SUPPORTED``."""
    try:
        return query(*args)
    except pynvml.NVMLError_NotSupported:
        return None


def _describe(error: pynvml.NVMLError) -> str:
    """An NVML error for people: its text and its ``NVML_ERROR_*`` name."""
    names = [
        name
        for name, value in vars(pynvml).items()
        if name.startswith("NVML_ERROR_") and value == error.value
    ]
    return f"{error} ({names[0]})" if names else str(error)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
