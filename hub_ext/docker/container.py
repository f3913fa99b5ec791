"""The container a member lives in: workspace, datasets, their own uid, limits, labels.

:class:`MemberContainer` is a part of :class:`hub_ext.docker.spawner.GPUDockerSpawner` (a
configurable mixin: its traits are set as ``c.GPUDockerSpawner.<trait>``).  Before anything
is reserved, :meth:`~MemberContainer.container_settings` checks what the container will
mount and run as and refuses with a plain sentence (a missing dataset, a bad uid mapping, a
workspace outside its root), creating nothing.  After the GPUs and the hooks,
:meth:`~MemberContainer._prepare_workspace` makes the workspace and
:meth:`~MemberContainer._prepare_container` turns the allocation into Docker's
``DeviceRequest``, labels, mounts and limits (Docker Engine API, ``ContainerCreate``).
"""

from __future__ import annotations

import copy
import json
import os
import time
from dataclasses import dataclass

from docker.errors import NotFound
from dockerspawner import DockerSpawner
from tornado import web
from traitlets import Bool, Int, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable

from ..common import metrics
from ..spawn.member_dirs import MemberDirRefused, member_dir
from ..spawn.profiles import LABEL_PREFIX

#: Prefix of the labels on every server container (user, server, profile, devices, since,
#: port, hook-state); :mod:`hub_ext.docker.reconcile` and ``gpuhub gpus`` read them.


