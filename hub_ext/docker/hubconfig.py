"""``GPUHUB_BACKEND=docker``: the Docker backend's own part of the hub's configuration.

:func:`hub_ext.config.apply_config` sets what both backends' spawners read on the core's
sections (``c.SpawnerCore``, ``c.Spawner``: profiles, image, hooks, culling, time-outs),
then calls :meth:`DockerBackend.apply_config` for what only this backend has: the
containers (names, labels, network, workspace, uid map), the GPU pool, the server limits
the spawner applies itself, and the culler's NVML readings.
"""

from __future__ import annotations

import json

from ..backends import Backend, reason
from ..spawn.profiles import profile_requests

SPAWNER_CLASS = "hub_ext.docker.spawner.GPUDockerSpawner"


class DockerBackend(Backend):
    """Containers on the hub's own node, exclusive GPUs from its pool."""

    spawner_class = SPAWNER_CLASS

    def check_files(self, settings) -> list[str]:
        """The uid map (``GPUHUB_UID_MAP``), each entry read as the containers are made."""
        if not settings.uid_map_file:
            return []
        from .container import mapped_ids

        try:
            with open(settings.uid_map_file) as f:
                mapping = json.load(f)
            if not isinstance(mapping, dict):
                raise ValueError("not a JSON object {user: {uid, gid}}")
            for user, entry in mapping.items():
                try:
                    mapped_ids(entry)
                except ValueError as e:
                    raise ValueError(f"{user}: {e}") from None
        except (OSError, ValueError) as e:
            return [f"GPUHUB_UID_MAP={settings.uid_map_file}: {reason(e)}"]
        return []

    def profile_node(self, settings, ask: bool):
        """This machine (its memory and CPUs) with the GPUs ``GPUHUB_GPUS`` names."""
        from ..common.limits import Node, node_gpu_count

        return Node.probe(node_gpu_count(settings.gpus))

    def check_profiles(self, settings, profiles: list[dict], timeout: float) -> list[str]:
        """Each profile's ``mem_limit``, ``cpu_limit`` and GPUs against the Docker host's
        memory and CPUs (the engine's ``docker info``) and the GPUs of ``GPUHUB_GPUS`` (a
        MIG slice counts as one GPU here; the pool checks the slice)."""
        import docker

        from ..common.limits import Capacity, Request, memory_bytes, misfit, node_gpu_count
        from ..spawn.profiles import gpu_request

        try:
            info = docker.from_env(timeout=timeout).info()
        except Exception as e:  # noqa: BLE001 - reach() says the engine does not answer
            return [
                f"the profiles cannot be checked: the Docker engine does not answer: {reason(e)}"
            ]
        host = Capacity(
            "this machine",
            int(info["MemTotal"]),
            float(info["NCPU"]),
            {"": node_gpu_count(settings.gpus)},
        )
        problems = []
        for label, overrides in profile_requests(profiles):
            gpus, _ = gpu_request(overrides.get("gpus", 0))
            cpus = overrides.get("cpu_limit")
            request = Request(
                memory_bytes(overrides.get("mem_limit")),
                float(cpus) if isinstance(cpus, int | float) and cpus > 0 else None,
                gpus,
            )
            why = misfit(request, [host], "this machine")
            if why:
                problems.append(f"profile {label!r} can never start here: it asks for {why}")
        if not problems:
            print(
                f"ok: every profile fits this machine ({host.memory_bytes // 2**20} MiB, "
                f"{host.cpus:g} CPUs, {host.gpus['']} GPUs)"
            )
        return problems

    def reach(self, settings, timeout: float) -> list[str]:
        """The Docker engine answers a ping."""
        import docker

        try:
            docker.from_env(timeout=timeout).ping()
        except Exception as e:  # noqa: BLE001 - docker-py raises several kinds
            return [f"the Docker engine does not answer: {reason(e)}"]
        print("ok: the Docker engine")
        return []

    def apply_config(self, c, settings) -> None:
        """Raises ValueError naming ``GPUHUB_WORKSPACE`` (a host path without
        ``GPUHUB_WORKSPACE_ROOT``) or ``GPUHUB_GPUS`` (an unknown GPU source)."""
        c.JupyterHub.spawner_class = SPAWNER_CLASS
        spawner = c.GPUDockerSpawner
        spawner.prefix = settings.container_prefix
        spawner.hub_id = settings.hub_id
        spawner.pull_policy = "never"
        spawner.remove = True
        spawner.workspace = settings.workspace
        if settings.workspace.startswith("/") and not settings.workspace_root:
            raise ValueError(
                f"GPUHUB_WORKSPACE={settings.workspace!r} is a host path: set "
                "GPUHUB_WORKSPACE_ROOT to the folder the workspaces lie under"
            )
        spawner.workspace_root = settings.workspace_root
        spawner.uid_map_file = settings.uid_map_file
        if settings.docker_network == "host":
            # MACHINE.md: host networking needs these four together
            spawner.host_network = True
            spawner.network_name = "host"
            spawner.use_internal_ip = True
            spawner.ip = "127.0.0.1"
        else:
            spawner.network_name = settings.docker_network
            spawner.use_internal_ip = True

        if settings.gpus == "nvml":
            c.GPUPool.inventory_class = "nvml"
        elif settings.gpus.startswith("simulated:"):
            c.GPUPool.inventory_class = "simulated"
            c.GPUPool.simulated_devices = settings.gpus.split(":", 1)[1]
        else:
            raise ValueError(
                f"GPUHUB_GPUS={settings.gpus!r}: use 'nvml', 'simulated:<count>' or "
                "'simulated:<path to a JSON device list>'"
            )
        c.GPUPool.max_gpus_per_user = settings.max_gpus_per_user

        # JupyterHub counts places in line as starting servers: the spawner applies both
        # limits itself, without them (hub_ext.docker.server_limits)
        spawner.active_server_limit = c.JupyterHub.active_server_limit
        spawner.concurrent_spawn_limit = c.JupyterHub.concurrent_spawn_limit
        c.JupyterHub.active_server_limit = 0
        c.JupyterHub.concurrent_spawn_limit = 0

        from .pool import gpu_units_of  # NVML: only for the hub, not for `gpuhub usage`

        c.Culler.gpu_units = gpu_units_of()  # the GPUs of the hub's own node
