"""Reserving a start's GPUs, at once or after a wait in line: a part of the spawner.

:class:`LineSpawner` is mixed into :class:`hub_ext.docker.spawner.GPUDockerSpawner` (as the spawn
page is).  Step 2 of a start (:meth:`LineSpawner.reserve_gpus`):

- GPUs free and nobody waiting for this kind of unit: the pool reserves them at once;
- none free (or members already waiting: nobody overtakes the line), and the member did
  not ask to wait: refused at once (HTTP 409), in plain words, as before the line existed;
- none free and ``user_options["wait"]`` is true: after the same checks as a start (the
  profile is one the member may use; they can pay for it: the hooks' ``before_reserve``,
  asked by ``check_hooks`` before this step; the per-member GPU limit counting their other
  places; one place per profile), the start joins the line
  (:class:`hub_ext.line.Line`) and waits for its turn, holding no GPU and no debit.  The
  progress page shows the place and the estimate, updated live.  When the turn comes the
  pool has reserved the GPUs and the start goes on as any other (debit, container).

JupyterHub wraps ``Spawner.start()`` in ``asyncio.wait_for(..., start_timeout)``, reading
``start_timeout`` before ``start()`` runs (JupyterHub ``User.spawn``).  A start that may
wait gets ``start_timeout`` raised by the line's ``max_wait`` in
:meth:`run_pre_spawn_hook` (the last step before ``start()``); the line ends the wait at
``max_wait`` itself, and the rest of the start runs under the configured
``start_timeout``, counted from the grant.  The readiness wait (``http_timeout``) starts
after ``start()`` returns, so the wait in line never counts against it.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from tornado import web
from traitlets.config import LoggingConfigurable

from ..common import metrics
from ..common.clock import now
from ..common.notices import notices
from ..culling.rules import duration
from ..line import LineLeft, LineRefused
from ..line.resume import ensure_keeper
from ..reservations.enforce import Reservations
from ..reservations.policy import starts_text
from ..spawn.choice import wants_wait
from .pool import AllocationRefused
from .pool_line import attach_line
from .pool_reservations import attach_reservations

#: notices topic of the line's messages on the home page
TOPIC = "line"
#: the pool's refusals a member may wait out in line: none free, or the free ones reserved
#: for a group they are not in (their turn comes when the window ends)
WAITABLE = ("no_gpu_free", "reserved")


class LineSpawner(LoggingConfigurable):
    """Step 2 of a start: the GPUs, at once or after a wait in line."""

    wait_requested = False
    #: ``(count, unit kind)`` this start was admitted with by :meth:`check_gpus_now`,
    #: until its reservation is made or refused (None: no claim)
    gpu_claim = None
    #: True while the spawn gate hands this admitted start to JupyterHub, which may yield
    #: (``refresh_pre_spawn``) before it marks the spawn pending (hub_ext.spawn.gate)
    handing_over = False
    #: seconds this start waited in line (None: it did not): the run record says so
    line_wait = None

    def line(self):
        """The hub's line, attached to the hub database and the pool."""
        line = attach_line(self.pool, self.db_session())
        if self.hub is not None and self.hub.api_url:
            ensure_keeper(line, self.hub.api_url)
        if self.db_session() is not None:
            settings = getattr(self.user, "settings", None) or {}
            attach_reservations(self.pool, line, self.db_session(), settings.get("users"))
        return line

    def run_pre_spawn_hook(self):
        """Give a start that may wait in line the time to wait (see the module doc)."""
        self.start_timeout = self._start_timeout
        options = self.user_options if isinstance(self.user_options, dict) else {}
        if (
            wants_wait(options.get("wait"))
            or "job" in options  # a notebook job waits in line (hub_ext.spawn.choice)
            or "kernel" in options  # a GPU kernel too
            or self.server_key in self.line().places
        ):
            self.start_timeout = int(self._start_timeout + self.line().max_wait + 60)
        return super().run_pre_spawn_hook()

    def check_start_limits(self) -> None:
        """The hub's server limits (:mod:`hub_ext.docker.server_limits`), places in line left
        out of the count; a place started again after a hub restart was admitted before."""
        line = self.line()
        if self.server_key not in line.places:
            self.check_server_limits(list(line.places))

    def timed_rest(self, waited: bool):
        """The configured ``start_timeout`` for the rest of a start that waited in line."""
        if not waited:
            return contextlib.nullcontext()
        return asyncio.timeout(self._start_timeout)

    def _line_refusal(self, ahead: int, what: str):
        return self._refuse_gpus(
            "line",
            f"No GPU free: {ahead} member(s) already wait in line "
            f'for {what}. Choose "Wait for a GPU" to join them, or try '
            "the CPU profile.",
        )

    def check_gpus_now(self, devices, count: int, mig: str | None, what: str) -> None:
        """The GPU refusal :meth:`reserve_gpus` would give at once, from the inventory read
        ``devices``, without reserving or yielding; admitted, the start's units count as
        claimed (``gpu_claim``, ``pool.claims``) until its reservation is made or refused.
        The early refusal of :mod:`hub_ext.spawn.gate` asks it; raises ``HTTPError(409)``.

        Claimed units are those of other starts this check admitted that are still being
        handed to JupyterHub or pending, and hold no GPU and no place in line: a rush of
        starts is refused here, not after JupyterHub's spawn, once the free units are
        spoken for.
        """
        self.gpu_claim = None
        line = self.line()
        key, units = self.server_key, mig or "gpu"
        if key in line.places:
            return  # a place started again after a hub restart
        ahead = self._ahead(line, units)
        if ahead:
            if not self.wait_requested:
                raise self._line_refusal(ahead, what)
            try:
                line.check_one_place(key, self.profile_slug, self.profile_name)
            except LineRefused:
                return  # start() says so (a GPU kernel waits behind her other one)
            refused = self._queue_limit(line, count)
            if refused is not None:
                raise refused
            return  # joins the line
        refused = self.pool.refusal(
            devices, key, count, mig_profile=mig, claimed=self._claimed_units(units, line)
        )
        if refused is None:
            self.gpu_claim = (count, units)
            self.pool.claims[key] = self
        elif refused.reason not in WAITABLE or not self.wait_requested:
            metrics.ALLOCATIONS_REFUSED.labels(reason=refused.reason).inc()  # as take() does
            raise self._refuse_gpus(refused.reason, refused.message)

    def _ahead(self, line, units: str) -> int:
        """Places waiting for ``units`` that this start may not pass: all of them, or, for a
        member of a group whose reservation is open, only the other members' (the group
        goes first: :meth:`hub_ext.line.LineBackend.first`)."""
        if not (
            Reservations.initialized()
            and Reservations.instance().member_first(self.user.name, units)
        ):
            return line.waiting(units)
        return sum(1 for p in line.places.values() if p.units == units and line.backend.first(p))

    def _claimed_units(self, units: str, line) -> int:
        """Units of kind ``units`` claimed by other starts (see :meth:`check_gpus_now`);
        claims that are spent (the start reserved, waits in line or ended) are dropped."""
        claimed = 0
        for key, spawner in list(self.pool.claims.items()):
            claim = spawner.gpu_claim
            starting = spawner.handing_over or spawner.pending == "spawn"
            if not claim or not starting or spawner.allocation is not None or (key in line.places):
                del self.pool.claims[key]
            elif key != self.server_key and claim[1] == units:
                claimed += claim[0]
        return claimed

    def _refuse_gpus(self, reason: str, message: str, status: int = 409):
        metrics.SPAWNS_REFUSED.labels(reason=reason).inc()
        self.log.warning("Refusing spawn of %s (%s): %s", self._log_name, reason, message)
        return web.HTTPError(status, message)

    async def reserve_gpus(self, count: int, mig: str | None, what: str) -> bool:
        """Reserve ``count`` units (``mig``: a MIG slice profile) into
        ``self.allocation``; returns True when the start waited in line.

        Raises ``HTTPError(409)`` (no GPU and no wait asked, a place that ended, the
        per-member limit, one place per profile).
        """
        line = self.line()
        key, units = self.server_key, mig or "gpu"
        requeued = key in line.places  # a spawn started again after a hub restart
        ahead = self._ahead(line, units) - (1 if requeued else 0)
        self.emit(10, f"Reserving {what}")
        if not requeued and not ahead:
            try:
                self.allocation = await self.pool.allocate(
                    key, count, mig_profile=mig, profile=self.profile_slug
                )
                return False
            except AllocationRefused as e:
                if e.reason not in WAITABLE or not self.wait_requested:
                    raise self._refuse_gpus(e.reason, e.message) from e
        elif not requeued and not self.wait_requested:
            raise self._line_refusal(ahead, what)
        try:
            if not requeued:
                line.check_one_place(key, self.profile_slug, self.profile_name)
                await self._check_may_queue(line, count)
            place = await line.join(
                key,
                profile=self.profile_slug,
                profile_name=self.profile_name,
                units=units,
                count=count,
                user_options=dict(self.user_options or {}),
                share_hours=self._share_hours(line),
            )
        except LineRefused as e:
            raise self._refuse_gpus(e.reason, e.message) from e
        notices().withdraw(key.user, key.server, TOPIC)
        try:
            self.allocation = await line.wait_turn(key, self._show_place)
        except LineLeft as e:
            raise self._refuse_gpus(f"line_{e.reason}", e.message) from e
        self.line_wait = max(0.0, now() - place.queued_at)
        self.emit(
            20,
            f"Your turn came after {self.line_wait / 60:.0f} min in line: "
            f"{what} reserved for you alone: {', '.join(self.allocation.uuids)}",
        )
        server = f"your server '{key.server}'" if key.server else "your server"
        notices().post(
            key.user,
            key.server,
            TOPIC,
            f"Your turn in line came: {server} "
            f"({place.profile_name}) started after {self.line_wait / 60:.0f} min.",
        )
        return True

    def tell_next_window(self, mig: str | None) -> None:
        """Tell the member, on the progress page, how long the server may run before a
        reservation of a group they are not in may stop it (within 12 h)."""
        if not Reservations.initialized():
            return
        rules = Reservations.instance()
        window = rules.next_stop(self.user.name, mig or "gpu")
        if window is not None:
            self.emit(25, rules.start_notice(window))

    def goes_first(self, gpus) -> bool:
        """The spawn page's seam: a member of an open window's group passes the line
        (:meth:`Reservations.member_first`), so the card is not held back by it."""
        return Reservations.initialized() and Reservations.instance().member_first(
            self.user.name, gpus.kind if gpus.mig else "gpu"
        )

    def runs_until(self, gpus) -> str:
        """The spawn page's seam: how long a start may run before another group's window
        (:meth:`Reservations.next_stop`), or ``""``."""
        if not Reservations.initialized():
            return ""
        rules = Reservations.instance()
        window = rules.next_stop(self.user.name, gpus.kind if gpus.mig else "gpu")
        if window is None:
            return ""
        left = (window.start - rules.now()).total_seconds()
        return (
            f"{starts_text(window)}: a server started now may run until then (about "
            f"{duration(left)})."
        )

    async def _check_may_queue(self, line, count: int) -> None:
        """The per-member GPU limit, counting the GPUs of the member's places too.  (That
        they can pay was asked before any reservation: ``check_hooks``.)"""
        refused = self._queue_limit(line, count)
        if refused is not None:
            raise refused

    def _queue_limit(self, line, count: int):
        """The refusal (``HTTPError(409)``) of ``count`` more units in line past the
        per-member GPU limit, counting what the member holds (servers, notebook jobs, GPU
        kernels) and waits for; None when within it."""
        limit = self.pool.max_gpus_per_user
        if not limit:
            return None
        held = self.pool.held_by(self.user.name) + line.queued_units(self.user.name)
        if held + count <= limit:
            return None
        return self._refuse_gpus(
            "user_limit",
            f"You already hold or wait for {held} GPU(s) and each "
            f"member may hold {limit}. Leave the line or stop another server first.",
        )

    def _share_hours(self, line) -> float:
        """GPU-hours of this member in the last ``c.Line.fair_share_days`` (0 when off)."""
        if not line.fair_share_days or self.db_session() is None:
            return 0.0
        from ..common import runs
        from ..ops.usage import gpu_seconds

        now = datetime.now(UTC)
        since = now - timedelta(days=line.fair_share_days)
        return (
            sum(
                gpu_seconds(r, since, now)
                for r in runs.runs_overlapping(self.db_session(), since)
                if r.username == self.user.name
            )
            / 3600
        )

    def _show_place(self, place: dict) -> None:
        """A waiting start's place on the progress page (only when it changed)."""
        sentence = place.get("sentence")
        last = self._events[-1]["message"] if self._events else ""
        if sentence and sentence != last:
            self.emit(5, sentence)
