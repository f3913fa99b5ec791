"""``GPUHUB_BACKEND=slurm``: the hub's settings for the Slurm backend.

Called by :func:`hub_ext.config.apply_config` after everything else, so the shared parts
configured for the Docker backend's spawner (profiles, pre-start hooks, time-outs) carry
over to :class:`hub_ext.slurm.spawner.GPUSlurmSpawner` unchanged.
"""

from __future__ import annotations

import shlex

from .submit import DEFAULT_SSH, SubmitHost, check_host

#: Spawner settings both backends share, copied from c.GPUDockerSpawner.
SHARED = ("profile_list", "image", "default_url", "start_timeout", "http_timeout",
          "gpu_idle_timeout", "cull_idle_timeout", "cull_max_age", "datasets",
          "workspace_mount")

#: Pre-start hooks the Slurm backend runs: the credits debit, undo and meter, and the
#: culler (maximum age, and the run records ``gpuhub usage`` reads).  The culler's GPU-idle
#: watch reads NVML on the hub's own machine, which a Slurm hub is not: it is off
#: (``c.Culler.gpu_units = None``).
HOOKS = ("hub_ext.credits.hook.CreditsHook", "hub_ext.culling.Culler")


def apply_slurm_config(c, settings) -> None:
    c.JupyterHub.spawner_class = "hub_ext.slurm.spawner.GPUSlurmSpawner"
    docker, slurm = c.GPUDockerSpawner, c.GPUSlurmSpawner
    for name in SHARED:
        if name in docker:
            slurm[name] = docker[name]
    if "before_container_hooks" in docker:
        slurm.before_container_hooks = [
            h for h in docker.before_container_hooks
            if isinstance(h, str) and h in HOOKS
        ]
    c.Culler.gpu_units = None
    if settings.slurm_conf:
        slurm.slurm_env = {"SLURM_CONF": settings.slurm_conf}
    for trait, value in (("req_partition", settings.slurm_partition),
                         ("req_account", settings.slurm_account),
                         ("req_qos", settings.slurm_qos),
                         ("req_runtime", settings.slurm_time),
                         ("image_dir", settings.slurm_image_dir),
                         ("workspace", settings.slurm_workspace),
                         ("gpu_device", settings.slurm_gpu_device)):
        if value:
            slurm[trait] = value
    submit = submit_host(settings)
    if submit.host:
        slurm.submit_host = submit.host
    if settings.slurm_ssh_options:
        slurm.submit_ssh_command = list(submit.ssh)
    # the hub keeps servers across its restarts, as on Docker
    slurm.start_timeout = max(slurm.get("start_timeout", 0) or 0, 3600)


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
