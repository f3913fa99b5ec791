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
from concurrent.futures import ThreadPoolExecutor

from ..backends import Backend, reason
from ..spawn.profiles import profile_requests
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

    def profile_node(self, settings, ask: bool):
        """The GPU node the built-in profiles' limits are derived from: of the nodes of
        the jobs' partition (``GPUHUB_SLURM_PARTITION``, else Slurm's default) that take
        jobs, those with GPUs, the one with the smallest GPU share
        (:meth:`hub_ext.slurm.cluster.Node.shape`); read with ``sinfo`` when ``ask``.  None
        (the profiles keep no limits: Slurm's ``DefMemPerCPU`` applies) when not asked or
        when Slurm does not answer, which the hub's log says."""
        if not ask:
            return None
        from traitlets.log import get_logger

        from .cluster import SlurmUnavailable

        try:
            nodes, default = read_nodes(settings, timeout=10)
        except SlurmUnavailable as e:
            get_logger().warning(
                "The built-in profiles get no memory or CPU limits: Slurm did not say what "
                "its nodes have (%s); jobs get Slurm's defaults (DefMemPerCPU)",
                e,
            )
            return None
        partition = settings.slurm_partition or default
        mine = [
            n
            for n in nodes
            if n.available and n.memory_mb and (not partition or partition in n.partitions)
        ]
        shapes = [n.shape() for n in ([n for n in mine if n.gpus] or mine)]
        return min(shapes, key=lambda shape: shape.gpu_share(), default=None)

    def check_profiles(self, settings, profiles: list[dict], timeout: float) -> list[str]:
        """Each profile's job (memory, CPUs, GPUs and partition, as the spawner submits
        it: :func:`hub_ext.slurm.fit.job_request`) against the nodes of its partition;
        nothing when Slurm does not answer (:meth:`reach` says so)."""
        from .cluster import SlurmUnavailable
        from .fit import job_request, partition_misfit

        try:
            nodes, default = read_nodes(settings, timeout=timeout * 2)
        except SlurmUnavailable:
            return []
        configured = {"req_partition": settings.slurm_partition}
        problems = []
        for label, overrides in profile_requests(profiles):
            values = {**configured, **overrides}
            partition = values.get("req_partition") or default
            try:
                why = partition_misfit(job_request(values), partition, nodes)
            except ValueError as e:
                why = f"a memory size Slurm cannot read ({e})"
            if why:
                problems.append(
                    f"profile {label!r} can never start on the cluster: it asks for {why}"
                )
        if not problems:
            print(f"ok: every profile fits a node of the cluster ({len(nodes)} nodes)")
        return problems

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


def read_nodes(settings, timeout: float):
    """The cluster's nodes and its default partition (``sinfo``, asked where the hub asks
    Slurm), from any thread, a running event loop's too (``asyncio.run`` in a worker
    thread).  Raises :class:`hub_ext.slurm.cluster.SlurmUnavailable`."""
    from .cluster import SlurmCluster

    env = {"SLURM_CONF": settings.slurm_conf} if settings.slurm_conf else {}
    cluster = SlurmCluster(env=env, submit=submit_host(settings), timeout=timeout)
    with ThreadPoolExecutor(1) as pool:
        nodes = pool.submit(asyncio.run, cluster.nodes(fresh=True)).result()
    return nodes, cluster.default_partition


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
