"""The Docker backend's part of the line: a start's GPUs from the pool, at once or after a
wait, and the pool granting freed units to the line's head.

- :class:`PoolGrants` is the :class:`hub_ext.line.LineBackend` of the pool.  The pool calls
  the line back whenever it releases an allocation (:attr:`hub_ext.docker.pool.GPUPool.on_release`),
  in the same step and with no await in between, so the freed GPU is granted to the head of
  the line before any newcomer's spawn can run.  Grants use the pool's last inventory read
  (no NVML call on the event loop); the line's own checks every ``c.Line.update_interval``
  seconds pick up a device that became healthy or free in between.
- :class:`PoolLine` is what the spawner holds for its ``reserve`` step
  (docs/explanation/spawn.md): GPUs free and nobody waiting for this kind of unit, the pool
  reserves them at once; none free (or members already waiting: nobody overtakes the line)
  and no wait asked, refused at once (HTTP 409) in plain words; none free and a wait asked
  (``user_options["wait"]``, or a notebook job), after the checks of a start (the
  per-member GPU limit counting their other places, one place per profile) the start joins
  the line (:class:`hub_ext.line.Line`) and waits for its turn holding no GPU and no debit.
  The progress page shows the place and the estimate, updated live.  It also answers the
  spawn gate's early refusal (:meth:`PoolLine.refusal_now`, with the claims of the starts
  it admitted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tornado import web

from ..common import clock, metrics
from ..common.notices import notices
from ..common.server_key import ServerKey
from ..line import Line, LineBackend, LineLeft, LineRefused, Place, show_changes
from ..line.resume import ensure_keeper
from ..reservations.enforce import Reservations
from .pool import AllocationRefused, GPUPool
from .pool_reservations import attach_reservations

__all__ = ["TOPIC", "WAITABLE", "GPUAsk", "PoolGrants", "PoolLine", "attach_line", "the_line"]

#: notices topic of the line's messages on the home page
TOPIC = "line"
#: the pool's refusals a member may wait out in line: none free, or the free ones reserved
#: for a group they are not in (their turn comes when the window ends)
WAITABLE = ("no_gpu_free", "reserved")


def _mig(units: str) -> str | None:
    return None if units == "gpu" else units


class PoolGrants(LineBackend):
    """Free units, grants and the running servers' expected ends, from the pool."""

    def __init__(self, pool: GPUPool, line: Line, server_limits=None):
        self.pool, self.line = pool, line
        #: ServerKey -> culling limits (dict of seconds) of a running server, or None
        self.server_limits = server_limits or (lambda key: None)
        #: the hub's :class:`hub_ext.reservations.enforce.Reservations`, once attached
        self.reservations = None

    def free_units(self, units: str) -> int:
        return self.pool.free_count(_mig(units))

    def grant(self, place: Place):
        try:
            return self.pool.take(
                self.pool._devices,
                ServerKey(*place.key),
                place.count,
                mig_profile=_mig(place.units),
                profile=place.profile,
            )
        except AllocationRefused as e:
            self.line.log.info("Cannot grant %s yet: %s", place.key, e.reason)
            return None

    def fits(self, place: Place) -> bool:
        """The per-member limit (``GPUPool.max_gpus_per_user``) leaves room for it, and
        the units not reserved for a group the member is not in, now or within the
        reservations' warning time, are enough (:mod:`hub_ext.reservations.enforce`)."""
        if not self._open_to(place):
            return False
        limit = self.pool.max_gpus_per_user
        if not limit:
            return True
        own = self.pool.allocations.get(ServerKey(*place.key))
        held = self.pool.held_by(place.key[0]) - (len(own.uuids) if own else 0)
        return held + place.count <= limit

    def _open_to(self, place: Place) -> bool:
        if self.reservations is None:
            return True
        closed, _ = self.reservations.closed_to(place.key[0], place.units, soon=True)
        return self.free_units(place.units) - closed >= place.count

    def first(self, place: Place) -> bool:
        """A member of a group whose reservation is open goes ahead of the others."""
        return self.reservations is not None and self.reservations.member_first(
            place.key[0], place.units
        )

    def ungrant(self, place: Place, grant) -> None:
        """The start was cancelled before it took its grant: the units go back."""
        if self.pool.allocations.get(ServerKey(*place.key)) is grant:
            self.pool.release(ServerKey(*place.key))

    def frees(self, units: str) -> list[tuple[float, int]]:
        now = clock.now()
        mig = _mig(units)
        kinds = {d.uuid: d.mig_profile for d in self.pool._devices}
        out = []
        for allocation in self.pool.allocations.values():
            if not allocation.uuids or kinds.get(allocation.uuids[0]) != mig:
                continue
            limits = self.server_limits(allocation.owner) or {}
            out.append(
                (self.line.expected_left(now - allocation.since, limits), len(allocation.uuids))
            )
        return out


