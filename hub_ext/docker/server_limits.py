"""The hub's limits on servers starting and running at once, places in line not counted.

JupyterHub's ``concurrent_spawn_limit`` and ``active_server_limit`` (checked in
``BaseHandler.spawn_single_user``, counted by ``UserDict.count_active_users``) count
every pending spawn.  A member waiting in line for a GPU (:mod:`hub_ext.line`) is a
pending spawn that holds nothing: no container, no GPU, no debit.  Counted as JupyterHub
counts, twenty members in line would refuse every other start, the CPU profile's too.

So on the Docker backend the hub leaves JupyterHub's two limits at 0 and the spawner
applies them at the start of ``start()`` (:meth:`ServerLimits.check_server_limits`):
the hub's servers counted as JupyterHub counts them, less the places in line.  A place's
own start, once its turn comes, is not refused: it waited for a GPU that a stopped
server gave back.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tornado import web
from traitlets import Int
from traitlets.config import LoggingConfigurable

from ..common import metrics


class ServerLimits(LoggingConfigurable):
    """Mixed into the spawner: refuses a start over the hub's server limits (HTTP 429)."""

    concurrent_spawn_limit = Int(
        0,
        config=True,
        help="""Servers starting at once on the hub, places in line not counted; 0: no
        limit.  Replaces c.JupyterHub.concurrent_spawn_limit, which counts places in line
        (hub_ext.config sets that one to 0).

            c.GPUDockerSpawner.concurrent_spawn_limit = 20
        """,
    )

    active_server_limit = Int(
        0,
        config=True,
        help="""Servers running or starting at once on the hub, places in line not
        counted; 0: no limit.  Replaces c.JupyterHub.active_server_limit, which counts
        places in line (hub_ext.config sets that one to 0).

            c.GPUDockerSpawner.active_server_limit = 40
        """,
    )

    def other_spawners(self) -> Iterator[tuple[tuple[str, str], object]]:
        """``((user, server), spawner)`` for every other spawner the hub holds (its
        ``UserDict``, ``user.settings["users"]``); none outside a hub."""
        users = (getattr(self.user, "settings", None) or {}).get("users")
        for user in list((users or {}).values()):
            for name, spawner in list(user.spawners.items()):
                if spawner is not self:
                    yield (user.name, name or ""), spawner

    def check_server_limits(self, waiting: Iterable[tuple[str, str]]) -> None:
        """Refuse this start when the hub is at one of its limits.

        ``waiting``: the ``(user, server)`` keys of the places in line, left out of the
        count.  Counts every other server JupyterHub knows (``user.settings["users"]``,
        the hub's ``UserDict``) as ``count_active_users`` does: starting is a pending
        spawn, active is pending or ready.  Raises ``HTTPError(429)`` with a sentence.
        """
        if not (self.concurrent_spawn_limit or self.active_server_limit):
            return
        skip = set(waiting)
        starting = active = 0
        for key, spawner in self.other_spawners():
            if key in skip:
                continue
            # a start the spawn gate admitted counts before JupyterHub marks it pending
            handed = getattr(spawner, "handing_over", False)
            starting += spawner.pending == "spawn" or handed
            active += spawner.active or handed
        if self.concurrent_spawn_limit and starting >= self.concurrent_spawn_limit:
            raise self._over_limit(
                "starting",
                f"{starting} servers are starting right now, as many as the hub "
                "starts at once. Try again in a minute.",
            )
        if self.active_server_limit and active >= self.active_server_limit:
            raise self._over_limit(
                "active",
                f"The hub already runs {active} servers, as many as it can hold. "
                "Try again later, when someone has stopped theirs, or ask an admin.",
            )

    def _over_limit(self, reason: str, message: str) -> web.HTTPError:
        metrics.SPAWNS_REFUSED.labels(reason=f"server_limit_{reason}").inc()
        self.log.warning("Refusing spawn of %s (%s servers): %s", self._log_name, reason, message)
        return web.HTTPError(429, message)
