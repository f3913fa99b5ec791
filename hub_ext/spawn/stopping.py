"""Stop a running server from inside the hub, the way JupyterHub's own stop handler does.

Used by the parts of the hub that stop servers on their own: the credits hook (credits ran
out) and the culler (idle GPU, maximum age).  JupyterHub's ``BaseHandler.stop_single_user``
removes the server's proxy route first, so no request reaches a server that is going away,
then calls ``User.stop``, which calls ``Spawner.stop`` (GPUs back to the pool, the spawner's
hooks' ``after_stop``: the pro rata credit refund, the run record) and clears the server from
the database.
"""

from __future__ import annotations

import asyncio
import signal

__all__ = ["StopAfterCancelledStart", "exit_words", "stop_server"]

#: Seconds a stop waits for the clean-up of the start it cancelled (the container removed,
#: the hooks undone); JupyterHub's own start_timeout bounds a start far longer.
CANCELLED_START_WAIT = 60.0


async def stop_server(spawner, reason: str) -> None:
    """Stop ``spawner``'s server: proxy route, then ``User.stop``.  Async.

    ``reason`` is one of :data:`hub_ext.common.runs.STOP_REASONS`; while the stop runs it is
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


def exit_words(code, what: str = "its container") -> str:
    """Why a server's process ended, in words, from its exit code (an int, or None when
    unknown): ``exit_words(137)`` -> "its container was killed (SIGKILL, exit code 137)",
    ``exit_words(3)`` -> "its container exited with code 3".  A code above 128 is a signal,
    as a shell and Docker report it (128 + the signal's number)."""
    if not isinstance(code, int):
        return f"{what} ended (exit code unknown)"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        verb = "was stopped" if name == "SIGTERM" else "was killed"
        return f"{what} {verb} ({name}, exit code {code})"
    return f"{what} exited with code {code}"


class StopAfterCancelledStart:
    """Mixed into JupyterHub's ``UserServerAPIHandler``: the member's Stop of a server that
    is still starting waits for the cancelled start's clean-up, then stops as JupyterHub
    does.

    ``UserServerAPIHandler.delete`` (JupyterHub 6) cancels the pending start
    (``spawner._spawn_future``), sleeps 1 s and calls ``stop_single_user``, which raises
    ``RuntimeError("... pending spawn")`` (HTTP 500) while the start is still pending.  A
    start's clean-up (its container removed; its hooks undone: the debit refunded, the GPUs
    back to the pool) takes longer than that second under load, so the member's Stop was
    answered 500 although the server did stop.  The wait is at most
    :data:`CANCELLED_START_WAIT` seconds.
    """

    async def stop_single_user(self, user, server_name=""):
        spawner = user.spawners[server_name] if server_name in user.spawners else None
        start = getattr(spawner, "_spawn_future", None)
        if spawner is not None and spawner.pending == "spawn" and start is not None:
            done, _ = await asyncio.wait({start}, timeout=CANCELLED_START_WAIT)
            if not done:
                self.log.warning(
                    "The cancelled start of %s is still cleaning up after %g s",
                    spawner._log_name,
                    CANCELLED_START_WAIT,
                )
        return await super().stop_single_user(user, server_name)
