"""``GPUHUB_BACKEND=slurm``: the Slurm backend's own part of the hub's configuration.

:func:`hub_ext.config.apply_config` sets what both backends' spawners read on the core's
sections (``c.SpawnerCore``, ``c.Spawner``: profiles, image, pre-start hooks, culling,
time-outs), which :class:`hub_ext.slurm.spawner.GPUSlurmSpawner` reads through traitlets'
section inheritance; :meth:`SlurmBackend.apply_config` sets what only this backend has (the
Slurm request, the images and workspaces on shared storage, the submit host).
"""

from __future__ import annotations

import asyncio
import shlex

from ..backends import Backend, reason
from .submit import DEFAULT_SSH, SubmitHost, check_host

SPAWNER_CLASS = "hub_ext.slurm.spawner.GPUSlurmSpawner"


class SlurmBackend(Backend):
    """Batch jobs on a Slurm cluster (batchspawner); the GPUs are Slurm's to hand out."""

    spawner_class = SPAWNER_CLASS

    def reach(self, settings, timeout: float) -> list[str]:
        """Slurm's controller answers ``scontrol ping``, asked where the hub asks Slurm
        (the submit host when there is one)."""
        env = {"SLURM_CONF": settings.slurm_conf} if settings.slurm_conf else None
        try:
            out = asyncio.run(
                submit_host(settings).run(["scontrol", "ping"], env, timeout=timeout * 2)
            )
        except TimeoutError:
            return [
                f"Slurm's controller does not answer (scontrol ping): no answer in {timeout * 2} s"
            ]
        except Exception as e:  # noqa: BLE001 - ssh and scontrol fail differently
            return [f"Slurm's controller does not answer (scontrol ping): {reason(e)}"]
        if "UP" not in out:
            return [f"Slurm's controller is not up: {out.strip()}"]
        print(f"ok: Slurm's controller ({out.strip()})")
        return []

    def apply_config(self, c, settings) -> None:
        """Raises ValueError naming ``GPUHUB_SLURM_SUBMIT_HOST`` or
        ``GPUHUB_SLURM_SSH_OPTIONS`` when they cannot work."""
        c.JupyterHub.spawner_class = SPAWNER_CLASS
        slurm = c.GPUSlurmSpawner
        # the culler's GPU-idle watch reads NVML on the hub's own machine, which a Slurm
        # hub is not: only the maximum age and the run records apply
        c.Culler.gpu_units = None
        # the hub's Slurm reservations carry its id when it is not the default
        c.SlurmReservations.hub = settings.hub_id
        if settings.slurm_conf:
            slurm.slurm_env = {"SLURM_CONF": settings.slurm_conf}
        for trait, value in (
            ("req_partition", settings.slurm_partition),
            ("req_account", settings.slurm_account),
            ("req_qos", settings.slurm_qos),
            ("req_runtime", settings.slurm_time),
            ("image_dir", settings.slurm_image_dir),
            ("workspace", settings.slurm_workspace),
            ("gpu_device", settings.slurm_gpu_device),
        ):
            if value:
                slurm[trait] = value
        # the sandbox's own network (hub_ext.slurm.network)
        c.SandboxNetwork.outbound = settings.slurm_outbound
        submit = submit_host(settings)
        if submit.host:
            slurm.submit_host = submit.host
        if settings.slurm_ssh_options:
            slurm.submit_ssh_command = list(submit.ssh)
        from jupyterhub.app import JupyterHub

        if JupyterHub.initialized():  # the hub loading this configuration, not a check
            from .spawner import GPUSlurmSpawner
            from .spawner_reservations import start_reservation_pass

            start_reservation_pass(JupyterHub.instance(), GPUSlurmSpawner)
        # a job may wait in Slurm's queue: the hub keeps servers across its restarts, as
        # on Docker, and a start may take the hour the line allows
        slurm.start_timeout = max(c.Spawner.get("start_timeout", 0) or 0, 3600)

    def read_accounting(self, settings, runs: list):
        """Slurm's accounting of ``runs`` (sacct; :func:`hub_ext.slurm.accounting.
        read_accounting`)."""
        from .accounting import read_accounting

        return read_accounting(settings, runs)


def submit_host(settings) -> SubmitHost:
    """Where the Slurm commands run, as ``GPUHUB_SLURM_SUBMIT_HOST`` and
    ``GPUHUB_SLURM_SSH_OPTIONS`` say (the hub's own host when the first is empty), for the
    hub and for ``gpuhub usage``.  Raises ValueError naming the setting that is wrong."""
    ssh = DEFAULT_SSH
    if settings.slurm_ssh_options:
        try:
            ssh = (*DEFAULT_SSH, *shlex.split(settings.slurm_ssh_options))
        except ValueError as e:
            raise ValueError(f"GPUHUB_SLURM_SSH_OPTIONS: {e}") from None
    return SubmitHost(check_host(settings.slurm_submit_host), ssh)
