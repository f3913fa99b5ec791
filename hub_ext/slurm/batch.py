"""The Slurm backend's batch job: its settings, the member's workspace on shared storage,
and the job itself as a value.

- :class:`BatchSettings`: the image unpacked on shared storage, the workspace, the GPU
  device files, the container runtime (set as ``c.GPUSlurmSpawner.<trait>``);
- :func:`member_ids`, :func:`prepare_workspace`, :func:`check_mount_points`,
  :func:`check_runner`: whom the job runs as and what it needs, checked before anything is
  submitted, in sentences a member reads;
- :func:`make_batch_job`: the job of one start (the ``#SBATCH`` request and the script,
  every value a member or profile gives shell-quoted), a pure function of the profile's
  request, the member and the image.  :data:`BATCH_SCRIPT` is its template, batchspawner's
  ``batch_script``: the request, then only the GPU device files Slurm gave the job
  (``SLURM_JOB_GPUS``), the job's API token read from the member's token file, and
  ``container_command`` (bubblewrap on the unpacked image, :data:`BWRAP`, by default)
  around batchspawner's wrapper.

A notebook job (:mod:`hub_ext.jobs`) is the same batch job with its runner in place of
JupyterLab, its variables exported into it, a Slurm job name that says so and its maximum
run time as ``--time`` (:func:`job_time_limit`); docs: howto/notebook-jobs ("On Slurm").
"""

from __future__ import annotations

import math
import pwd
import shlex
from dataclasses import dataclass
from pathlib import Path

from batchspawner.batchspawner import format_template
from jupyterhub.traitlets import ByteSpecification
from tornado import web
from traitlets import TraitError

from ..common import metrics
from ..spawn.member_dirs import MemberDirRefused, member_dir
from .network import NetworkScript

