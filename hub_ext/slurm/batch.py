"""The Slurm backend's batch job: its script, the container it runs, the member's workspace.

:class:`SlurmBatchJob` is mixed into :class:`hub_ext.slurm.spawner.GPUSlurmSpawner` (its
traits are set as ``c.GPUSlurmSpawner.<trait>``).  :data:`BATCH_SCRIPT` is batchspawner's
``batch_script``: the ``#SBATCH`` request from the profile's ``req_*`` traits, then only
the GPU device files Slurm gave the job (``SLURM_JOB_GPUS``), the job's API token read
from the member's token file, and ``container_command`` (bubblewrap on the image unpacked
on shared storage, :data:`BWRAP`, by default) around batchspawner's wrapper.
:meth:`SlurmBatchJob.get_req_subvars` fills its fields, every value a member or profile
gives shell-quoted.

A notebook job's server (``user_options["job"]``, :mod:`hub_ext.jobs`) is the same batch
job with ``gpuhub-notebook-job`` in place of JupyterLab behind batchspawner's wrapper
(:meth:`SlurmBatchJob.cmd_formatted_for_batch`), ``GPUHUB_JOB`` exported into it
(:meth:`SlurmBatchJob.get_req_subvars`), a Slurm job name that says so
(``gpuhub-notebook-<member>-job-<12 hex>``) and its maximum run time as ``--time``
(:func:`job_time_limit`); docs: howto/notebook-jobs ("On Slurm").
"""

from __future__ import annotations

import math
import os
import pwd
import shlex
from pathlib import Path

from jupyterhub.traitlets import ByteSpecification
from tornado import web
from traitlets import TraitError, Unicode
from traitlets.config import LoggingConfigurable

from ..common import metrics
from ..spawn.member_dirs import MemberDirRefused, member_dir
from .network import NetworkScript, SandboxNetwork

__all__ = [
    "BATCH_SCRIPT",
    "BWRAP",
    "SlurmBatchJob",
    "job_time_limit",
    "slurm_minutes",
    "slurm_request",
]

#: The member's notebook server inside the container: bubblewrap (Debian ``bubblewrap``,
#: unprivileged user namespaces) on the image's unpacked root filesystem, as the member's
#: own uid; ``--disable-userns`` (bubblewrap 0.8) stops the member making nested user
#: namespaces (``unshare -U``), and with them namespaces of every other kind: kernel code
#: members need not reach.  The member has her name, home and bash there, as in the Docker
#: images' terminal: ``/etc/passwd`` and ``/etc/group`` are the image's plus her entries
#: (``member_passwd``, ``member_group`` of :data:`BATCH_SCRIPT`, read from file
#: descriptors 7 and 8), and ``SHELL`` is bash, which JupyterLab's terminal runs.
#: ``{network}``: a network namespace of its own and the sockets that reach it
#: (:mod:`hub_ext.slurm.network`).  Fields: see :attr:`SlurmBatchJob.container_command`.
BWRAP = (
    "bwrap --unshare-user --disable-userns --unshare-pid --unshare-ipc --die-with-parent"
    " --ro-bind {rootfs} / --proc /proc --dev /dev --tmpfs /tmp --tmpfs /home/jovyan"
    " --bind {workspace} {workspace_mount} {dataset_binds} {gpu_binds}"
    " --ro-bind {batchspawner} /tmp/gpuhub-batchspawner/batchspawner"
    " --setenv PYTHONPATH /tmp/gpuhub-batchspawner --setenv HOME /home/jovyan"
    " --setenv PATH {path} --chdir /home/jovyan"
    " --perms 0644 --ro-bind-data 7 /etc/passwd --perms 0644 --ro-bind-data 8 /etc/group"
    " --setenv SHELL /bin/bash {network}"
    ' 7<<<"$(member_passwd {rootfs})" 8<<<"$(member_group {rootfs})"'
)

