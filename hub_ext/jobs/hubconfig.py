"""The notebook jobs' part of the hub's configuration: their custom scope and who holds it,
the endpoints, the hook, the settings.

Called by :func:`hub_ext.config.apply_config` after
:func:`hub_ext.ops.board.apply_admin_config` (which makes the roles ``gpuhub-gpu-admins``
and ``gpuhub-cli``).  JupyterHub RBAC: members hold ``custom:gpuhub:jobs!user`` through
the default ``user`` role (their own jobs), and each server's token too
(``c.Spawner.server_token_scopes``: JupyterHub's ``server`` role plus that scope), so
the Scheduler in a member's server acts on that member's jobs and no one else's; the GPU
admins and ``gpuhub-cli`` hold it unfiltered (every job).
"""

from __future__ import annotations

from ..common.services import grant_member_scope
from . import store
from .handlers import JOBS_SCOPE, handlers

__all__ = ["HOOK", "MEMBER_SCOPE", "SERVER_SCOPES", "NamedServerLimit", "apply_jobs_config"]

HOOK = "hub_ext.jobs.hook.JobsHook"
MEMBER_SCOPE = f"{JOBS_SCOPE}!user"
#: JupyterHub's default ``server`` role's scopes, and the jobs of the server's own member
SERVER_SCOPES = ["users:activity!user", "access:servers!server", MEMBER_SCOPE]


def apply_jobs_config(c, settings) -> None:
    """Define ``custom:gpuhub:jobs``; give it filtered to the ``user`` role and server
    tokens, unfiltered to ``gpuhub-gpu-admins`` and ``gpuhub-cli``; add the endpoints and
    :class:`hub_ext.jobs.hook.JobsHook` (first: a forged job start is refused before any
    other hook asks anything); make the named-server limit leave jobs out
    (:class:`NamedServerLimit`); set ``c.Jobs.per_user`` and ``c.Jobs.notebook_max_mib``;
    in the hub itself, start the jobs' keeper with the hub.
    Raises ValueError when the admin roles are not made yet."""
    grant_member_scope(
        c,
        JOBS_SCOPE,
        "GPU notebook jobs: create, list, read, stop and delete them "
        "(filter with !user=<name> for one member's).",
        "apply_jobs_config",
    )
    c.Spawner.server_token_scopes = list(SERVER_SCOPES)
    extra = list(c.JupyterHub.extra_handlers) if "extra_handlers" in c.JupyterHub else []
    c.JupyterHub.extra_handlers = extra + [h for h in handlers if h not in extra]
    core = c.SpawnerCore
    hooks = list(core.before_container_hooks) if "before_container_hooks" in core else []
    core.before_container_hooks = [HOOK] + [h for h in hooks if h != HOOK]
    limit = c.JupyterHub.get("named_server_limit_per_user", 0)
    if isinstance(limit, int) and limit > 0:  # a site's own callable is left alone
        c.JupyterHub.named_server_limit_per_user = NamedServerLimit(limit)
    c.Jobs.per_user = settings.jobs_per_user
    c.Jobs.notebook_max_mib = settings.job_notebook_max_mib
    from jupyterhub.app import JupyterHub

    if JupyterHub.initialized():  # the hub loading this configuration, not a config check
        from .lifecycle import keep_from_start

        keep_from_start(JupyterHub.instance())


class NamedServerLimit:
    """JupyterHub's ``named_server_limit_per_user``, ``limit`` named servers, as the
    callable it accepts (``handler -> int``), which leaves a member's notebook jobs out of
    the count.

    A job is a named server, and JupyterHub counts every named server of the member in
    the request's path (``/users/<name>/servers/<server>``, ``/spawn/<name>/<server>``)
    against the limit: a member with one job running could start no named server of her
    own.  Pages without a member in their path (home, admin) show ``limit``."""

    def __init__(self, limit: int):
        self.limit = limit

    def __call__(self, handler) -> int:
        if not handler.path_args:
            return self.limit
        user = handler.find_user(handler.path_args[0])
        if user is None:
            return self.limit
        return self.limit + store.count_servers(handler.db, user.name, set(user.orm_spawners))

    def __repr__(self) -> str:
        return f"NamedServerLimit({self.limit})"
