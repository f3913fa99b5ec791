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

from docker.errors import NotFound
from jupyterhub.utils import random_port
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

    async def get_command(self) -> list[str]:
        """DockerSpawner's command (``cmd`` or the image's, and the hub's arguments) under
        :attr:`umask`; the image's entrypoint (tini) still runs first."""
        command = await super().get_command()
        if not self.umask:
            return command
        return ["sh", "-c", f'umask {self.umask} && exec "$@"', "sh", *command]

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

    def _prepare_container(self, container: dict) -> None:
        """Device request, labels, mounts, limits and (host network) port for this start."""
        if self.host_network:
            self.port = random_port()
        labels = {
            LABEL_PREFIX + "hub": self.hub_id,
            LABEL_PREFIX + "user": self.user.name,
            LABEL_PREFIX + "server": self.name or "",
            LABEL_PREFIX + "profile": self.profile_slug,
            LABEL_PREFIX + "devices": ",".join(self.allocation.uuids) if self.allocation else "",
            LABEL_PREFIX + "since": str(self.allocation.since if self.allocation else time.time()),
            # where the server listens (on the host with host networking): a hub that
            # restarts during the start finds it there (GPUDockerSpawner.get_url)
            LABEL_PREFIX + "port": str(self.port),
        }
        if self.job:
            # a notebook job (hub_ext.jobs): its id on the container, and its runner in
            # place of jupyterhub-singleuser (same uid, workspace, GPUs, limits, network)
            labels[LABEL_PREFIX + "job"] = str(self.job.get("id", ""))
            self.cmd = list(self.job_command)
        if self.kernel:
            # a GPU kernel (hub_ext.kernels): likewise, gpuhub-kernel in its place
            labels[LABEL_PREFIX + "kernel"] = str(self.kernel.get("id", ""))
            self.cmd = list(self.kernel_command)
        self.environment = {**self.environment, **self.core_environment()}
        if self.hook_state:
            # what the hooks recorded (the credits paid), for a hub killed before it saved
            # spawner state (see poll)
            labels[LABEL_PREFIX + "hook-state"] = json.dumps(self.hook_state, sort_keys=True)
        create = (
            copy.deepcopy(self.extra_create_kwargs)
            if isinstance(self.extra_create_kwargs, dict)
            else {}
        )
        create.setdefault("labels", {}).update(labels)
        if container["ids"] is not None:
            create["user"] = "{}:{}".format(*container["ids"])
            # a uid with no passwd entry in the image gets HOME=/ from Docker
            self.environment = {**self.environment, "HOME": "/home/jovyan"}
        self.extra_create_kwargs = create
        self.volumes = {
            **{k: v for k, v in (self.volumes or {}).items()},
            container["workspace"]: self.workspace_mount,
        }
        host = (
            copy.deepcopy(self.extra_host_config)
            if isinstance(self.extra_host_config, dict)
            else {}
        )
        if self.allocation:
            # Docker's GPU request (docker run --gpus): the engine hands these exact
            # UUIDs to the NVIDIA hook, which sets NVIDIA_VISIBLE_DEVICES.
            host["device_requests"] = [
                {
                    "Driver": "nvidia",
                    "DeviceIDs": list(self.allocation.uuids),
                    "Capabilities": [["gpu"]],
                }
            ]
        else:
            host.pop("device_requests", None)
            # CUDA base images set NVIDIA_VISIBLE_DEVICES=all: with nvidia as the default
            # runtime a CPU server would see every GPU (NVIDIA container toolkit docs)
            self.environment = {**self.environment, "NVIDIA_VISIBLE_DEVICES": "void"}
        # removed by stop() or a failed start, not by the engine the moment it exits:
        # the logs of a server that dies while starting are what an admin needs
        host["auto_remove"] = False
        if isinstance(self.cpu_limit, int | float) and self.cpu_limit > 0:
            # Docker's --cpus (HostConfig.NanoCpus) rather than DockerSpawner's CFS quota:
            # a cpu_period of 0 keeps DockerSpawner from setting the quota too, which the
            # engine refuses beside NanoCpus (Docker docs, "Runtime options ... CPU")
            host["nano_cpus"] = int(self.cpu_limit * 1e9)
            host["cpu_period"] = 0
        host.setdefault("shm_size", self.shm_size)
        host.setdefault("pids_limit", self.pids_limit)
        host.setdefault("security_opt", ["no-new-privileges"])
        host.setdefault("cap_drop", ["ALL"])
        host.setdefault(
            "log_config",
            {"Type": "json-file", "Config": {"max-size": self.log_max_size, "max-file": "3"}},
        )
        host["mounts"] = [
            {"Type": "bind", "Source": path, "Target": f"/datasets/{name}", "ReadOnly": True}
            for name, path in sorted(container["datasets"].items())
        ]
        self.extra_host_config = host


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