BATCH_SCRIPT = """#!/bin/bash
#SBATCH --output={{log}}
#SBATCH --job-name={{job_name}}
#SBATCH --chdir=/
#SBATCH --export={{keepvars}}
#SBATCH --no-requeue
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if account %}#SBATCH --account={{account}}
{% endif %}{% if qos %}#SBATCH --qos={{qos}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if gres %}#SBATCH --gres={{gres}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
set -euo pipefail
# only the GPUs Slurm gave this job (their indexes on this node), bound into the container
# (none on a CPU-only profile: Slurm then leaves SLURM_JOB_GPUS unset)
gpus=${SLURM_JOB_GPUS:-}
gpu_binds=()
for i in ${gpus//,/ }; do
  dev={{gpu_device}}
  gpu_binds+=(--dev-bind "$dev" "/dev/nvidia$i")
done
# the API token of the hub's latest start of this server (a job kept from before a hub
# restart gets the new one): left by the hub in a file of the member's, read once
if [ -f {{token_file}} ]; then
  JUPYTERHUB_API_TOKEN=$(<{{token_file}})
  rm -f {{token_file}}
  export JUPYTERHUB_API_TOKEN JPY_API_TOKEN=$JUPYTERHUB_API_TOKEN
fi
echo "gpuhub: job $SLURM_JOB_ID on $SLURMD_NODENAME, GPUs ${SLURM_JOB_GPUS:-none}"
# the member's account in the container (her name, home and bash, as the Docker images'
# terminal has): the image's /etc/passwd and /etc/group (under $1) with her entries in
# place of any of the same uid or gid; bubblewrap reads them (container_command)
member_passwd() {
  grep -v "^[^:]*:[^:]*:$(id -u):" "$1/etc/passwd" || true
  echo "$(id -un):x:$(id -u):$(id -g)::/home/jovyan:/bin/bash"
}
member_group() {
  grep -v "^[^:]*:[^:]*:$(id -g):" "$1/etc/group" || true
  echo "$(id -gn):x:$(id -g):"
}
# the member's files are hers alone (other cluster accounts share the nodes and storage)
umask 077
{{network_prologue}}exec {{network_runner}}{{container}} {{cmd}}
"""


def slurm_request(req_memory, req_nprocs, mem_limit, cpu_limit) -> tuple[str, str]:
    """The job's ``--mem`` and ``--cpus-per-task`` (batchspawner's ``req_memory``,
    ``req_nprocs``): the ``req_*`` values where set, else JupyterHub's ``mem_limit``
    (bytes, or "2G"; rounded up to whole MiB: "2048M") and ``cpu_limit`` (CPUs, rounded up:
    0.5 -> "1"); "" for none.  Raises ValueError for a memory size JupyterHub cannot
    read."""
    if not req_memory and mem_limit:
        try:
            size = ByteSpecification().validate(None, mem_limit)
        except TraitError as e:
            raise ValueError(f"mem_limit: {e}") from None
        req_memory = f"{math.ceil(size / 2**20)}M"
    if not req_nprocs and cpu_limit:
        req_nprocs = str(math.ceil(float(cpu_limit)))
    return str(req_memory or ""), str(req_nprocs or "")


_UNLIMITED = ("", "infinite", "unlimited")


def slurm_minutes(text: str) -> int | None:
    """A Slurm time limit (``--time``: "minutes", "minutes:seconds",
    "hours:minutes:seconds", "days-hours", "days-hours:minutes",
    "days-hours:minutes:seconds") -> whole minutes, seconds rounded up; None for none
    ("", "INFINITE", "UNLIMITED").  Raises ValueError for anything else."""
    text = str(text or "").strip()
    if text.lower() in _UNLIMITED:
        return None
    days, dash, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    numbers = [days, *parts]
    if len(parts) > 3 or not all(n.isascii() and n.isdigit() for n in numbers):
        raise ValueError(f"not a Slurm time limit: {text!r}")
    d, values = int(days), [int(n) for n in parts]
    if dash:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (values + [0, 0])[:3]
    elif len(values) == 3:
        hours, minutes, seconds = values
    else:  # minutes[:seconds]
        hours, (minutes, seconds) = 0, (values + [0])[:2]
    return d * 1440 + hours * 60 + minutes + math.ceil(seconds / 60)