__all__ = [
    "BATCH_SCRIPT",
    "BWRAP",
    "BatchJob",
    "check_mount_points",
    "check_runner",
    "job_time_limit",
    "make_batch_job",
    "member_ids",
    "prepare_workspace",
    "rootfs_of",
    "slurm_minutes",
    "slurm_request",
    "token_file",
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
#: (:mod:`hub_ext.slurm.network`).  Fields: see ``c.GPUSlurmSpawner.container_command``
#: (:mod:`.settings`).
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


def rootfs_of(image_dir: str, image: str) -> str:
    """Where the nodes find ``image`` unpacked: ``image_dir/<image, / and : as _>/rootfs``."""
    return str(Path(image_dir) / image.replace("/", "_").replace(":", "_") / "rootfs")


def token_file(workspace: str, server: str) -> str:
    """Where the job finds the API token of a start of server ``server`` ("" the default):
    in the member's workspace, ``.gpuhub/token-<server>``."""
    return f"{workspace}/.gpuhub/token-{server or 'default'}"


def member_ids(username: str) -> tuple[int, int]:
    """The member's Unix uid and gid on the cluster (their account there; Slurm runs the
    job as it).  Raises HTTPError(403) when the cluster has no such account."""
    try:
        entry = pwd.getpwnam(username)
    except KeyError:
        metrics.SPAWNS_REFUSED.labels(reason="no_uid_mapping").inc()
        raise web.HTTPError(
            403, f"{username} has no account on the cluster. Ask an admin to create it."
        ) from None
    return entry.pw_uid, entry.pw_gid


def prepare_workspace(path: str, uid: int, gid: int, log, who: str = "") -> str:
    """Create the member's workspace ``path`` and its log folder ``.gpuhub``, both owned by
    her and private (mode 0700), without following a link she made
    (:func:`hub_ext.spawn.member_dirs.member_dir`); returns ``path``.  Raises
    HTTPError(500) when it belongs to another uid or holds a link where a folder should
    be."""
    try:
        member_dir(path, uid, gid, private=(".gpuhub",))
    except MemberDirRefused as e:
        # e.g. an account deleted and its uid given to someone else: the job could not
        # even write its log there
        log.error("Refusing spawn of %s: %s (uid %d)", who, e, uid)
        raise web.HTTPError(
            500,
            "Your workspace folder belongs to another account or "
            "holds a link where a folder should be. Ask an admin "
            "to fix it.",
        ) from None
    return path


def check_mount_points(rootfs: str, image: str, datasets: dict, log, who: str = "") -> None:
    """The unpacked image must hold ``/datasets`` when the member has datasets: bubblewrap
    cannot make a mount point in its read-only root (``scripts/slurm-cluster.sh image``
    makes it).  Raises HTTPError(500) with a sentence for the member."""
    root = Path(rootfs)
    if datasets and root.is_dir() and not (root / "datasets").is_dir():
        log.error("Refusing spawn of %s: %s has no datasets folder to mount on", who, root)
        raise web.HTTPError(
            500,
            f"The image {image} on the cluster has no place to "
            "mount the datasets. Ask an admin to unpack it again.",
        )


def check_runner(
    rootfs: str, image: str, command: str, container_path: str, noun: str, log, who: str = ""
) -> None:
    """A workload's image on the cluster must hold its ``command`` (a notebook job's
    runner) on the container's PATH (``container_path``), looked for in the unpacked image;
    else the start is refused before anything is submitted or charged.  An image the hub
    cannot see (another ``container_command``) is left to the job.  Raises HTTPError(500)
    with a sentence naming what cannot run (``noun``: "notebook jobs")."""
    root = Path(rootfs)
    if not root.is_dir() or "/" in command:
        return
    folders = [root / d.lstrip("/") for d in container_path.split(":") if d]
    if any((folder / command).is_file() for folder in folders):
        return
    log.error("Refusing job %s: %s has no %s on %s", who, root, command, container_path)
    raise web.HTTPError(
        500,
        f"The image {image} on the cluster cannot run {noun} (it has no "
        f"{command}). Ask an admin to rebuild it and unpack it again.",
    )


def _dataset_binds(datasets: dict[str, str]) -> str:
    """bubblewrap's binds of the datasets, read-only at ``/datasets/<name>``: a tmpfs at the
    image's ``/datasets`` holds their mount points (the root is read-only), made read-only
    again once they are bound; "" for none."""
    if not datasets:
        return ""
    binds = (
        f"--ro-bind {shlex.quote(p)} /datasets/{shlex.quote(n)}"
        for n, p in sorted(datasets.items())
    )
    return " ".join(["--tmpfs /datasets", *binds, "--remount-ro /datasets"])


@dataclass(frozen=True)
class BatchJob:
    """A server's Slurm batch job as a value: ``options``, the fields of the
    ``#SBATCH`` request and of the commands (batchspawner's ``subvars``), and ``script``,
    the batch script sbatch reads."""

    options: dict
    script: str


def make_batch_job(
    request: dict,
    *,
    template: str,
    username: str,
    job_name: str,
    workspace: str,
    workspace_mount: str,
    token_file: str,
    gpu_device: str,
    container_command: str,
    rootfs: str,
    image: str,
    datasets: dict[str, str],
    batchspawner_dir: str,
    container_path: str,
    environment: list[str],
    network: NetworkScript | None = None,
    reservation: str = "",
    command: str = "",
    user_options: dict | None = None,
) -> BatchJob:
    """The batch job of one start, from the profile's request (``request``: batchspawner's
    ``req_*`` values by name without the prefix: partition, gres, memory, ...), the member
    (``workspace`` mounted at ``workspace_mount``; ``datasets``: name -> path on the nodes),
    the image unpacked at ``rootfs`` run by ``container_command`` (its fields filled),
    ``environment`` (names sbatch exports besides ``keepvars``), ``network`` (the job's own
    network namespace: :class:`hub_ext.slurm.network.NetworkScript`; None: the node's) and
    ``reservation`` (Slurm's reservation of the member's group, or "").  Every value a
    member or profile gives is shell-quoted.  A pure function (batchspawner fills
    ``template`` the same way)."""
    network = network or NetworkScript()
    options = dict(request)
    keepvars = options.get("keepvars", "").split(",")
    # the core's variables (a job's GPUHUB_JOB) go into the job (sbatch --export names all)
    keepvars += [name for name in environment if name not in keepvars]
    if reservation:
        options["options"] = " ".join(
            filter(None, [options.get("options", ""), f"--reservation={reservation}"])
        )
    options.update(
        keepvars=",".join(filter(None, keepvars)),
        # a word of the commands' shell line (exec_prefix), whatever the name holds
        username=shlex.quote(username),
        log=f"{workspace}/.gpuhub/slurm-%j.log",
        token_file=shlex.quote(token_file),
        job_name=job_name,
        gpu_device=gpu_device,
        network_prologue=network.prologue,
        network_runner=network.runner,
        container=container_command.format(
            rootfs=shlex.quote(rootfs),
            image=shlex.quote(image),
            workspace=shlex.quote(workspace),
            workspace_mount=shlex.quote(workspace_mount),
            dataset_binds=_dataset_binds(datasets),
            gpu_binds='"${gpu_binds[@]}"',
            batchspawner=shlex.quote(batchspawner_dir),
            path=shlex.quote(container_path),
            network=network.binds,
        ),
    )
    # batchspawner's order: the request, the command, then the member's choices
    script = format_template(template, **{**options, "cmd": command, **(user_options or {})})
    return BatchJob(options=options, script=script)
