"""How the hub is wired to a Credits API: ``apply_credits_config(c, settings)``.

Three ways, from :class:`hub_ext.config.Settings`:

- default: the reference service (``python -m hub_ext.credits.service``) runs as a
  JupyterHub-managed service named ``credits`` on 127.0.0.1:``GPUHUB_CREDITS_PORT``, its
  SQLite ledger and two tokens in the state directory (``credits-hub-token``,
  ``credits-admin-token``, mode 0600, made once).  The hub talks to it with the hub token;
  operators grant with the admin token (``gpuhub credits grant``).
- ``GPUHUB_CREDITS_URL`` + ``GPUHUB_CREDITS_TOKEN``: the organisation's own Credits API.
- ``GPUHUB_CREDITS=off``: no hook, no service; every profile is free.

Either way :class:`hub_ext.credits.hook.CreditsHook` runs before each container and the
home page shows its messages (:mod:`hub_ext.common.notices`, wired by ``apply_config``); the hub
that loads this configuration hands the settlements a previous hub left unsettled (a
refund owed when the Credits API could not be reached) to the meter when it starts
(:func:`hub_ext.credits.unsettled.settle_at_start`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..common.services import token_file
from ..spawn.hooks import register_hook

HOOK = "hub_ext.credits.hook.CreditsHook"
SERVICE_NAME = "credits"
HUB_TOKEN_FILE = "credits-hub-token"
ADMIN_TOKEN_FILE = "credits-admin-token"


def service_url(settings) -> str:
    """Where the managed service listens, as its ``url`` in ``c.JupyterHub.services``."""
    return f"http://127.0.0.1:{settings.credits_port}"


def api_url(settings) -> str:
    """The Credits API of the managed service, as the hub's client reaches it."""
    return service_url(settings) + f"/services/{SERVICE_NAME}/"


def managed_service(settings) -> dict:
    """The ``c.JupyterHub.services`` entry that runs the reference service.

    Its routes live under JupyterHub's service prefix (``/services/credits/``), so the
    proxy can route to it too; the tokens travel in its environment, never on its
    command line (which ``ps`` shows).
    """
    state = Path(settings.state_dir)
    return {
        "name": SERVICE_NAME,
        "url": service_url(settings),
        "display": False,
        "cwd": str(state),
        "command": [
            sys.executable,
            "-m",
            "hub_ext.credits.service",
            "--ip",
            "127.0.0.1",
            "--port",
            str(settings.credits_port),
            "--db-url",
            f"sqlite:///{state / 'credits.sqlite'}",
        ],
        "environment": {
            "GPUHUB_CREDITS_HUB_TOKEN": token_file(state / HUB_TOKEN_FILE),
            "GPUHUB_CREDITS_ADMIN_TOKEN": token_file(state / ADMIN_TOKEN_FILE),
        },
    }


def apply_credits_config(c, settings) -> None:
    """Add the credits hook and, by default, the reference service as a managed service.

    Raises ValueError when GPUHUB_CREDITS_URL is set without GPUHUB_CREDITS_TOKEN or is
    not an http(s) URL.
    """
    if not settings.credits:
        return
    if settings.credits_interval < 1:
        raise ValueError(
            f"GPUHUB_CREDITS_INTERVAL={settings.credits_interval}: an interval is at least "
            "1 second (900 is 15 minutes)"
        )
    if settings.credits_url:
        if not settings.credits_url.startswith(("http://", "https://")):
            raise ValueError(
                f"GPUHUB_CREDITS_URL={settings.credits_url!r} must start with http:// or https://"
            )
        if not settings.credits_token:
            raise ValueError("GPUHUB_CREDITS_URL is set but GPUHUB_CREDITS_TOKEN is empty")
        c.CreditsClient.url = settings.credits_url
        c.CreditsClient.token = settings.credits_token
    else:
        service = managed_service(settings)
        services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
        services = [s for s in services if s.get("name") != SERVICE_NAME] + [service]
        c.JupyterHub.services = services
        c.CreditsClient.url = api_url(settings)
        c.CreditsClient.token = service["environment"]["GPUHUB_CREDITS_HUB_TOKEN"]

    register_hook(c, HOOK)  # both backends' spawners read c.SpawnerCore
    c.CreditsHook.interval = settings.credits_interval
    c.CreditsHook.fail_open = settings.credits_fail_open
    from jupyterhub.app import JupyterHub

    if JupyterHub.initialized():  # the hub loading this configuration, not a config check
        from .hook import CreditsHook
        from .unsettled import settle_at_start

        settle_at_start(JupyterHub.instance(), CreditsHook)