def attach_line(pool: GPUPool, db) -> Line:
    """The hub's line, attached to ``db`` and granting from ``pool`` (once per process)."""
    line = Line.instance(config=pool.config)
    if not isinstance(line.backend, PoolGrants):
        from ..culling.culler import Culler

        def limits(key):
            if not Culler.initialized():
                return None
            view = Culler.instance().server_view(key) or {}
            return view.get("limits")

        line.backend = PoolGrants(pool, line, limits)
        pool.on_release.append(lambda allocation: line.dispatch())
    line.attach(db)
    return line


def the_line(pool: GPUPool, db, api_url: str = "", users=None) -> Line:
    """The hub's line, attached to the hub database ``db`` and the pool, its keeper started
    (``api_url``: the hub's API) and the reservations reading the pool (``users``:
    JupyterHub's ``UserDict``); ``db`` None outside a hub."""
    line = attach_line(pool, db)
    if api_url:
        ensure_keeper(line, api_url)
    if db is not None:
        attach_reservations(pool, line, db, users)
    return line


@dataclass(frozen=True)
class GPUAsk:
    """A start's request for ``count`` units (``mig``: a MIG slice profile, None for whole
    GPUs) of profile ``profile``; ``wait``: the member asked to wait in line (or the
    workload waits by itself); ``who``: the server, for the log."""

    key: ServerKey
    count: int
    mig: str | None = None
    profile: str = ""
    profile_name: str = ""
    user_options: dict | None = None
    wait: bool = False
    who: str = ""

    @property
    def units(self) -> str:
        return self.mig or "gpu"

    @property
    def what(self) -> str:
        """``"1 GPU"``, ``"2 1g.5gb GPU slices"``: the words of the progress page."""
        unit = f"{self.mig} GPU slice" if self.mig else "GPU"
        return f"{self.count} {unit}{'s' if self.count > 1 else ''}"


