"""Stop a running server from inside the hub, the way JupyterHub's own stop handler does.

Used by the parts of the hub that stop servers on their own: the credits hook (credits ran
out) and the culler (idle GPU, maximum age).  JupyterHub's ``BaseHandler.stop_single_user``
removes the server's proxy route first, so no request reaches a server that is going away,
then calls ``User.stop``, which calls ``Spawner.stop`` (GPUs back to the pool, the spawner's
hooks' ``after_stop``: the pro rata credit refund, the run record) and clears the server from
the database.
"""

from __future__ import annotations

__all__ = ["stop_server"]


async def stop_server(spawner, reason: str) -> None:
    """Stop ``spawner``'s server: proxy route, then ``User.stop``.  Async.

    ``reason`` is one of :data:`hub_ext.runs.STOP_REASONS`; while the stop runs it is
    ``spawner.stop_reason``, so the spawner's hooks (the run record) know why the server
    stopped.  A stop that does not come through here (the member, an admin, the API) has
    no ``stop_reason``.

    Raises what the proxy or ``User.stop`` raise; the caller logs who and why.
    """
    user = spawner.user
    server_name = spawner.name or ""
    spawner.stop_reason = reason
    try:
        proxy = (getattr(user, "settings", None) or {}).get("proxy")
        if proxy is not None:
            await proxy.delete_user(user, server_name)
        await user.stop(server_name)
    finally:
        spawner.stop_reason = None
