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
The rules themselves are pure functions in :mod:`hub_ext.culling.rules`.  The Culler's parts:
its pass over the servers (:mod:`hub_ext.culling.passes`), the record of every stop
(:mod:`hub_ext.culling.record`) and what it keeps of each server (:mod:`hub_ext.culling.watched`).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from jupyterhub.apihandlers.users import UserServerAPIHandler
from jupyterhub.log import log_request as hub_log_request
from traitlets import Callable, Float, Int, Unicode, default, validate
from traitlets.config import SingletonConfigurable

from ..common import runs
from ..common.clock import utcnow
from ..common.notices import notices
from ..common.server_key import ServerKey
from ..spawn.hooks import Hook
from .passes import CullingPasses
from .record import StopRecord
from .rules import GPUActivity, Limits
from .watched import _idle_seconds, _Watched

__all__ = ["Culler", "log_request", "utcnow"]


# -- the culler in the hub ---------------------------------------------------------------------


class Culler(CullingPasses, StopRecord, Hook, SingletonConfigurable):
    """Stops servers whose GPUs idle or that reached their maximum age; records every stop.

    A spawner hook (see the module docstring): ``before_container``, ``undo``,
    ``after_stop`` and ``restore`` take the spawner, never raise and are idempotent.
    """

    name = "culling"

    check_interval = Float(
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
        config=True,
        help="""A GPU at or above this utilization (percent, NVML's last sample) is busy;
        below it, idle.  1 means "anything but 0%".

            c.Culler.busy_utilization = 1
        """,
    )

    max_age_warning = Float(
        900.0,
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

    @validate("check_interval")
    def _validate_interval(self, proposal):
        if proposal["value"] <= 0:
            raise ValueError(
                "c.Culler.check_interval must be a positive number of seconds, "
                f"got {proposal['value']!r}"
            )
        return proposal["value"]

    @validate("max_age_warning")
    def _validate_warning(self, proposal):
        if proposal["value"] < 0:
            raise ValueError(
                f"c.Culler.max_age_warning must not be negative, got {proposal['value']!r}"
            )
        return proposal["value"]

    @validate("busy_utilization")
    def _validate_busy(self, proposal):
        if not 1 <= proposal["value"] <= 100:
            raise ValueError(
                "c.Culler.busy_utilization is a percentage from 1 to 100, "
                f"got {proposal['value']!r}"
            )
        return proposal["value"]

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
