"""How the hub culls: ``apply_culling_config(c, settings, profiles)``.

From :class:`hub_ext.config.Settings` (``GPUHUB_CULL_IDLE_TIMEOUT``, ``GPUHUB_CULL_MAX_AGE``,
``GPUHUB_GPU_IDLE_TIMEOUT``, ``GPUHUB_CULL_WARNING``) and the profile list:

- jupyterhub-idle-culler runs as a hub-managed service named ``idle-culler`` with the
  scopes its README lists for stopping servers, and no more (``list:users``,
  ``read:users:activity``, ``read:servers``, ``delete:servers``; no ``admin:users``, since
  it never deletes users).  ``--timeout`` is the site-wide idle timeout; profiles set
  their own through :mod:`hub_ext.culling.arbiter`; ``--max-age`` is not passed, because
  the maximum age is the hub's (:mod:`hub_ext.culling.culler`), which warns the member first.
  Its configuration file is written into the state directory.
- :class:`hub_ext.culling.culler.Culler` is added to the spawner's hooks (after credits, so a run
  records its credits meter id), and the hub's request log hook attributes the service's
  stops to it.
- The site-wide limits become the spawners' defaults (``c.SpawnerCore``), which profiles
  override (``gpu_idle_timeout``, ``cull_idle_timeout``, ``cull_max_age``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..common.services import add_service
from ..spawn.hooks import register_hook
from .arbiter import CONFIG_TEXT, ENV, ProfileIdleLimits

SERVICE_NAME = "idle-culler"
ROLE_NAME = "idle-culler"
#: jupyterhub-idle-culler's README, "Permissions", without the optional admin:users.
SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
CONFIG_FILE = "idle_culler_config.py"
HOOK = "hub_ext.culling.culler.Culler"
#: The culler's passes are at most this far apart (seconds); JupyterHub's own
#: last_activity is refreshed every 300 s (JupyterHub.last_activity_interval).
MAX_CULL_EVERY = 300


def cull_every(timeout: int, profile_limits: set[float]) -> int:
    """Seconds between the culler's passes: half the shortest idle timeout (the culler's own
    default is half of --timeout), at least 1 and at most :data:`MAX_CULL_EVERY`."""
    limits = [t for t in {float(timeout), *profile_limits} if t > 0]
    if not limits:
        return MAX_CULL_EVERY
    return int(min(MAX_CULL_EVERY, max(1, min(limits) // 2)))


def culler_service(settings, profiles: list[dict]) -> dict | None:
    """The ``c.JupyterHub.services`` entry of jupyterhub-idle-culler; None when no idle
    timeout is set anywhere (site-wide or in a profile).

    Writes the culler's configuration file into the state directory.  Raises ValueError
    for a negative timeout and :class:`hub_ext.spawn.profiles.ProfileError` for a bad profile
    list.
    """
    if settings.cull_idle_timeout < 0:
        raise ValueError(
            f"GPUHUB_CULL_IDLE_TIMEOUT={settings.cull_idle_timeout}: use 0 (no "
            "site-wide idle timeout) or a number of seconds"
        )
    profile_limits = ProfileIdleLimits(profiles).limits()
    if settings.cull_idle_timeout == 0 and not any(profile_limits):
        return None
    state = Path(settings.state_dir)
    config_file = state / CONFIG_FILE
    if not config_file.exists() or config_file.read_text() != CONFIG_TEXT:
        config_file.write_text(CONFIG_TEXT)
    return {
        "name": SERVICE_NAME,
        "cwd": str(state),
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={settings.cull_idle_timeout}",
            f"--cull-every={cull_every(settings.cull_idle_timeout, profile_limits)}",
            f"--config={config_file}",
        ],
        "environment": {ENV: json.dumps(profiles)},
    }


def apply_culling_config(c, settings, profiles: list[dict]) -> None:
    """Add the culler hook, the idle culler service and its role (see the module docstring).

    Raises ValueError for a negative setting.
    """
    for name, value in (
        ("GPUHUB_CULL_MAX_AGE", settings.cull_max_age),
        ("GPUHUB_GPU_IDLE_TIMEOUT", settings.gpu_idle_timeout),
        ("GPUHUB_CULL_WARNING", settings.cull_warning),
    ):
        if value < 0:
            raise ValueError(f"{name}={value}: use 0 (no limit) or a number of seconds")
    core = c.SpawnerCore  # both backends' spawners read it
    core.gpu_idle_timeout = settings.gpu_idle_timeout
    core.cull_idle_timeout = settings.cull_idle_timeout
    core.cull_max_age = settings.cull_max_age
    c.Culler.max_age_warning = settings.cull_warning
    c.Culler.service_name = SERVICE_NAME
    # the GPU readings (c.Culler.gpu_units) are the backend's: hub_ext.docker.hubconfig

    register_hook(c, HOOK)

    from .culler import log_request

    tornado_settings = (
        dict(c.JupyterHub.tornado_settings) if ("tornado_settings" in c.JupyterHub) else {}
    )
    tornado_settings["log_function"] = log_request
    c.JupyterHub.tornado_settings = tornado_settings

    service = culler_service(settings, profiles)
    if service is None:
        return
    add_service(
        c,
        service,
        {
            "name": ROLE_NAME,
            "description": "jupyterhub-idle-culler: list servers and their activity, stop them",
            "scopes": list(SCOPES),
        },
    )