class MemberContainer(LoggingConfigurable):
    """Workspace, datasets, uid and limits of a member's server container."""

    workspace = Unicode(
        "jupyterhub-user-{username}",
        config=True,
        help="""The member's persistent workspace, mounted at ``workspace_mount``: a Docker
        named volume, or an absolute host path (``{username}`` is replaced).  A stop, a new
        image or another profile never loses it.  A host path must lie under
        ``workspace_root``; a missing one is created there, owned by the member's uid.

            c.GPUDockerSpawner.workspace = "/srv/gpuhub/home/{username}"
        """,
    )

    workspace_root = Unicode(
        "",
        config=True,
        help="""The host folder that host-path workspaces must lie under (after
        ``{username}`` is filled in and the path normalised); the hub creates nothing
        outside it.  Required when ``workspace`` is a host path.

            c.GPUDockerSpawner.workspace_root = "/srv/gpuhub/home"
        """,
    )

    uid_map_file = Unicode(
        "",
        config=True,
        help="""JSON file mapping usernames to their own uid and gid,
        ``{"alice": {"uid": 1234, "gid": 1234}}``, so files on shared storage are theirs.
        A uid and gid in ``auth_state["gpuhub"]`` (the authenticator's ``uid_claim``) win
        over the file.

            c.GPUDockerSpawner.uid_map_file = "/etc/gpuhub/uids.json"
        """,
    )

    require_uid_mapping = Bool(
        False,
        config=True,
        help="""Refuse to start a member with no uid mapping (instead of running them as
        jovyan, uid 1000).

            c.GPUDockerSpawner.require_uid_mapping = True
        """,
    )

    pids_limit = Int(
        4096,
        config=True,
        help="""The most processes a server may run (docker run --pids-limit).

            c.GPUDockerSpawner.pids_limit = 4096
        """,
    )

    shm_size = Unicode(
        "2g",
        config=True,
        help="""Size of /dev/shm; PyTorch data loaders share tensors through it and the
        Docker default of 64 MB makes them crash (PyTorch docs, "Docker image").

            c.GPUDockerSpawner.shm_size = "8g"
        """,
    )

    log_max_size = Unicode(
        "50m",
        config=True,
        help="""Container log rotation: the json-file driver keeps 3 files of this size.

            c.GPUDockerSpawner.log_max_size = "50m"
        """,
    )

    umask = Unicode(
        "077",
        config=True,
        help="""The umask of the member's server and all it starts (kernels, terminals,
        files saved from JupyterLab), as octal digits; "" keeps the image's.  077: a new
        file in the workspace is the member's alone (0600), as in Slurm jobs, on storage
        that other accounts may reach.  The server's command runs under ``sh -c 'umask
        ...; exec "$@"'`` (every image has ``/bin/sh``).

            c.GPUDockerSpawner.umask = "027"
        """,
    )

    @validate("umask")
    def _valid_umask(self, proposal):
        value = proposal["value"]
        if value and not (len(value) <= 4 and set(value) <= set("01234567")):
            raise TraitError(
                f"c.GPUDockerSpawner.umask must be octal digits such as "
                f'"077" (or "" for the image\'s own), not {value!r}'
            )
        return value

    async def member_ids(self) -> tuple[int, int] | None:
        """(uid, gid) the member's server runs as, or None for the image's jovyan (1000).

        From ``auth_state["gpuhub"]`` (``uid``, ``gid``: the authenticator copies them
        from the provider's claims), else ``uid_map_file``.  Raises ``HTTPError(403)``
        when ``require_uid_mapping`` is set and there is none, or when a mapping is not
        two positive whole numbers (never root, never the root group), and
        ``HTTPError(500)`` when the mapping file cannot be read.
        """
        entry, source = None, ""
        auth_state = await self.user.get_auth_state() if self.user else None
        ours = (auth_state or {}).get("gpuhub") or {}
        if ours.get("uid") is not None:
            entry, source = ours, "the login service's account data"
        elif self.uid_map_file:
            try:
                with open(self.uid_map_file) as f:
                    entry = json.load(f).get(self.user.name)
            except (OSError, ValueError, AttributeError) as e:
                self.log.error("uid_map_file %s unreadable: %s", self.uid_map_file, e)
                raise web.HTTPError(
                    500,
                    "The uid mapping of this hub cannot be read. "
                    "Ask an admin to check the hub log.",
                ) from e
            source = f"the uid mapping ({self.uid_map_file})"
        if entry is None:
            if self.require_uid_mapping:
                metrics.SPAWNS_REFUSED.labels(reason="no_uid_mapping").inc()
                raise web.HTTPError(
                    403,
                    f"No uid is mapped for {self.user.name}, and this hub runs every "
                    "member under their own uid. Ask an admin to add you to the uid mapping.",
                )
            return None
        try:
            return mapped_ids(entry)
        except ValueError:
            metrics.SPAWNS_REFUSED.labels(reason="bad_uid_mapping").inc()
            self.log.error("Refusing spawn of %s: %s gives %r", self._log_name, source, entry)
            raise web.HTTPError(
                403,
                f"The uid mapping of {self.user.name} is not a valid non-root uid and "
                "gid; servers never run as root. Ask an admin to fix it.",
            ) from None

    async def container_settings(self) -> dict:
        """Check what the container will mount and run as, before anything is reserved.

        Raises ``HTTPError`` with a plain sentence for a missing dataset path or a missing
        uid mapping; creates nothing.
        """
        datasets = self.checked_datasets()  # hub_ext.spawn.mounts.MemberMounts
        return {
            "ids": await self.member_ids(),
            "datasets": datasets,
            "workspace": self.member_workspace(),
        }

    async def job_workspace(self) -> tuple[str, int, int]:
        """The member's workspace on this machine, and its owner (uid, gid), for a notebook
        job (:meth:`hub_ext.spawn.core.SpawnerCore.job_workspace`): a host path as it is, a
        named volume by its mount point (``docker volume inspect``: the hub runs beside
        the engine).  Raises ``HTTPError(404)`` when the member has no workspace yet."""
        ids = await self.member_ids() or (1000, 100)
        workspace = self.member_workspace()
        if not workspace.startswith("/"):
            try:
                volume = await self.docker("inspect_volume", workspace)
            except NotFound:
                workspace = ""
            else:
                workspace = volume["Mountpoint"]
        if not workspace or not os.path.isdir(workspace):
            raise web.HTTPError(
                404, "You have no workspace yet: start a server once and save your notebook."
            )
        return workspace, *ids

    def member_workspace(self) -> str:
        """The workspace of this member: a volume name, or a host path under
        ``workspace_root``.  Raises ``HTTPError(500)`` for a host path outside it."""
        workspace = self._render_templates(self.workspace)
        if not workspace.startswith("/"):
            return workspace
        path = os.path.normpath(workspace)
        root = os.path.normpath(self.workspace_root) if self.workspace_root else ""
        if not root or os.path.commonpath([root, path]) != root or path == root:
            self.log.error(
                "Workspace %s of %s is not under workspace_root %r",
                path,
                self._log_name,
                self.workspace_root,
            )
            raise web.HTTPError(
                500,
                "Your workspace is not configured correctly on this hub. Ask an admin "
                "to check the workspace settings.",
            )
        return path

    async def _prepare_workspace(self, container: dict) -> None:
        """Make sure the workspace exists, owned by the member's uid."""
        workspace = container["workspace"]
        uid, gid = container["ids"] or (1000, 100)
        if workspace.startswith("/"):
            if not os.path.lexists(workspace):
                try:  # by descriptor: no chown follows a link (hub_ext.spawn.member_dirs)
                    member_dir(workspace, uid, gid)
                except MemberDirRefused as e:
                    self.log.error("Workspace of %s not made: %s", self._log_name, e)
                    raise web.HTTPError(
                        500,
                        "Your workspace could not be made. Ask an "
                        "admin to check the workspace settings.",
                    ) from None
                self.log.info(
                    "Created workspace %s for %s (uid %s)", workspace, self._log_name, uid
                )
            return
        try:
            await self.docker("inspect_volume", workspace)
            return
        except NotFound:
            pass
        await self.docker(
            "create_volume", workspace, labels={LABEL_PREFIX + "user": self.user.name}
        )
        if container["ids"] is not None:
            # a new named volume is filled from the image (owned by jovyan) the first time
            # it is mounted: do that here, at the same path, then give it to the member's
            # own uid, with a short root container that has no network
            # (an empty volume is filled again at every mount, owner included: the marker
            # file keeps it non-empty so the chown sticks)
            marker = f"{self.workspace_mount}/.gpuhub-workspace"
            helper = await self.docker(
                "create_container",
                self.image,
                user="0",
                entrypoint=["sh", "-c"],
                command=[f"touch {marker} && chown {uid}:{gid} {self.workspace_mount} {marker}"],
                host_config=self.client.create_host_config(
                    binds={workspace: {"bind": self.workspace_mount, "mode": "rw"}},
                    network_mode="none",
                ),
            )
            try:
                await self.docker("start", helper["Id"])
                await self.docker("wait", helper["Id"], timeout=60)
            finally:
                await self.docker("remove_container", helper["Id"], force=True)

    def container_labels(self) -> dict:
        """The hub's labels on this start's container: who, which server and profile, its
        devices since when, where it serves, what the workload and the hooks recorded."""
        labels = {
            "hub": self.hub_id,
            "user": self.user.name,
            "server": self.name or "",
            "profile": self.profile_slug,
            "devices": ",".join(self.allocation.uuids) if self.allocation else "",
            "since": str(self.allocation.since if self.allocation else time.time()),
            # where the server listens (on the host with host networking): a hub that
            # restarts during the start finds it there (GPUDockerSpawner.get_url)
            "port": str(self.port),
            # a notebook job's id (hub_ext.jobs)
            **self.workload.labels(),
        }
        if self.hook_state:
            # what the hooks recorded (the credits paid), for a hub killed before it saved
            # spawner state (see poll)
            labels["hook-state"] = json.dumps(self.hook_state, sort_keys=True)
        return {LABEL_PREFIX + k: v for k, v in labels.items()}

    async def create_object(self):
        """DockerSpawner's object hook: the container of this start, built as a value
        (:func:`make_container`) from the profile, the member and the allocation."""
        container = self._container
        if self.workload.command:  # a notebook job's runner in place of the server
            command = [*self.workload.command, *self.get_args()]
        else:
            command = await DockerSpawner.get_command(self)
        extra_create = self.extra_create_kwargs
        extra_host = self.extra_host_config
        spec = make_container(
            name=self.container_name,
            image=self.image,
            command=command,
            environment={**self.get_env(), **self.core_environment()},
            binds=self.volume_binds,
            port=self.port,
            labels=self.container_labels(),
            workspace=container["workspace"],
            workspace_mount=self.workspace_mount,
            ids=container["ids"],
            datasets=container["datasets"],
            devices=self.allocation.uuids if self.allocation else (),
            mem_limit=self.mem_limit,
            cpu_limit=self.cpu_limit,
            shm_size=self.shm_size,
            pids_limit=self.pids_limit,
            log_max_size=self.log_max_size,
            umask=self.umask,
            network_name=self.network_name,
            use_internal_ip=self.use_internal_ip,
            host_ip=self.host_ip,
            links=self.links,
            extra_create_kwargs=self._render_templates(extra_create)
            if isinstance(extra_create, dict)
            else {},
            extra_host_config=self._render_templates(extra_host)
            if isinstance(extra_host, dict)
            else {},
        )
        create = copy.deepcopy(spec.create)
        create.setdefault("host_config", {}).update(self.client.create_host_config(**spec.host))
        return await self.docker("create_container", **create)


