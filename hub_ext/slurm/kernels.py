"""GPU kernels on the Slurm backend (:mod:`hub_ext.kernels`; docs: explanation/gpu-kernels,
"Slurm: a relay"): what the Slurm spawner adds to run them.

A GPU kernel is a batch job like a member's server, on a GPU node of its profile, in the
same sandbox (her uid, her workspace and datasets at the same paths, only the GPUs Slurm
gave the job, a network namespace of its own), running ``gpuhub-kernel`` in place of
JupyterLab behind the sandbox's port forwarder.  Her server and the kernel share no
socket folder (they are on different nodes, each in its own sandbox), so every server on
this backend is told to reach its GPU kernels through the relay
(``GPUHUB_KERNEL_TRANSPORT=relay``: ``gpuhub_kernels.relay`` in the images, and the hub's
end, :mod:`hub_ext.kernels.relay`).

:class:`SlurmKernels` is mixed into :class:`hub_ext.slurm.spawner.GPUSlurmSpawner`; the
wiring is here, in one place, so that it moves onto the spawn lifecycle's workload seam
(issue 30) in one step.
"""

from __future__ import annotations

__all__ = ["TRANSPORT", "SlurmKernels"]

#: how a member's server reaches its GPU kernels on this backend (gpuhub_kernels.transport)
TRANSPORT = {"GPUHUB_KERNEL_TRANSPORT": "relay"}


class SlurmKernels:
    """The Slurm backend runs GPU kernels (see the module doc).  Needs the spawner's
    ``kernel``, ``job``, ``kernel_command``, ``job_command`` and ``cmd``."""

    runs_gpu_kernels = True

    def core_environment(self) -> dict:
        """The core's variables and :data:`TRANSPORT` (into the batch job: sbatch
        ``--export`` names them all)."""
        return {**super().core_environment(), **TRANSPORT}

    def workload_command(self) -> list[str]:
        """The command in the sandbox: a notebook job's runner, a GPU kernel's
        ``gpuhub-kernel``, or JupyterLab."""
        if self.job:
            return list(self.job_command)
        if self.kernel:
            return list(self.kernel_command)
        return list(self.cmd)

    def ended_reason(self) -> str:
        """The stop reason of a server whose job ended without the hub
        (hub_ext.common.runs.STOP_REASONS)."""
        if self.job:
            return "job_ended"
        return "kernel_ended" if self.kernel else "gone"
