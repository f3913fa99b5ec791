"""The hub's configuration as a tested function: ``apply_config(c, Settings.from_env())``.

``jupyterhub_config.py`` is a few lines that call this; tests call it on a fresh
``traitlets.config.Config`` and check the result, no hub needed (the pattern of
the-littlest-jupyterhub).  Every environment variable is declared once, in
:mod:`hub_ext.settings.rows`; :class:`Settings` and its parsing come from there.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .common.dburl import hub_db_url, with_password
from .settings import Settings

__all__ = [
    "DEFAULT_PROFILES",
    "Settings",
    "apply_config",
    "hub_db_url",
    "hub_profiles",
    "load_profiles",
    "proxy_command",
    "with_password",
]

REPO = Path(__file__).resolve().parent.parent

#: The profiles a fresh install offers; sites replace them with GPUHUB_PROFILES.  The hub
#: adds a memory and CPU limit to each from the node the backend runs them on
#: (:func:`hub_profiles`).
DEFAULT_PROFILES = [
    {
        "display_name": "CPU only",
        "slug": "cpu",
        "description": "JupyterLab and the scientific Python stack, no GPU.",
        "default": True,
        "gpus": 0,
        "credits_per_hour": 0,
        "spawner_override": {"image": "gpuhub/base:latest"},
    },
    {
        "display_name": "PyTorch, 1 GPU",
        "slug": "pytorch",
        "description": "PyTorch on one exclusive GPU.",
        "gpus": 1,
        "credits_per_hour": 1,
        "kernels": True,
        "spawner_override": {"image": "gpuhub/pytorch:latest"},
    },
]


def load_profiles(path: str) -> list[dict]:
    """The profile list from a JSON file, or the built-in defaults when ``path`` is empty."""
    if not path:
        return DEFAULT_PROFILES
    import json

    with open(path) as f:
        data = json.load(f)
    return data["profile_list"] if isinstance(data, dict) else data


def hub_profiles(settings: Settings, ask: bool) -> list[dict]:
    """The profile list the hub serves: ``GPUHUB_PROFILES`` as written, or the built-in
    profiles with memory and CPU limits derived from the backend's node
    (:meth:`hub_ext.backends.Backend.profile_node`: this machine on Docker, the GPU nodes
    on Slurm; :func:`hub_ext.common.limits.limited_profiles`).  ``ask``: whether the
    backend may be asked (a Slurm hub reads its nodes with ``sinfo`` when it starts)."""
    import copy

    from .backends import backend
    from .common.limits import limited_profiles

    profiles = load_profiles(settings.profiles_file)
    if settings.profiles_file:
        return profiles
    node = backend(settings.backend).profile_node(settings, ask)
    return limited_profiles(profiles, node) if node else copy.deepcopy(profiles)


def proxy_command(settings: Settings) -> list[str]:
    """configurable-http-proxy: the setting, the repo's node_modules, or PATH."""
    if settings.proxy_command:
        return [settings.proxy_command]
    local = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    if local.exists():
        return [str(local)]
    return [shutil.which("configurable-http-proxy") or "configurable-http-proxy"]


def apply_config(c, settings: Settings) -> None:
    """Fill the JupyterHub config object ``c`` from ``settings``.

    The state directory is made mode 0700 and a SQLite hub database mode 0600
    (:mod:`hub_ext.common.private_files`); managed services are guarded to die with the hub
    (:mod:`hub_ext.ops.service_guard`), and the hub that loads this configuration stops its
    periodic passes before its services when it shuts down (:mod:`hub_ext.common.periodic`).
    Raises ValueError for a setting that cannot work
    (e.g. the demo login on a non-loopback address, plain HTTP off loopback without
    ``GPUHUB_ALLOW_HTTP=1``, a secret file that others may read: :mod:`hub_ext.ops.serving`).
    """
    from .common.private_files import private_dir, private_sqlite

    state = private_dir(settings.state_dir)

    c.JupyterHub.db_url = hub_db_url(settings)
    private_sqlite(c.JupyterHub.db_url)
    c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.pid_file = str(state / "jupyterhub-proxy.pid")
    c.ConfigurableHTTPProxy.command = proxy_command(settings)
    c.JupyterHub.allow_named_servers = True
    # servers (and the GPUs they hold) outlive a hub restart or upgrade; the hub finds
    # them again from its database, spawner state and container labels
    c.JupyterHub.cleanup_servers = False
    from .common.logs import logging_config

    # JupyterHub logs some request bodies whole: no line longer than a few thousand
    # characters, whatever a request carried
    c.JupyterHub.logging_config = logging_config(
        c.JupyterHub.logging_config if "logging_config" in c.JupyterHub else None
    )
    from .common.templates import template_dir

    c.JupyterHub.template_paths = [str(template_dir())]
    from .ops.handlers import handlers

    c.JupyterHub.extra_handlers = handlers
    from .common.notices import home_notices

    template_vars = dict(c.JupyterHub.template_vars) if "template_vars" in c.JupyterHub else {}
    template_vars["gpuhub_notices"] = home_notices
    from .line.handlers import home_places

    template_vars["gpuhub_line"] = home_places
    c.JupyterHub.template_vars = template_vars

    # What both backends' spawners read, set once on the core's sections: every spawner
    # is a SpawnerCore, and traitlets gives an instance the sections of each Configurable
    # class in its MRO (the nearest class winning), as TLJH sets c.Spawner.*
    from jupyterhub.app import JupyterHub

    from .common.limits import Node, apply_limits_config, node_gpu_count

    profiles = hub_profiles(settings, ask=JupyterHub.initialized())
    apply_limits_config(c, settings, Node.probe(node_gpu_count(settings.gpus)))
    c.SpawnerCore.profile_list = profiles
    c.SpawnerCore.image = settings.image
    c.Spawner.start_timeout = 120
    c.Spawner.http_timeout = 60
    c.Spawner.default_url = "/lab"
    if settings.datasets_file:
        import json

        with open(settings.datasets_file) as f:
            c.SpawnerCore.datasets = json.load(f)

    from .credits.hubconfig import apply_credits_config

    apply_credits_config(c, settings)

    from .culling.hubconfig import apply_culling_config

    apply_culling_config(c, settings, profiles)

    from .line.hubconfig import apply_line_config

    apply_line_config(c, settings)

    from .ops.board import apply_admin_config

    apply_admin_config(c, settings)
    from .reservations.hubconfig import apply_reservations_config

    apply_reservations_config(c, settings)

    from .login.hubconfig import apply_auth_config

    apply_auth_config(c, settings)
    from .courses.hubconfig import apply_courses_config

    apply_courses_config(c, settings)  # after the board's roles and the login
    from .jobs.hubconfig import apply_jobs_config

    apply_jobs_config(c, settings)  # after the board's roles
    from .kernels.hubconfig import apply_kernels_config

    apply_kernels_config(c, settings)  # after the jobs' (server token scopes, the limit)

    from .ops.my_gpus import apply_my_gpus_config

    apply_my_gpus_config(c)  # after the jobs' and kernels' server token scopes

    from .ops.serving import apply_serving_config

    apply_serving_config(c, settings)

    from .ops.service_guard import guard_services

    guard_services(c, state)
    if JupyterHub.initialized():  # the hub loading this configuration, not a config check
        from .common.periodic import stop_passes_first

        stop_passes_first(JupyterHub.instance())

    # the backend's own settings: its spawner class, and the traits only it has
    from .backends import backend

    backend(settings.backend).apply_config(c, settings)
