"""A GPU kernel as a workload of the spawn lifecycle (:mod:`hub_ext.spawn.workload`).

A GPU kernel's server is started by the hub at the request of the member's server
(:mod:`.lifecycle`) with ``user_options["kernel"]``; it runs ``gpuhub-kernel`` (images/base)
in place of JupyterLab, with the same uid, workspace, datasets, GPUs and limits, waits in
the same line for its GPUs, is metered by the same meter (the ledger names the kernel and
its notebook), and ends by itself (its shutdown), by its own idle time-out (the kernels'
keeper, not the idle culler's) or with its parent server.  Registered in
``c.SpawnerCore.workloads`` by its import string.
"""

from __future__ import annotations

import json

from ..spawn.workload import Workload

__all__ = ["GPUKernel", "kernel_of"]


class GPUKernel(Workload):
    """A notebook's GPU kernel: ``value`` is its ``user_options["kernel"]`` (built by the
    hub only: :func:`hub_ext.kernels.lifecycle.kernel_options`, checked by :mod:`.hook`)."""

    option = "kernel"
    kind = "kernel"
    noun = "GPU kernels"
    command = ("gpuhub-kernel",)
    waits = True
    ends_by_itself = True
    ended_reason = "kernel_ended"

    @classmethod
    def parse(cls, value) -> GPUKernel:
        if not isinstance(value, dict) or not value.get("id"):
            raise ValueError("A GPU kernel's options are made by the hub only.")
        return cls(value)

    def environment(self, workspace_mount: str, exits_after_report: bool) -> dict:
        """``GPUHUB_KERNEL``: its options as JSON, read by ``gpuhub-kernel``."""
        return {"GPUHUB_KERNEL": json.dumps(self.value, sort_keys=True)}

    def labels(self) -> dict:
        return {"kernel": str(self.value.get("id", ""))}

    def overrides(self) -> dict:
        """A GPU kernel's idleness is its cells' (the kernels' own time-out, applied by
        :mod:`.lifecycle`), not the idle culler's."""
        return {"cull_idle_timeout": 0}

    def ledger(self, display_name: str | None) -> dict:
        return {
            "kernel": str(self.value.get("id", "")),
            "notebook": str(self.value.get("notebook") or ""),
        }


def kernel_of(spawner) -> dict | None:
    """The GPU kernel ``spawner`` runs (its ``user_options["kernel"]``), or None."""
    workload = getattr(spawner, "workload", None)
    return workload.value if isinstance(workload, GPUKernel) else None
