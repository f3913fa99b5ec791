"""The container a member lives in: the member's uid and workspace, and the container
itself as a value (its settings: :mod:`hub_ext.docker.settings`).

- :func:`member_ids`, :func:`member_workspace`, :func:`prepare_workspace`: whom the server
  runs as and where its workspace is, checked before anything is reserved (a plain
  sentence for a missing uid mapping or a workspace outside its root) and made once the
  GPUs are the member's;
- :func:`make_container`: the container of one start (image, command, mounts, devices,
  limits, environment, labels) from the profile, the member and the allocation, a pure
  function (kubespawner's ``objects.make_pod`` is the model; Docker Engine API,
  ``ContainerCreate``).

The steps of a start are told in docs/explanation/spawn.md.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from dataclasses import dataclass

from docker.errors import NotFound
from tornado import web

from ..common import metrics
from ..spawn.member_dirs import MemberDirRefused, member_dir
from ..spawn.profiles import LABEL_PREFIX


async def member_ids(
    user, uid_map_file: str = "", require: bool = False, log=None, who: str = ""
) -> tuple[int, int] | None:
    """(uid, gid) ``user``'s server runs as, or None for the image's jovyan (1000).

    From ``auth_state["gpuhub"]`` (``uid``, ``gid``: the authenticator copies them from the
    provider's claims), else ``uid_map_file``.  Raises ``HTTPError(403)`` when ``require``
    (``require_uid_mapping``) is set and there is none, or when a mapping is not two
    positive whole numbers (never root, never the root group), and ``HTTPError(500)`` when
    the mapping file cannot be read.  ``log``, ``who``: the hub's log and the server.
    """
    log = log or logging.getLogger(__name__)
    entry, source = None, ""
    auth_state = await user.get_auth_state() if user else None
    ours = (auth_state or {}).get("gpuhub") or {}
    if ours.get("uid") is not None:
        entry, source = ours, "the login service's account data"
    elif uid_map_file:
        try:
            with open(uid_map_file) as f:
                entry = json.load(f).get(user.name)
        except (OSError, ValueError, AttributeError) as e:
            log.error("uid_map_file %s unreadable: %s", uid_map_file, e)
            raise web.HTTPError(
                500,
                "The uid mapping of this hub cannot be read. Ask an admin to check the hub log.",
            ) from e
        source = f"the uid mapping ({uid_map_file})"
    if entry is None:
        if require:
            metrics.SPAWNS_REFUSED.labels(reason="no_uid_mapping").inc()
            raise web.HTTPError(
                403,
                f"No uid is mapped for {user.name}, and this hub runs every "
                "member under their own uid. Ask an admin to add you to the uid mapping.",
            )
        return None
    try:
        return mapped_ids(entry)
    except ValueError:
        metrics.SPAWNS_REFUSED.labels(reason="bad_uid_mapping").inc()
        log.error("Refusing spawn of %s: %s gives %r", who, source, entry)
        raise web.HTTPError(
            403,
            f"The uid mapping of {user.name} is not a valid non-root uid and "
            "gid; servers never run as root. Ask an admin to fix it.",
        ) from None


def member_workspace(workspace: str, root: str, log=None, who: str = "") -> str:
    """The member's workspace (``workspace``: the setting with the member's name filled
    in): a volume name as it is, or a host path under ``root`` (``workspace_root``),
    normalised.  Raises ``HTTPError(500)`` for a host path outside it."""
    if not workspace.startswith("/"):
        return workspace
    path = os.path.normpath(workspace)
    root = os.path.normpath(root) if root else ""
    if not root or os.path.commonpath([root, path]) != root or path == root:
        (log or logging.getLogger(__name__)).error(
            "Workspace %s of %s is not under workspace_root %r", path, who, root
        )
        raise web.HTTPError(
            500,
            "Your workspace is not configured correctly on this hub. Ask an admin "
            "to check the workspace settings.",
        )
    return path


async def prepare_workspace(
    docker,
    client,
    *,
    image: str,
    workspace: str,
    workspace_mount: str,
    ids: tuple[int, int] | None,
    username: str,
    log,
    who: str = "",
) -> None:
    """Make sure the workspace exists, owned by the member's uid (``ids``; None: jovyan):
    a host path made without following a link (:func:`hub_ext.spawn.member_dirs.member_dir`),
    or a named volume (``docker``: DockerSpawner's ``docker(method, ...)``, ``client`` its
    API client) given to the uid by a short root container of ``image`` with no network.
    Raises ``HTTPError(500)`` when a host path cannot be made."""
    uid, gid = ids or (1000, 100)
    if workspace.startswith("/"):
        if not os.path.lexists(workspace):
            try:  # by descriptor: no chown follows a link (hub_ext.spawn.member_dirs)
                member_dir(workspace, uid, gid)
            except MemberDirRefused as e:
                log.error("Workspace of %s not made: %s", who, e)
                raise web.HTTPError(
                    500,
                    "Your workspace could not be made. Ask an "
                    "admin to check the workspace settings.",
                ) from None
            log.info("Created workspace %s for %s (uid %s)", workspace, who, uid)
        return
    try:
        await docker("inspect_volume", workspace)
        return
    except NotFound:
        pass
    await docker("create_volume", workspace, labels={LABEL_PREFIX + "user": username})
    if ids is not None:
        await _give_volume(docker, client, image, workspace, workspace_mount, uid, gid)


async def _give_volume(docker, client, image, volume, mount, uid, gid) -> None:
    """A new named volume is filled from the image (owned by jovyan) the first time it is
    mounted: do that here, at the same path, then give it to the member's own uid, with a
    short root container that has no network.  (An empty volume is filled again at every
    mount, owner included: the marker file keeps it non-empty so the chown sticks.)"""
    marker = f"{mount}/.gpuhub-workspace"
    helper = await docker(
        "create_container",
        image,
        user="0",
        entrypoint=["sh", "-c"],
        command=[f"touch {marker} && chown {uid}:{gid} {mount} {marker}"],
        host_config=client.create_host_config(
            binds={volume: {"bind": mount, "mode": "rw"}}, network_mode="none"
        ),
    )
    try:
        await docker("start", helper["Id"])
        await docker("wait", helper["Id"], timeout=60)
    finally:
        await docker("remove_container", helper["Id"], force=True)


async def workspace_folder(docker, workspace: str) -> str:
    """Where the workspace is on this machine: a host path as it is, a named volume by its
    mount point (``docker volume inspect``: the hub runs beside the engine); ``""`` when
    it does not exist yet."""
    if not workspace.startswith("/"):
        try:
            volume = await docker("inspect_volume", workspace)
        except NotFound:
            return ""
        workspace = volume["Mountpoint"]
    return workspace if os.path.isdir(workspace) else ""


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
    devices: tuple[str, ...] = (),
    umask: str = "",
    extra_create_kwargs: dict | None = None,
    **host,
) -> ContainerSpec:
    """The container of one start, from the profile's values (image, limits, the
    profile's ``extra_*`` Docker options), the member (``ids``: their uid and gid, or
    None for the image's jovyan; ``workspace`` mounted at ``workspace_mount``) and the
    allocation (``devices``: GPU UUIDs); ``host``: the keywords of :func:`host_config`.
    ``command``, ``environment`` and ``binds`` are the server's own (DockerSpawner's
    command, JupyterHub's environment, the configured volumes); ``labels`` the hub's, with
    their prefix.  A pure function: nothing is asked of Docker (the model is kubespawner's
    ``objects.make_pod``)."""
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
    return ContainerSpec(create=create, host=host_config(binds, port, devices, **host))


def host_config(
    binds: dict,
    port: int,
    devices: tuple[str, ...] = (),
    *,
    datasets: dict[str, str] | None = None,
    mem_limit: int | None = None,
    cpu_limit: float | None = None,
    shm_size: str = "2g",
    pids_limit: int = 4096,
    log_max_size: str = "50m",
    network_name: str = "bridge",
    use_internal_ip: bool = True,
    host_ip: str = "127.0.0.1",
    links: dict | None = None,
    extra_host_config: dict | None = None,
) -> dict:
    """A server container's host config: its ``binds``, the ``datasets`` read-only at
    ``/datasets/<name>``, the GPUs ``devices`` as Docker's ``DeviceRequest``, the limits,
    the security options and the network, under the profile's own ``extra_host_config``
    (the hub's device request, clean-up and mounts win over it)."""
    host: dict = {"binds": binds, "links": links or {}}
    if mem_limit is not None:
        host["mem_limit"] = mem_limit
    extra = copy.deepcopy(extra_host_config or {})
    if isinstance(cpu_limit, int | float) and cpu_limit > 0:
        # Docker's --cpus (HostConfig.NanoCpus) rather than a CFS quota, which the
        # engine refuses beside NanoCpus (Docker docs, "Runtime options ... CPU")
        host.update(nano_cpus=int(cpu_limit * 1e9), cpu_period=0, cpu_quota=0)
        extra.pop("cpu_period", None)
    elif cpu_limit is not None:  # DockerSpawner's CFS quota
        period = host["cpu_period"] = extra.get("cpu_period", 100_000)
        host["cpu_quota"] = int(cpu_limit * period)
    if not use_internal_ip:
        host["port_bindings"] = {port: (host_ip,)}
    _deep_merge(host, extra)
    host.pop("device_requests", None)
    if devices:
        # Docker's GPU request (docker run --gpus): the engine hands these exact UUIDs to
        # the NVIDIA hook, which sets NVIDIA_VISIBLE_DEVICES
        host["device_requests"] = [
            {"Driver": "nvidia", "DeviceIDs": list(devices), "Capabilities": [["gpu"]]}
        ]
    _harden(host, shm_size, pids_limit, log_max_size, network_name)
    host["mounts"] = [
        {"Type": "bind", "Source": path, "Target": f"/datasets/{dataset}", "ReadOnly": True}
        for dataset, path in sorted((datasets or {}).items())
    ]
    return host


def _harden(host: dict, shm_size: str, pids_limit: int, log_max_size: str, network: str):
    """The hub's own parts of every host config, the profile's limits kept where it set
    them: no auto-removal (the logs of a server that dies while starting are what an admin
    needs; stop() or a failed start removes it), ``/dev/shm``, the process limit, no new
    privileges, no capabilities, rotated logs, the network."""
    host["auto_remove"] = False
    for key, value in (
        ("shm_size", shm_size),
        ("pids_limit", pids_limit),
        ("security_opt", ["no-new-privileges"]),
        ("cap_drop", ["ALL"]),
        (
            "log_config",
            {"Type": "json-file", "Config": {"max-size": log_max_size, "max-file": "3"}},
        ),
        ("network_mode", network),
    ):
        host.setdefault(key, value)


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