def job_time_limit(runtime: str, max_seconds: int) -> str:
    """A notebook job's ``--time`` (batchspawner's ``req_runtime``): its maximum run time
    in whole minutes plus one (the hub's jobs keeper stops it first, with its own words;
    Slurm's limit is the backstop while the hub is down), or ``runtime`` (the profile's or
    site's limit) where that is shorter or the job has none (``max_seconds`` 0).  Raises
    ValueError for a ``runtime`` Slurm would not read."""
    limit = slurm_minutes(runtime)
    if not max_seconds:
        return str(runtime or "")
    minutes = math.ceil(max_seconds / 60) + 1
    return str(runtime) if limit is not None and limit <= minutes else str(minutes)


class SlurmBatchJob(LoggingConfigurable):
    """The batch job of a member's server: image, workspace, devices, container.

    Needs from the spawner it is mixed into: ``user``, ``_log_name``, ``job_name``,
    ``token_file()``, ``member_datasets()`` and ``workspace_mount``
    (:class:`hub_ext.spawn.mounts.MemberMounts`), and batchspawner's ``get_req_subvars`` after
    it in the method order."""

    image = Unicode(
        "gpuhub/base:latest",
        config=True,
        help="""The notebook image (the Docker backend's name for it).  The nodes run its
        unpacked root filesystem, ``image_dir/<image with / and : as _>/rootfs``
        (``scripts/slurm-cluster.sh image NAME`` makes it from the local Docker image).
        Usually set per profile.

            c.GPUSlurmSpawner.image = "gpuhub/pytorch:latest"
        """,
    )

    image_dir = Unicode(
        "/srv/gpuhub-slurm/images",
        config=True,
        help="""Shared folder, seen by every node, with the unpacked images.

            c.GPUSlurmSpawner.image_dir = "/cluster/gpuhub/images"
        """,
    )

    workspace = Unicode(
        "/srv/gpuhub-slurm/shared/home/{username}",
        config=True,
        help="""The member's workspace on shared storage every node sees (``{username}``
        is replaced); created by the hub, owned by the member, when missing.

            c.GPUSlurmSpawner.workspace = "/cluster/home/{username}/jupyter"
        """,
    )

    gpu_device = Unicode(
        "/dev/nvidia$i",
        config=True,
        help="""The device file of GPU index ``$i`` on a node, as a bash word in the batch
        script (``$SLURMD_NODENAME`` is the node).  The test cluster's stand-ins live under
        its folder.

            c.GPUSlurmSpawner.gpu_device = "/srv/gpuhub-slurm/dev/$SLURMD_NODENAME/nvidia$i"
        """,
    )

    container_command = Unicode(
        BWRAP,
        config=True,
        help="""The container runtime's command line in the batch script, the notebook
        command appended.  Fields: {rootfs}, {image}, {workspace}, {workspace_mount},
        {dataset_binds}, {gpu_binds} (a bash array of bubblewrap --dev-bind arguments),
        {batchspawner} (the wrapper package's folder), {path}, {network} (bubblewrap's
        arguments for the sandbox's own network, ``c.SandboxNetwork``; a command without it
        shares the node's network).  docs/howto/slurm.md ("What the cluster needs") has
        Apptainer and Enroot templates.

            c.GPUSlurmSpawner.container_command = "apptainer exec --nv {image} "

        {batchspawner} is the ``batchspawner`` package folder itself: bind it at
        ``<dir>/batchspawner`` with ``PYTHONPATH=<dir>``, so that nothing but it comes
        before the image's packages.
        """,
    )

    container_path = Unicode(
        "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        config=True,
        help="""PATH inside the container (the project's images keep Jupyter in /opt/venv).

            c.GPUSlurmSpawner.container_path = "/opt/conda/bin:/usr/bin:/bin"
        """,
    )

    def cmd_formatted_for_batch(self):
        """batchspawner's command in the batch script: its wrapper (it reports the port to
        the hub, then runs the command with ``runpy``), or in an isolated sandbox the
        network's (:mod:`hub_ext.slurm.sandbox_net`, which does the same through the
        sandbox's forwarders), around JupyterLab, ``gpuhub-notebook-job`` for a notebook
        job or ``gpuhub-kernel`` for a GPU kernel (:meth:`workload_command`)."""
        wrapper = self.network_script().wrapper or self.batchspawner_singleuser_cmd
        return " ".join([wrapper, *self.workload_command(), *self.get_args()])

    def workload_command(self) -> list[str]:
        """The command in the sandbox (:class:`hub_ext.slurm.kernels.SlurmKernels`)."""
        return list(self.job_command if self.job else self.cmd)

    def network_script(self) -> NetworkScript:
        """The batch script's part of the job's network (:mod:`hub_ext.slurm.network`): none
        for a ``container_command`` without its ``{network}`` field."""
        settings = SandboxNetwork(parent=self)
        if "{network}" not in self.container_command:
            if settings.isolated:
                self.log.warning(
                    "%s: container_command has no {network} field: the job shares the "
                    "node's network (c.SandboxNetwork.isolated)",
                    self._log_name,
                )
            return NetworkScript()
        return settings.script()

    async def job_workspace(self) -> tuple[str, int, int]:
        """The member's workspace on the shared storage (the hub's host sees it, as for
        :meth:`prepare_workspace`) and the member's uid and gid on the cluster, for a
        notebook job (:meth:`hub_ext.spawn.core.SpawnerCore.job_workspace`).  Raises
        HTTPError(403) without a cluster account, HTTPError(404) without a workspace."""
        uid, gid = self.member_ids()
        path = self.workspace.format(username=self.user.name)
        if not os.path.isdir(path):
            raise web.HTTPError(
                404, "You have no workspace yet: start a server once and save your notebook."
            )
        return path, uid, gid

    def member_ids(self) -> tuple[int, int]:
        """The member's Unix uid and gid on the cluster (their account there; Slurm runs
        the job as it).  Raises HTTPError(403) when the cluster has no such account."""
        try:
            entry = pwd.getpwnam(self.user.name)
        except KeyError:
            metrics.SPAWNS_REFUSED.labels(reason="no_uid_mapping").inc()
            raise web.HTTPError(
                403, f"{self.user.name} has no account on the cluster. Ask an admin to create it."
            ) from None
        return entry.pw_uid, entry.pw_gid

    def rootfs(self) -> str:
        return self.rootfs_of(self.image)

    def rootfs_of(self, image: str) -> str:
        """Where the nodes find ``image`` unpacked: ``image_dir/<image, / and : as _>/
        rootfs``."""
        return str(Path(self.image_dir) / image.replace("/", "_").replace(":", "_") / "rootfs")

    def check_mount_points(self, datasets: dict[str, str]) -> None:
        """The unpacked image must hold ``/datasets`` when the member has datasets:
        bubblewrap cannot make a mount point in its read-only root (``scripts/slurm-cluster.sh
        image`` makes it).  Raises HTTPError(500) with a sentence for the member."""
        rootfs = Path(self.rootfs())
        if datasets and rootfs.is_dir() and not (rootfs / "datasets").is_dir():
            self.log.error(
                "Refusing spawn of %s: %s has no datasets folder to mount on",
                self._log_name,
                rootfs,
            )
            raise web.HTTPError(
                500,
                f"The image {self.image} on the cluster has no place to "
                "mount the datasets. Ask an admin to unpack it again.",
            )

    def check_job_runner(self) -> None:
        """A notebook job's image on the cluster must hold its runner (``job_command`` on
        the container's PATH, ``container_path``), looked for in the unpacked image; else
        the job is refused before anything is submitted or charged.  An image the hub
        cannot see (another ``container_command``) is left to the job.  Raises
        HTTPError(500) with a sentence for the member."""
        rootfs = Path(self.rootfs())
        command = self.job_command[0]
        if not rootfs.is_dir() or "/" in command:
            return
        folders = [rootfs / d.lstrip("/") for d in self.container_path.split(":") if d]
        if any((folder / command).is_file() for folder in folders):
            return
        self.log.error(
            "Refusing job %s: %s has no %s on %s",
            self._log_name,
            rootfs,
            command,
            self.container_path,
        )
        raise web.HTTPError(
            500,
            f"The image {self.image} on the cluster cannot run notebook jobs (it has no "
            f"{command}). Ask an admin to rebuild it and unpack it again.",
        )

    def prepare_workspace(self) -> str:
        """Create the member's workspace and its log folder ``.gpuhub``, both owned by her
        and private (mode 0700), without following a link she made
        (:func:`hub_ext.spawn.member_dirs.member_dir`); returns the workspace.  Raises
        HTTPError(500) when it belongs to another uid or holds a link where a folder
        should be."""
        uid, gid = self.member_ids()
        path = self.workspace.format(username=self.user.name)
        try:
            member_dir(path, uid, gid, private=(".gpuhub",))
        except MemberDirRefused as e:
            # e.g. an account deleted and its uid given to someone else: the job could
            # not even write its log there
            self.log.error("Refusing spawn of %s: %s (uid %d)", self._log_name, e, uid)
            raise web.HTTPError(
                500,
                "Your workspace folder belongs to another account or "
                "holds a link where a folder should be. Ask an admin "
                "to fix it.",
            ) from None
        return path

    def get_req_subvars(self):
        subvars = super().get_req_subvars()
        workspace = self.workspace.format(username=self.user.name)
        import batchspawner

        # a tmpfs at the image's /datasets holds their mount points (the root is
        # read-only), made read-only again once they are bound
        datasets = self.member_datasets()
        dataset_binds = (
            " ".join(
                [
                    "--tmpfs /datasets",
                    *(
                        f"--ro-bind {shlex.quote(p)} /datasets/{shlex.quote(n)}"
                        for n, p in sorted(datasets.items())
                    ),
                    "--remount-ro /datasets",
                ]
            )
            if datasets
            else ""
        )
        network = self.network_script()
        keepvars = subvars.get("keepvars", "").split(",")
        # the core's variables (a job's GPUHUB_JOB) go into the job (sbatch --export names all)
        keepvars += [name for name in self.core_environment() if name not in keepvars]
        subvars.update(
            keepvars=",".join(filter(None, keepvars)),
            # a word of the commands' shell line (exec_prefix), whatever the name holds
            username=shlex.quote(self.user.name),
            log=f"{workspace}/.gpuhub/slurm-%j.log",
            token_file=shlex.quote(self.token_file()),
            job_name=self.job_name,
            gpu_device=self.gpu_device,
            network_prologue=network.prologue,
            network_runner=network.runner,
            container=self.container_command.format(
                rootfs=shlex.quote(self.rootfs()),
                image=shlex.quote(self.image),
                workspace=shlex.quote(workspace),
                workspace_mount=shlex.quote(self.workspace_mount),
                dataset_binds=dataset_binds,
                gpu_binds='"${gpu_binds[@]}"',
                batchspawner=shlex.quote(str(Path(batchspawner.__file__).parent)),
                path=shlex.quote(self.container_path),
                network=network.binds,
            ),
        )
        return subvars
