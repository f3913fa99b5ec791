"""The hub-side culler: idle GPUs, maximum age, and the record of why every server stopped.

Two cullers share the work, each where its information is:

- **jupyterhub-idle-culler**, a hub-managed service (:mod:`hub_ext.culling.hubconfig`), stops
  servers with no activity (browser, kernels, terminals): it reads ``last_activity``
  through the REST API, its scopes limited to that, and applies each profile's
  ``cull_idle_timeout`` through its ``cull_arbiter_hook`` (:mod:`hub_ext.culling.arbiter`).
- **this** :class:`Culler`, in the hub process, sees what the REST API does not: the GPUs.
  Every ``c.Culler.check_interval`` seconds it reads the pool's devices and, per server:

  - a server whose GPUs are busy (any device at or above ``c.Culler.busy_utilization``
    percent) is *active*: its ``last_activity`` is moved to now, so the idle culler never
    stops a server that computes while nobody types;
  - a server whose GPUs have all been idle (0%) for its profile's ``gpu_idle_timeout`` is
    stopped, even with its browser tab open;
  - a server older than its profile's ``cull_max_age`` is stopped, busy or not, after a
    warning on the member's home page ``c.Culler.max_age_warning`` seconds before.

Every cull is logged with who, what and why, counted in ``gpuhub_culls_total{reason}``
(``/hub/metrics``), shown to the member on the home page (:mod:`hub_ext.common.notices`, topic
``culling``) and kept in the run's record (:mod:`hub_ext.common.runs`).  Stops made by the idle
culler service are recognised in the hub's request log hook (:func:`log_request`, the
place where JupyterHub itself counts each request for Prometheus), which sees the service
identity behind each ``DELETE /hub/api/users/<name>/server``.
A server the kernel stopped past its memory limit (stop reason ``out_of_memory``, which
its backend finds: Slurm's job state OUT_OF_MEMORY, Docker's ``State.OOMKilled``) is told
on the home page the same way, topic ``culling``, until the member starts it again.

The Culler is a spawner hook (``c.SpawnerCore.before_container_hooks``): it learns of
each server when it starts, stops or is restored after a hub restart, and keeps the
server's start time and limits in spawner state.  Time comes from ``c.Culler.utcnow`` (the
pattern of jupyterhub-idle-culler), so tests move the clock; ``last_activity`` is
JupyterHub's own field and is always written in JupyterHub's clock.

Devices whose utilization NVML does not report (MIG devices, a lost GPU) never count as
idle: such a server is not culled for GPU idleness, and its maximum age still applies.
The rules themselves are pure functions in :mod:`hub_ext.culling.rules`; what the culler keeps
of each server is :mod:`hub_ext.culling.watched`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.log import log_request as hub_log_request
from jupyterhub.utils import utcnow as hub_utcnow
from traitlets import Callable, Float, Int, Unicode, default
from traitlets.config import SingletonConfigurable

from ..common import metrics, runs
from ..common.clock import utcnow
from ..common.notices import notices
from ..common.periodic import ensure_task, every
from ..common.server_key import ServerKey
from ..common.traits import Positive
from ..spawn.hooks import Hook
from ..spawn.stopping import stop_server
from .rules import (
    GPUActivity,
    Limits,
    assess,
    cull_message,
    duration,
    out_of_memory_message,
    warning_message,
)
from .watched import _credits_run, _idle_seconds, _paying_course, _Watched, held_devices

__all__ = ["CULL_REASONS", "Culler", "log_request", "utcnow"]

#: Reasons that are culls (``gpuhub_culls_total{reason}``); "stopped" and "gone" are not.
CULL_REASONS = ("idle", "idle_gpu", "max_age")


# -- the culler in the hub ---------------------------------------------------------------------


class Culler(Hook, SingletonConfigurable):
    """Stops servers whose GPUs idle or that reached their maximum age; records every stop.

    A spawner hook (see the module docstring): ``before_container``, ``undo``,
    ``after_stop`` and ``restore`` take the spawner, never raise and are idempotent.
    """

    name = "culling"

    check_interval = Positive(
        30.0,
        config=True,
        help="""Seconds between the culler's passes over running servers (GPU utilization,
        maximum age).  A limit is enforced at most this late, and busy GPUs refresh their
        server's last_activity this often.

            c.Culler.check_interval = 30
        """,
    )

    busy_utilization = Int(
        1,
        min=1,
        max=100,
        config=True,
        help="""A GPU at or above this utilization (percent, NVML's last sample) is busy;
        below it, idle.  1 means "anything but 0%".

            c.Culler.busy_utilization = 1
        """,
    )

    max_age_warning = Float(
        900.0,
        min=0.0,
        config=True,
        help="""Seconds before a server's maximum age (cull_max_age) from which its member
        is warned on the hub's home page.

            c.Culler.max_age_warning = 900
        """,
    )

    service_name = Unicode(
        "idle-culler",
        config=True,
        help="""Name of the jupyterhub-idle-culler service: its stops of servers are
        recorded as culls for lack of activity (reason "idle").

            c.Culler.service_name = "idle-culler"
        """,
    )

    utcnow = Callable(
        config=True,
        help="""The clock: a function returning the current time as an aware UTC datetime.
        Tests replace it to move time.

            c.Culler.utcnow = hub_ext.common.clock.utcnow
        """,
    )

    gpu_units = Callable(
        None,
        allow_none=True,
        config=True,
        help="""The backend's GPU readings for the GPU-idle cull and the board's "last
        busy": an async function of the hub's config returning the GPUs with their
        utilization (objects with ``uuid`` and ``utilization_pct``, percent or None).  The
        Docker backend sets it (:func:`hub_ext.docker.pool.gpu_units_of`: NVML on the
        hub's node); None, as on the Slurm backend, whose GPUs are on the cluster's nodes:
        then only the maximum age and the run records apply.

            c.Culler.gpu_units = hub_ext.docker.pool.gpu_units_of()
        """,
    )

    @default("utcnow")
    def _default_utcnow(self):
        return utcnow

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.activity = GPUActivity()
        self._watched: dict[ServerKey, _Watched] = {}
        self._recent: dict[ServerKey, _Watched] = {}  # stopped, reason may still come
        self._task: asyncio.Task | None = None

    def now(self) -> datetime:
        value = self.utcnow()
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    # -- the spawner's hooks ------------------------------------------------------------------

    async def before_container(self, spawner) -> None:
        """A server is starting: record the run and watch it.  Never raises."""
        key = ServerKey(spawner.user.name, spawner.name or "")
        notices().withdraw(key.user, key.server, self.name)
        now = self.now()
        watched = _Watched(
            spawner=spawner,
            key=key,
            profile=getattr(spawner, "profile_slug", "") or "",
            started_at=now,
            limits=Limits.of(spawner),
            watching_since=now,
            last_seen=now,
            mem_limit=getattr(spawner, "mem_limit", None) or None,
        )
        watched.run_id = self._open_run(watched)
        spawner.hook_state[self.name] = watched.to_state()
        self._watched[key] = watched
        self._recent.pop(key, None)
        self.ensure_loop()

    async def undo(self, spawner) -> None:
        """The start failed: it was never a run.  Never raises."""
        watched = self._take(spawner)
        if watched is not None and watched.run_id is not None:
            self._db_write(spawner, runs.discard_run, watched.run_id)

    async def after_stop(self, spawner) -> None:
        """The server stopped: close its run with the reason, tell the member.  Never raises."""
        watched = self._take(spawner)
        if watched is None:
            return
        watched.stopped_at = self.now()
        if watched.cull is None:
            # stopped by someone, or by the hub for another reason (credits ran out);
            # maybe the idle culler's request, whose log line comes after the stop
            watched.cull_seconds = _idle_seconds(spawner)
            notices().withdraw(watched.key.user, watched.key.server, self.name)
            self._finish(
                watched,
                getattr(spawner, "stop_reason", None) or "stopped",
                getattr(spawner, "stop_detail", None),
            )
            self._remember(watched)
        else:
            self._finish(watched, watched.cull)

    def restore(self, spawner) -> None:
        """The hub restarted with this server running: watch it again.  Never raises."""
        state = spawner.hook_state.get(self.name)
        try:
            started_at = datetime.fromisoformat(state["started_at"])
            limits = Limits(**{k: float(v) for k, v in (state.get("limits") or {}).items()})
            run_id = state.get("run")
            mem_limit = int(state.get("mem_limit") or 0) or None
        except (KeyError, TypeError, ValueError) as e:
            self.log.error("Cannot restore the culling of %s: %r", spawner._log_name, e)
            return
        key = ServerKey(spawner.user.name, spawner.name or "")
        now = self.now()
        self._watched[key] = _Watched(
            spawner=spawner,
            key=key,
            profile=state.get("profile", ""),
            started_at=started_at,
            limits=limits,
            watching_since=now,
            last_seen=now,
            run_id=run_id,
            mem_limit=mem_limit,
        )
        self.ensure_loop()

    def _take(self, spawner) -> _Watched | None:
        key = ServerKey(spawner.user.name, spawner.name or "")
        spawner.hook_state.pop(self.name, None)
        watched = self._watched.get(key)
        if watched is None or watched.spawner is not spawner:
            return None
        return self._watched.pop(key)

    # -- for the admin page ---------------------------------------------------------------------

    def server_view(self, key: ServerKey) -> dict | None:
        """What the culler knows of a running server, JSON-ready; None when not watched."""
        watched = self._watched.get(key)
        if watched is None:
            return None
        verdict = watched.last_verdict
        return {
            "started_at": watched.started_at.isoformat(),
            "limits": watched.limits.to_dict(),
            "gpu_idle_for": verdict.gpu_idle_for if verdict else None,
            "stopping": watched.cull,
        }

    # -- the passes over the watched servers ------------------------------------------------

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

    # -- the record of every stop ---------------------------------------------------------

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


def log_request(handler) -> None:
    """``c.JupyterHub.tornado_settings["log_function"]``: JupyterHub's request log, plus the
    attribution of the idle culler service's stops (see the module docstring)."""
    hub_log_request(handler)
    try:
        if handler.request.method != "DELETE" or handler.get_status() not in (202, 204):
            return
        if not isinstance(handler, UserServerAPIHandler) or not Culler.initialized():
            return
        who = handler.current_user
        culler = Culler.instance()
        if getattr(who, "kind", None) != "service" or who.name != culler.service_name:
            return
        args = list(handler.path_args) + [""]
        culler.service_stopped(args[0], args[1])
    except Exception:  # noqa: BLE001 - never break request logging
        handler.log.exception("Could not attribute a server stop to the idle culler")