@dataclass(frozen=True)
class ContainerSpec:
    """A member's server container as a value: ``create``, the keyword arguments of
    docker-py's ``create_container`` (image, name, command, environment, volumes, ports,
    labels, user) and ``host``, those of ``create_host_config`` (binds, mounts, devices,
    limits, security options, network); Docker Engine API, ``ContainerCreate``."""

    create: dict
    host: dict


def make_container(
    *,
    name: str,
    image: str,
    command: list[str],
    environment: dict,
    binds: dict,
    port: int,
    labels: dict,
    workspace: str,
    workspace_mount: str,
    ids: tuple[int, int] | None = None,
    datasets: dict[str, str] | None = None,
    devices: tuple[str, ...] = (),
    mem_limit: int | None = None,
    cpu_limit: float | None = None,
    shm_size: str = "2g",
    pids_limit: int = 4096,
    log_max_size: str = "50m",
    umask: str = "",
    network_name: str = "bridge",
    use_internal_ip: bool = True,
    host_ip: str = "127.0.0.1",
    links: dict | None = None,
    extra_create_kwargs: dict | None = None,
    extra_host_config: dict | None = None,
) -> ContainerSpec:
    """The container of one start, from the profile's values (image, limits, the
    profile's ``extra_*`` Docker options), the member (``ids``: their uid and gid, or
    None for the image's jovyan; ``workspace`` mounted at ``workspace_mount``;
    ``datasets``: name -> host path, read-only at ``/datasets/<name>``) and the
    allocation (``devices``: GPU UUIDs, passed as Docker's ``DeviceRequest``).

    ``command``, ``environment`` and ``binds`` are the server's own (DockerSpawner's
    command, JupyterHub's environment, the configured volumes); ``labels`` the hub's, with
    their prefix.  A pure function: nothing is asked of Docker (the model is kubespawner's
    ``objects.make_pod``).
    """
    environment = dict(environment)
    if ids is not None:
        environment["HOME"] = "/home/jovyan"  # a uid without a passwd entry: HOME=/ else
    if not devices:
        # CUDA base images set NVIDIA_VISIBLE_DEVICES=all: with nvidia as the default
        # runtime a CPU server would see every GPU (NVIDIA container toolkit docs)
        environment["NVIDIA_VISIBLE_DEVICES"] = "void"
    if umask:  # the server and all it starts; the image's entrypoint (tini) still first
        command = ["sh", "-c", f'umask {umask} && exec "$@"', "sh", *command]
    binds = {**binds, workspace: {"bind": workspace_mount, "mode": "rw"}}
    create = {
        "image": image,
        "environment": environment,
        "volumes": sorted(bind["bind"] for bind in binds.values()),
        "name": name,
        "command": command,
        "ports": {f"{port}/tcp": None},
    }
    extra = copy.deepcopy(extra_create_kwargs or {})
    extra.setdefault("labels", {}).update(labels)
    if ids is not None:
        extra["user"] = "{}:{}".format(*ids)
    _deep_merge(create, extra)

    host: dict = {"binds": binds, "links": links or {}}
    if mem_limit is not None:
        host["mem_limit"] = mem_limit
    extra_host = copy.deepcopy(extra_host_config or {})
    if isinstance(cpu_limit, int | float) and cpu_limit > 0:
        # Docker's --cpus (HostConfig.NanoCpus) rather than a CFS quota, which the
        # engine refuses beside NanoCpus (Docker docs, "Runtime options ... CPU")
        host.update(nano_cpus=int(cpu_limit * 1e9), cpu_period=0, cpu_quota=0)
        extra_host.pop("cpu_period", None)
    elif cpu_limit is not None:  # DockerSpawner's CFS quota
        period = host["cpu_period"] = extra_host.get("cpu_period", 100_000)
        host["cpu_quota"] = int(cpu_limit * period)
    if not use_internal_ip:
        host["port_bindings"] = {port: (host_ip,)}
    _deep_merge(host, extra_host)
    if devices:
        # Docker's GPU request (docker run --gpus): the engine hands these exact UUIDs to
        # the NVIDIA hook, which sets NVIDIA_VISIBLE_DEVICES
        host["device_requests"] = [
            {"Driver": "nvidia", "DeviceIDs": list(devices), "Capabilities": [["gpu"]]}
        ]
    else:
        host.pop("device_requests", None)
    # removed by stop() or a failed start, not by the engine the moment it exits: the
    # logs of a server that dies while starting are what an admin needs
    host["auto_remove"] = False
    host.setdefault("shm_size", shm_size)
    host.setdefault("pids_limit", pids_limit)
    host.setdefault("security_opt", ["no-new-privileges"])
    host.setdefault("cap_drop", ["ALL"])
    host.setdefault(
        "log_config", {"Type": "json-file", "Config": {"max-size": log_max_size, "max-file": "3"}}
    )
    host["mounts"] = [
        {"Type": "bind", "Source": path, "Target": f"/datasets/{name}", "ReadOnly": True}
        for name, path in sorted((datasets or {}).items())
    ]
    host.setdefault("network_mode", network_name)
    return ContainerSpec(create=create, host=host)


def _deep_merge(dest: dict, src: dict) -> dict:
    """``src`` into ``dest``, dicts merged key by key (DockerSpawner's ``_deep_merge``)."""
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dest.get(key), dict):
            _deep_merge(dest[key], value)
        else:
            dest[key] = value
    return dest


def mapped_ids(entry) -> tuple[int, int]:
    """(uid, gid) of one uid-mapping entry, ``{"uid": N, "gid": M}`` (gid defaults to the
    uid).  Raises ValueError unless both are positive whole numbers: servers never run as
    root or the root group.  ``gpuhub config check`` checks each entry of the file with it."""
    try:
        uid = int(entry["uid"])
        gid = int(entry.get("gid", uid))
    except (KeyError, TypeError, ValueError, AttributeError):
        uid = gid = -1
    if uid <= 0 or gid <= 0:
        raise ValueError(f"{entry!r} is not a valid non-root uid and gid")
    return uid, gid
