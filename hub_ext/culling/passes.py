"""The culler's pass: every ``c.Culler.check_interval`` seconds, each watched server checked.

:class:`CullingPasses` is a part of :class:`hub_ext.culling.culler.Culler` (a mixin; the
culler holds the traits, ``_watched``, ``activity``, ``now()``, ``log`` and the record's
``_finish``).  A pass reads the GPUs once (``c.Culler.gpu_units``: utilization in percent,
NVML's last sample), then for each server asks the rules (:func:`hub_ext.culling.rules.assess`)
and acts on the verdict: busy GPUs move JupyterHub's ``last_activity`` to now, a server past
its limit is stopped (:func:`hub_ext.spawn.stopping.stop_server`), a server near its maximum
age gets a warning on its member's home page, a server gone without a stop has its run closed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from jupyterhub.utils import utcnow as hub_utcnow

from ..common.notices import notices
from ..common.periodic import ensure_task, every
from ..spawn.stopping import stop_server
from .rules import assess, duration, warning_message
from .watched import _Watched, held_devices

__all__ = ["CullingPasses"]


class CullingPasses:
    """The passes of :class:`hub_ext.culling.culler.Culler` over its watched servers."""

    def ensure_loop(self) -> None:
        """Start the passes once per hub process (needs a running event loop)."""
        self._task = ensure_task(
            self._task,
            lambda: every(lambda: self.check_interval, self.cull_once, self.log, "Culling pass"),
        )

    async def cull_once(self) -> None:
        """One pass over every watched server: activity, warnings, culls, vanished servers."""
        now = self.now()
        units = []
        if self.gpu_units is not None:
            try:
                units = list(await self.gpu_units(self.config))
            except Exception as e:  # noqa: BLE001 - the pass goes on without readings
                self.log.warning("Culling without GPU readings this pass: %s", e)
        self.activity.observe(units, now, self.busy_utilization)
        utilization = {u.uuid: u.utilization_pct for u in units}
        for watched in list(self._watched.values()):
            try:
                await self._check(watched, now, utilization)
            except Exception:
                self.log.exception("Culling check of %s failed", watched.label)

    async def _check(
        self, watched: _Watched, now: datetime, utilization: Mapping[str, int | None]
    ) -> None:
        spawner = watched.spawner
        if not self._running(watched):
            # cleared without stop() (its container was found dead): close at last sight
            if self._watched.get(watched.key) is watched:
                del self._watched[watched.key]
            watched.stopped_at = watched.last_seen
            self.log.warning(
                "%s is gone without a stop; its run ends at %s",
                watched.label,
                watched.last_seen.isoformat(),
            )
            self._finish(watched, "gone")
            return
        if getattr(spawner, "pending", None) or watched.stopping:
            return
        watched.last_seen = now
        devices = tuple(held_devices(spawner)) if self.gpu_units is not None else ()
        verdict = assess(
            now=now,
            started_at=watched.started_at,
            watching_since=watched.watching_since,
            limits=watched.limits,
            devices=devices,
            utilization=utilization,
            last_busy=self.activity.last_busy,
            busy_utilization=self.busy_utilization,
            warning=self.max_age_warning,
        )
        watched.last_verdict = verdict
        if verdict.busy:
            self._keep_active(spawner)
        if verdict.cull is not None:
            seconds = verdict.age if verdict.cull == "max_age" else verdict.gpu_idle_for
            await self._cull(watched, verdict.cull, seconds, devices)
        elif verdict.stop_in is not None:
            notices().post(
                watched.key.user,
                watched.key.server,
                self.name,
                warning_message(
                    watched.server, verdict.stop_in, watched.limits.max_age, watched.profile
                ),
            )

    def _running(self, watched: _Watched) -> bool:
        """The spawner still runs this server (or is busy with it) and its state names it."""
        spawner = watched.spawner
        if getattr(spawner, "server", None) is None and not getattr(spawner, "pending", None):
            return False
        state = getattr(spawner, "hook_state", {}).get(self.name)
        return isinstance(state, dict) and state.get("started_at") == (
            watched.started_at.isoformat()
        )

    def _keep_active(self, spawner) -> None:
        """Move the server's (and its user's) last_activity to now, in JupyterHub's clock,
        as the proxy's activity poll would (JupyterHub ``update_last_activity``)."""
        now = hub_utcnow(with_tz=False)
        orm_spawner = getattr(spawner, "orm_spawner", None)
        if orm_spawner is None:
            return
        try:
            if orm_spawner.last_activity is None or orm_spawner.last_activity < now:
                orm_spawner.last_activity = now
            orm_user = getattr(spawner.user, "orm_user", None)
            if orm_user is not None and (
                orm_user.last_activity is None or orm_user.last_activity < now
            ):
                orm_user.last_activity = now
            spawner.db.commit()
        except Exception:
            self.log.exception("Could not record the GPU activity of %s", spawner._log_name)

    async def _cull(
        self, watched: _Watched, reason: str, seconds: float, devices: Sequence[str]
    ) -> None:
        watched.cull, watched.cull_seconds, watched.stopping = reason, seconds, True
        limit = watched.limits.max_age if reason == "max_age" else watched.limits.gpu_idle_timeout
        what = "ran for" if reason == "max_age" else "GPU(s) idle for"
        self.log.warning(
            "Culling %s (profile %s, GPU(s) %s): %s %s, limit %s (%s)",
            watched.label,
            watched.profile or "-",
            ",".join(devices) or "none",
            what,
            duration(seconds),
            duration(limit),
            reason,
        )
        try:
            await stop_server(watched.spawner, reason)
        except Exception:
            watched.cull, watched.stopping = None, False
            self.log.exception("Could not cull %s (%s)", watched.label, reason)
            return
        if self._watched.get(watched.key) is watched:
            # stopped without Spawner.stop() (its container had died): finish here
            del self._watched[watched.key]
            watched.stopped_at = self.now()
            self._finish(watched, reason)