class PoolLine:
    """A start's GPUs from ``pool``, at once or after a wait in ``line`` (see the module
    doc); ``log`` is the hub's."""

    def __init__(self, pool: GPUPool, line: Line, log):
        self.pool, self.line, self.log = pool, line, log

    def refuse(self, ask: GPUAsk, reason: str, message: str, status: int = 409):
        metrics.SPAWNS_REFUSED.labels(reason=reason).inc()
        self.log.warning("Refusing spawn of %s (%s): %s", ask.who, reason, message)
        return web.HTTPError(status, message)

    def _line_refusal(self, ask: GPUAsk, ahead: int):
        return self.refuse(
            ask,
            "line",
            f"No GPU free: {ahead} member(s) already wait in line "
            f'for {ask.what}. Choose "Wait for a GPU" to join them, or try '
            "the CPU profile.",
        )

    def ahead(self, user: str, units: str) -> int:
        """Places waiting for ``units`` that a start of ``user`` may not pass: all of them,
        or, for a member of a group whose reservation is open, only the other members'
        (the group goes first: :meth:`hub_ext.line.LineBackend.first`)."""
        if not (Reservations.initialized() and Reservations.instance().member_first(user, units)):
            return self.line.waiting(units)
        return sum(
            1 for p in self.line.places.values() if p.units == units and self.line.backend.first(p)
        )

    def refusal_now(self, ask: GPUAsk, devices, claimed: int) -> bool:
        """The GPU refusal :meth:`take` would give at once, from the inventory read
        ``devices`` (``claimed``: units of this kind claimed by other starts the gate
        admitted), without reserving or yielding.  Returns True when the start may claim
        its units (it would have them now), False when it joins the line or holds a place
        already.  Raises ``HTTPError(409)``."""
        if ask.key in self.line.places:
            return False  # a place started again after a hub restart
        ahead = self.ahead(ask.key.user, ask.units)
        if ahead:
            if not ask.wait:
                raise self._line_refusal(ask, ahead)
            try:
                self.line.check_one_place(ask.key, ask.profile, ask.profile_name)
            except LineRefused:
                return False  # start() says so (a GPU kernel waits behind her other one)
            refused = self.queue_limit(ask)
            if refused is not None:
                raise refused
            return False  # joins the line
        refused = self.pool.refusal(
            devices, ask.key, ask.count, mig_profile=ask.mig, claimed=claimed
        )
        if refused is None:
            return True
        if refused.reason not in WAITABLE or not ask.wait:
            metrics.ALLOCATIONS_REFUSED.labels(reason=refused.reason).inc()  # as take() does
            raise self.refuse(ask, refused.reason, refused.message)
        return False

    async def take(
        self, ask: GPUAsk, show: Callable[[int, str], None], share_hours: float = 0.0
    ) -> tuple[object, float | None]:
        """Reserve ``ask``'s units: returns the allocation and the seconds it waited in
        line (None: it did not).  ``show(progress, message)`` tells the progress page.
        Raises ``HTTPError(409)`` (no GPU and no wait asked, a place that ended, the
        per-member limit, one place per profile)."""
        key, units = ask.key, ask.units
        requeued = key in self.line.places  # a spawn started again after a hub restart
        ahead = self.ahead(key.user, units) - (1 if requeued else 0)
        show(10, f"Reserving {ask.what}")
        if not requeued and not ahead:
            try:
                allocation = await self.pool.allocate(
                    key, ask.count, mig_profile=ask.mig, profile=ask.profile
                )
                return allocation, None
            except AllocationRefused as e:
                if e.reason not in WAITABLE or not ask.wait:
                    raise self.refuse(ask, e.reason, e.message) from e
        elif not requeued and not ask.wait:
            raise self._line_refusal(ask, ahead)
        return await self._wait_in_line(ask, show, share_hours, requeued)

    async def _wait_in_line(
        self, ask: GPUAsk, show, share_hours: float, requeued: bool
    ) -> tuple[object, float]:
        """Join the line (the checks of a place first, unless the place was kept from
        before a restart) and wait for the turn; the place shown as it moves."""
        key = ask.key
        try:
            if not requeued:
                self.line.check_one_place(key, ask.profile, ask.profile_name)
                self._check_may_queue(ask)
            place = await self.line.join(
                key,
                profile=ask.profile,
                profile_name=ask.profile_name,
                units=ask.units,
                count=ask.count,
                user_options=dict(ask.user_options or {}),
                share_hours=share_hours,
            )
        except LineRefused as e:
            raise self.refuse(ask, e.reason, e.message) from e
        notices().withdraw(key.user, key.server, TOPIC)
        try:
            allocation = await self.line.wait_turn(key, show_changes(show, 5))
        except LineLeft as e:
            raise self.refuse(ask, f"line_{e.reason}", e.message) from e
        waited = max(0.0, clock.now() - place.queued_at)
        show(
            20,
            f"Your turn came after {waited / 60:.0f} min in line: "
            f"{ask.what} reserved for you alone: {', '.join(allocation.uuids)}",
        )
        server = f"your server '{key.server}'" if key.server else "your server"
        notices().post(
            key.user,
            key.server,
            TOPIC,
            f"Your turn in line came: {server} "
            f"({place.profile_name}) started after {waited / 60:.0f} min.",
        )
        return allocation, waited

    def _check_may_queue(self, ask: GPUAsk) -> None:
        """The per-member GPU limit, counting the GPUs of the member's places too.  (That
        they can pay was asked before any reservation: the hooks' ``before_reserve``.)"""
        refused = self.queue_limit(ask)
        if refused is not None:
            raise refused

    def queue_limit(self, ask: GPUAsk) -> web.HTTPError | None:
        """The refusal (``HTTPError(409)``) of ``ask``'s units in line past the per-member
        GPU limit, counting what the member holds (servers, notebook jobs, GPU kernels) and
        waits for; None when within it."""
        limit = self.pool.max_gpus_per_user
        if not limit:
            return None
        user = ask.key.user
        held = self.pool.held_by(user) + self.line.queued_units(user)
        if held + ask.count <= limit:
            return None
        return self.refuse(
            ask,
            "user_limit",
            f"You already hold or wait for {held} GPU(s) and each "
            f"member may hold {limit}. Leave the line or stop another server first.",
        )
