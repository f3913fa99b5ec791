"""The Docker backend's settings, ``c.GPUDockerSpawner.<trait>``: GPUs per server, the
network and the hub's name on its containers, the readiness check, the hub's server
limits, and the container a member lives in (workspace, uid mapping, process and
shared-memory limits, log rotation, umask).  The spawner (:mod:`hub_ext.docker.spawner`)
reads them; :mod:`hub_ext.docker.hubconfig` sets them from ``GPUHUB_*``, and each is listed
in docs/reference/settings.md.
"""

from __future__ import annotations

from traitlets import Bool, Float, Int, TraitError, Unicode, Union, validate
from traitlets.config import LoggingConfigurable

__all__ = ["DockerSettings"]


class DockerSettings(LoggingConfigurable):
    """The settings of the Docker backend (traits only: the spawner reads them)."""

    gpus = Union(
        [Int(), Unicode()],
        default_value=0,
        config=True,
        help="""GPUs per server: a count of whole GPUs, or a MIG slice profile such as
        "1g.5gb" for one MIG device.  Usually set per profile.

            c.GPUDockerSpawner.gpus = 1
        """,
    )

    host_network = Bool(
        False,
        config=True,
        help="""Run servers on the host's network, on 127.0.0.1 and a free port each.
        The default is a Docker bridge network (network_name).

            c.GPUDockerSpawner.host_network = True
        """,
    )

    hub_id = Unicode(
        "gpuhub",
        config=True,
        help="""Names this hub in container labels, so that reconciliation only looks at
        its own containers when several hubs share one Docker engine.

            c.GPUDockerSpawner.hub_id = "lab-hub"
        """,
    )

    ready_poll_interval = Float(
        0.01,
        config=True,
        help="""Seconds between checks whether a starting server's port takes connections
        (a TCP connect, refused at once while nothing listens: cheap for the hub, so it
        can be short); once it does, one HTTP request, which the server answers as soon as
        its event loop runs.

            c.GPUDockerSpawner.ready_poll_interval = 0.01
        """,
    )

    concurrent_spawn_limit = Int(
        0,
        config=True,
        help="""Servers starting at once on the hub, places in line not counted; 0: no
        limit.  Replaces c.JupyterHub.concurrent_spawn_limit, which counts places in line
        (hub_ext.config sets that one to 0).

            c.GPUDockerSpawner.concurrent_spawn_limit = 20
        """,
    )

    active_server_limit = Int(
        0,
        config=True,
        help="""Servers running or starting at once on the hub, places in line not
        counted; 0: no limit.  Replaces c.JupyterHub.active_server_limit, which counts
        places in line (hub_ext.config sets that one to 0).

            c.GPUDockerSpawner.active_server_limit = 40
        """,
    )

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
