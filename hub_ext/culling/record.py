"""The record of why every server stopped: its run closed, a cull counted and told.

:class:`StopRecord` is a part of :class:`hub_ext.culling.culler.Culler` (a mixin; the culler
holds ``_watched``, ``_recent``, ``name``, ``service_name``, ``now()`` and ``log``): it opens
and closes each server's run record (:mod:`hub_ext.common.runs`, in the hub database), counts
a cull in ``gpuhub_culls_total{reason}`` (``/hub/metrics``), posts the member's notice on the
home page (:mod:`hub_ext.common.notices`, topic ``culling``: a cull, or a server stopped past
its memory limit), and attributes to the idle culler service the stops it made
(:meth:`StopRecord.service_stopped`, from :func:`hub_ext.culling.culler.log_request`).
"""

from __future__ import annotations

from datetime import timedelta

from ..common import metrics, runs
from ..common.notices import notices
from ..common.server_key import ServerKey
from .rules import cull_message, duration, out_of_memory_message
from .watched import _credits_run, _idle_seconds, _paying_course, _Watched, held_devices

__all__ = ["CULL_REASONS", "StopRecord"]

#: Reasons that are culls (``gpuhub_culls_total{reason}``); "stopped" and "gone" are not.
CULL_REASONS = ("idle", "idle_gpu", "max_age")


class StopRecord:
    """The run records and the notices of :class:`hub_ext.culling.culler.Culler`."""

    def _finish(self, watched: _Watched, reason: str, detail: str | None = None) -> None:
        """Close the run (``detail``: the backend's words on why); for a cull also count
        it and tell the member, as for a server the kernel stopped past its memory limit
        (``out_of_memory``: the backend found it so, e.g. Slurm's OUT_OF_MEMORY, Docker's
        OOMKilled)."""
        if watched.run_id is not None and watched.stopped_at is not None:
            self._db_write(
                watched.spawner, runs.close_run, watched.run_id, watched.stopped_at, reason, detail
            )
        if reason in CULL_REASONS:
            self._announce(watched, reason)
        elif reason == "out_of_memory":
            self.log.warning(
                "%s (profile %s) was stopped past its memory limit: %s",
                watched.label,
                watched.profile or "-",
                detail or "-",
            )
            notices().post(
                watched.key.user,
                watched.key.server,
                self.name,
                out_of_memory_message(watched.server, watched.mem_limit),
            )

    def _announce(self, watched: _Watched, reason: str) -> None:
        metrics.CULLS.labels(reason=reason).inc()
        notices().post(
            watched.key.user,
            watched.key.server,
            self.name,
            cull_message(reason, watched.server, watched.cull_seconds, watched.profile),
        )

    def _remember(self, watched: _Watched) -> None:
        """Keep a stopped server a while, for a cull reason that arrives after the stop."""
        horizon = self.now() - timedelta(minutes=10)
        for key in [k for k, w in self._recent.items() if (w.stopped_at or horizon) < horizon]:
            del self._recent[key]
        self._recent[watched.key] = watched

    def service_stopped(self, username: str, server_name: str) -> None:
        """The idle culler service stopped this server: it was a cull for lack of activity.

        Called from :func:`log_request` when the service's ``DELETE`` has been answered:
        before the stop finished (202: :meth:`after_stop` finishes it) or after (204).
        """
        key = ServerKey(username, server_name)
        watched = self._watched.get(key)
        if watched is not None:
            watched.cull, watched.cull_seconds = "idle", _idle_seconds(watched.spawner)
            self.log.warning(
                "Culling %s (profile %s): no activity for %s (stopping, by %s)",
                key,
                watched.profile or "-",
                duration(watched.cull_seconds),
                self.service_name,
            )
            return
        watched = self._recent.pop(key, None)
        if watched is None:
            return
        self.log.warning(
            "Culled %s (profile %s): no activity for %s (stopped by %s)",
            key,
            watched.profile or "-",
            duration(watched.cull_seconds),
            self.service_name,
        )
        if watched.run_id is not None:
            self._db_write(watched.spawner, runs.set_reason, watched.run_id, "idle")
        self._announce(watched, "idle")

    def _open_run(self, watched: _Watched) -> int | None:
        spawner = watched.spawner
        return self._db_write(
            spawner,
            runs.open_run,
            username=watched.key.user,
            server_name=watched.key.server,
            profile=watched.profile,
            groups=[g.name for g in getattr(spawner.user, "groups", [])],
            devices=held_devices(spawner),
            started_at=watched.started_at,
            credits_run=_credits_run(spawner),
            line_wait=getattr(spawner, "line_wait", None),
            job_id=getattr(spawner, "job_id", None) or None,
            course=_paying_course(spawner),
        )

    def _db_write(self, spawner, write, *args, **kwargs):
        db = getattr(spawner, "db", None)
        if db is None:
            return None
        try:
            return write(db, *args, **kwargs)
        except Exception:
            db.rollback()
            self.log.exception("Could not write the run record of %s", spawner._log_name)
            return None
