"""The GPU kernels' part of the hub's configuration: their custom scope and who holds it,
the endpoints, the hook, the named-server limit, the settings.

Called by :func:`hub_ext.config.apply_config` after
:func:`hub_ext.jobs.hubconfig.apply_jobs_config` (which sets the server tokens' scopes and
the named-server limit that this extends).  JupyterHub RBAC: members hold
``custom:gpuhub:kernels!user`` through the default ``user`` role, and each server's token
too (``c.Spawner.server_token_scopes``), so the provisioner in a member's server acts on
that member's kernels, and the endpoints narrow a server's token to the kernels it started;
the GPU admins and ``gpuhub-cli`` hold it unfiltered (every kernel: the board's Stop).
"""

from __future__ import annotations

from ..common.services import grant_member_scope
from ..jobs.hubconfig import NamedServerLimit
from ..spawn.hooks import register_hook
from . import store
from .handlers import KERNELS_SCOPE, handlers
from .relay import handlers as relay_handlers

__all__ = ["HOOK", "MEMBER_SCOPE", "KernelsNamedServerLimit", "apply_kernels_config"]

HOOK = "hub_ext.kernels.hook.KernelsHook"
MEMBER_SCOPE = f"{KERNELS_SCOPE}!user"


def apply_kernels_config(c, settings) -> None:
    """Define ``custom:gpuhub:kernels``; give it filtered to the ``user`` role and server
    tokens, unfiltered to ``gpuhub-gpu-admins`` and ``gpuhub-cli``; add the endpoints and
    :class:`hub_ext.kernels.hook.KernelsHook` (first: a forged kernel start is refused
    before any other hook asks anything); make the named-server limit leave kernels out
    (:class:`KernelsNamedServerLimit`); set ``c.Kernels.per_user``,
    ``c.Kernels.idle_timeout`` and ``c.Kernels.contended_idle_timeout``; in the hub
    itself, start the kernels' keeper with the hub.  Raises ValueError when the admin
    roles are not made yet."""
    grant_member_scope(
        c,
        KERNELS_SCOPE,
        "GPU kernels: create, list, read and shut them down "
        "(filter with !user=<name> for one member's).",
        "apply_kernels_config",
    )
    have = list(c.Spawner.server_token_scopes) if "server_token_scopes" in c.Spawner else []
    c.Spawner.server_token_scopes = [s for s in have if s != MEMBER_SCOPE] + [MEMBER_SCOPE]
    extra = list(c.JupyterHub.extra_handlers) if "extra_handlers" in c.JupyterHub else []
    c.JupyterHub.extra_handlers = extra + [h for h in handlers + relay_handlers if h not in extra]
    register_hook(c, HOOK, first=True)
    limit = c.JupyterHub.get("named_server_limit_per_user", 0)
    if isinstance(limit, NamedServerLimit):
        limit = limit.limit
    if isinstance(limit, int) and limit > 0:  # a site's own callable is left alone
        c.JupyterHub.named_server_limit_per_user = KernelsNamedServerLimit(limit)
    c.Kernels.per_user = settings.kernels_per_user
    c.Kernels.idle_timeout = settings.kernel_idle_timeout
    c.Kernels.contended_idle_timeout = settings.kernel_contended_idle_timeout
    from jupyterhub.app import JupyterHub

    if JupyterHub.initialized():  # the hub loading this configuration, not a config check
        from .lifecycle import keep_from_start

        keep_from_start(JupyterHub.instance())


class KernelsNamedServerLimit(NamedServerLimit):
    """:class:`hub_ext.jobs.hubconfig.NamedServerLimit`, which leaves a member's notebook
    jobs out of JupyterHub's ``named_server_limit_per_user``, leaving her GPU kernels out
    too: each is a named server ``kernel-…``, and a member with two kernels could
    otherwise start no named server of her own."""

    def __call__(self, handler) -> int:
        limit = super().__call__(handler)
        if not handler.path_args:
            return limit
        user = handler.find_user(handler.path_args[0])
        if user is None:
            return limit
        return limit + store.count_servers(handler.db, user.name, set(user.orm_spawners))

    def __repr__(self) -> str:
        return f"KernelsNamedServerLimit({self.limit})"
