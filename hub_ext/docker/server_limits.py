"""The hub's limits on servers starting and running at once, places in line not counted.

JupyterHub's ``concurrent_spawn_limit`` and ``active_server_limit`` (checked in
``BaseHandler.spawn_single_user``, counted by ``UserDict.count_active_users``) count
every pending spawn.  A member waiting in line for a GPU (:mod:`hub_ext.line`) is a
pending spawn that holds nothing: no container, no GPU, no debit.  Counted as JupyterHub
counts, twenty members in line would refuse every other start, the CPU profile's too.

So on the Docker backend the hub leaves JupyterHub's two limits at 0 and the spawner asks
:class:`ServerLimits` at its checks (``c.GPUDockerSpawner.concurrent_spawn_limit`` and
``active_server_limit``): the hub's servers counted as JupyterHub counts them, less the
places in line.  A place's own start, once its turn comes, is not refused: it waited for
a GPU that a stopped server gave back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tornado import web

from ..common import metrics

__all__ = ["ServerLimits"]


@dataclass(frozen=True)
class ServerLimits:
    """At most ``starting`` servers starting and ``active`` running or starting at once
    (0: no limit)."""

    starting: int = 0
    active: int = 0

    def check(self, spawner, waiting: Iterable[tuple[str, str]]) -> None:
        """Refuse ``spawner``'s start when the hub is at one of its limits.

        ``waiting``: the ``(user, server)`` keys of the places in line, left out of the
        count.  Counts every other server JupyterHub knows (``user.settings["users"]``,
        the hub's ``UserDict``) as ``count_active_users`` does: starting is a pending
        spawn, active is pending or ready; a start the spawn gate admitted
        (``handing_over``) counts before JupyterHub marks it pending.  Raises
        ``HTTPError(429)`` with a sentence.
        """
        if not (self.starting or self.active):
            return
        skip = set(waiting)
        starting = active = 0
        for key, other in others(spawner):
            if key in skip:
                continue
            handed = getattr(other, "handing_over", False)
            starting += other.pending == "spawn" or handed
            active += other.active or handed
        if self.starting and starting >= self.starting:
            raise _over(
                spawner,
                "starting",
                f"{starting} servers are starting right now, as many as the hub "
                "starts at once. Try again in a minute.",
            )
        if self.active and active >= self.active:
            raise _over(
                spawner,
                "active",
                f"The hub already runs {active} servers, as many as it can hold. "
                "Try again later, when someone has stopped theirs, or ask an admin.",
            )


def others(spawner) -> Iterator[tuple[tuple[str, str], object]]:
    """``((user, server), spawner)`` for every other spawner the hub holds (its
    ``UserDict``, ``user.settings["users"]``); none outside a hub."""
    users = (getattr(spawner.user, "settings", None) or {}).get("users")
    for user in list((users or {}).values()):
        for name, other in list(user.spawners.items()):
            if other is not spawner:
                yield (user.name, name or ""), other


def _over(spawner, reason: str, message: str) -> web.HTTPError:
    metrics.SPAWNS_REFUSED.labels(reason=f"server_limit_{reason}").inc()
    spawner.log.warning("Refusing spawn of %s (%s servers): %s", spawner._log_name, reason, message)
    return web.HTTPError(429, message)
