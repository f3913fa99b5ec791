"""The Slurm backend's settings, ``c.GPUSlurmSpawner.<trait>``: the Slurm commands and their
time-outs, where they run (the submit host), the image unpacked on shared storage, the
member's workspace, the GPU device files and the container runtime.  The spawner
(:mod:`hub_ext.slurm.spawner`) reads them; what they mean for a start is told in
docs/howto/slurm.md, and each is listed in docs/reference/settings.md.
"""

from __future__ import annotations

from traitlets import Dict, Float, Int, List, Unicode, Union, validate
from traitlets.config import LoggingConfigurable

from .batch import BWRAP
from .submit import DEFAULT_SSH, check_host

__all__ = ["SlurmSettings"]


class SlurmSettings(LoggingConfigurable):
    """The settings of the Slurm backend (traits only: the spawner reads them)."""

    slurm_env = Dict(
        config=True,
        help="""Environment of the Slurm commands the hub runs (sbatch, squeue, sinfo,
        scancel), e.g. the cluster's configuration file.

            c.GPUSlurmSpawner.slurm_env = {"SLURM_CONF": "/etc/slurm/slurm.conf"}
        """,
    )

    scheduler_timeout = Float(
        3.0,
        config=True,
        help="""Seconds slurmctld has to answer the check before a spawn (``sinfo``); a
        spawn is refused at once, in plain words, when it does not.

            c.GPUSlurmSpawner.scheduler_timeout = 3
        """,
    )

    line_poll_interval = Float(
        2.0,
        config=True,
        help="""Seconds between two reads of Slurm's queue for the places in line (one
        read for every waiting member).

            c.GPUSlurmSpawner.line_poll_interval = 2
        """,
    )

    job_exit_timeout = Float(
        30.0,
        config=True,
        help="""Seconds a notebook job whose runner has reported its end has to end by
        itself (its runner exits with the notebook's exit code, so that Slurm's accounting
        shows COMPLETED or FAILED) before the hub cancels it with ``scancel``.

            c.GPUSlurmSpawner.job_exit_timeout = 30
        """,
    )

    gpus = Union(
        [Int(), Unicode()],
        default_value=0,
        config=True,
        help="""GPUs per server, as in the Docker backend's profiles: a count, or a GRES
        type and count such as "a100:2".  Becomes ``req_gres`` ("gpu:2", "gpu:a100:2")
        unless a profile sets ``req_gres`` itself.  Usually set per profile.

            c.GPUSlurmSpawner.gpus = 1
        """,
    )

    submit_host = Unicode(
        "",
        config=True,
        help="""The host where the hub runs every Slurm command (sbatch, squeue, scancel,
        sinfo, scontrol) and writes the job's token file as the member, over OpenSSH
        (``submit_ssh_command``): ``login1`` or ``gpuhub@login1``.  Empty: on the hub's
        own host.  The member switch there is ``exec_prefix``.  docs/howto/slurm.md ("A
        submit host") says what the submit host needs.

            c.GPUSlurmSpawner.submit_host = "gpuhub@login1"
        """,
    )

    submit_ssh_command = List(
        list(DEFAULT_SSH),
        config=True,
        help="""The ssh command line before the submit host: add the site's options
        (identity file, port, known hosts).  The default keeps one shared connection per
        host (OpenSSH ControlMaster/ControlPersist, control socket in the hub user's
        ``~/.ssh``), fails instead of asking for a password (BatchMode) and gives up on a
        host that does not answer after 5 s (ConnectTimeout).

            from hub_ext.slurm.submit import DEFAULT_SSH
            c.GPUSlurmSpawner.submit_ssh_command = [
                *DEFAULT_SSH, "-i", "/srv/gpuhub/ssh/id_ed25519", "-p", "2222",
                "-o", "UserKnownHostsFile=/srv/gpuhub/ssh/known_hosts"]
        """,
    )

    submit_timeout = Float(
        60.0,
        config=True,
        help="""Seconds batchspawner's commands (sbatch, squeue, scancel) may take on the
        submit host before it counts as not answering (a job's state is then "unknown":
        its server keeps running).  Only with ``submit_host``.

            c.GPUSlurmSpawner.submit_timeout = 60
        """,
    )

    @validate("submit_host")
    def _check_submit_host(self, proposal):
        return check_host(proposal.value)

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
