"""The Slurm backend's spawner, its part of the reservations (a mixin of
:class:`hub_ext.slurm.spawner.GPUSlurmSpawner`):

- the REST endpoints' seam :meth:`SlurmReservationSpawner.reservation_changed`: a hub
  reservation made, changed or deleted becomes Slurm's ``gpuhub-<id>``
  (:mod:`.reservations`), refused with Slurm's words;
- a GPU job of a group member started during an occurrence carries
  ``--reservation=gpuhub-<id>`` (the member added to its ``Users`` first, for one who joined
  the group since the last pass); the reservation's ``FLEX`` flag lets the job run on the
  reserved nodes when they have the GPUs free, else anywhere in the partition;
- the hub's pass (:func:`start_reservation_pass`), at the hub's start and every
  ``c.SlurmReservations.interval`` seconds: Slurm's reservations made to match the hub's;
- the hub's enforced reservations (:meth:`SlurmReservationSpawner.enforce_reservations`,
  :mod:`.enforce`): non-members' servers on the reserved nodes warned and stopped at the
  window's start, members' servers there paid by their course; a start whose job runs
  on such a node is told how long it may run (:meth:`SlurmReservationSpawner.tell_next_window`).
"""

from __future__ import annotations

from datetime import timedelta

from traitlets.config import LoggingConfigurable

from ..common.clock import utcnow
from ..common.periodic import ensure_task, every
from ..reservations import store
from ..reservations.backend import BackendRefused, BackendUnavailable, members_of
from ..reservations.enforce import Reservations
from ..reservations.rules import occurrences
from .cluster import parse_gres_request
from .enforce import SlurmHeld, attach_enforcement, device_nodes
from .reservations import SlurmReservations

__all__ = ["SlurmReservationSpawner", "start_reservation_pass"]


def _partition(config) -> str:
    return config.get("GPUSlurmSpawner", {}).get("req_partition", "") or ""


def reservations_of(cls, config) -> SlurmReservations:
    """The runner of ``gpuhub-<id>`` reservations on the hub's cluster."""
    return SlurmReservations(cls.shared_cluster(config), config=config)


class SlurmReservationSpawner(LoggingConfigurable):
    """Reservations made Slurm's own, and the jobs of the group's members in them."""

    _reservation = ""  # the --reservation of the job being submitted, or ""

    @classmethod
    async def reservation_changed(cls, handler, spec, reservation_id: int) -> None:
        """Slurm's ``gpuhub-<id>`` made to match ``spec`` (None: deleted).  Raises
        BackendRefused (Slurm's words) or BackendUnavailable."""
        config = handler.settings["config"]
        members = members_of(handler.db, spec.group) if spec is not None else []
        await reservations_of(cls, config).apply(
            spec, reservation_id, members, _partition(config), utcnow()
        )

    def enforce_reservations(self) -> None:
        """Make the hub's :class:`~hub_ext.reservations.enforce.Reservations` read Slurm
        (:mod:`.enforce`) and start its passes (once per process; needs the hub
        database)."""
        db = self.db_session()
        if db is None:
            return
        settings = getattr(self.user, "settings", None) or {}
        attach_enforcement(
            reservations_of(type(self), self.config), self.config, db, settings.get("users")
        )

    def tell_next_window(self) -> None:
        """Tell the member, on the progress page, how long the server may run when its
        job's GPUs (``gpu_devices``) are on the nodes of a reservation of a group they are
        not in that starts within 12 h and before the profile's ``cull_max_age`` ends it
        (:meth:`Reservations.next_stop`, in the Docker backend's words).  Slurm keeps a job
        without a time limit off a node reserved later, so this is a job that was placed
        before the reservation was made or moved onto its node."""
        if not Reservations.initialized():
            return
        rules = Reservations.instance()
        nodes = set(device_nodes(self.gpu_devices))
        if not nodes or not isinstance(rules.backend, SlurmHeld):
            return
        held, now = rules.backend, rules.now()
        ends = now + timedelta(seconds=self.cull_max_age) if self.cull_max_age else None
        window = rules.next_stop(
            self.user.name,
            "gpu",
            lambda w: bool(held.nodes_of(w) & nodes) and (ends is None or w.start < ends),
        )
        if window is not None:
            self.log.info(
                "%s runs on %s, reserved for %s from %s",
                self._log_name,
                ",".join(sorted(nodes)),
                window.group,
                window.start.isoformat(),
            )
            self.emit(90, rules.start_notice(window))

    def open_reservations(self) -> list[tuple[int, str]]:
        """(id, group) of the hub reservations of this member's groups with an occurrence
        now."""
        db = self.db_session()
        if db is None:
            return []
        groups = {g.name for g in self.user.groups}
        now = utcnow()
        found = []
        for row in store.load(db, groups) if groups else []:
            spec = store.to_spec(row)
            if any(o.start <= now for o in occurrences(spec, since=now, until=now)):
                found.append((row.id, row.group))
        return found

    def group_of(self, reservation_id: int) -> str | None:
        """The group of hub reservation ``reservation_id`` (None when gone)."""
        db = self.db_session()
        row = store.get(db, reservation_id) if db is not None else None
        return row.group if row is not None else None

    async def choose_reservation(self) -> None:
        """For a GPU job during an occurrence of the member's group: the member made one
        of Slurm's reservation's users, and the job will carry ``--reservation``.  When
        Slurm refuses or does not answer, the job goes without it (logged)."""
        self._reservation = ""
        if not parse_gres_request(self.req_gres)[1]:
            return
        for reservation_id, group in self.open_reservations():
            runner = reservations_of(type(self), self.config)
            spec = store.to_spec(store.get(self.db_session(), reservation_id))
            try:
                await runner.apply(
                    spec,
                    reservation_id,
                    members_of(self.db_session(), group),
                    self.req_partition,
                    utcnow(),
                )
            except (BackendRefused, BackendUnavailable) as e:
                self.log.warning(
                    "%s starts without reservation %s: %s",
                    self._log_name,
                    runner.name(reservation_id),
                    e,
                )
                continue
            self._reservation = runner.name(reservation_id)
            self.log.info(
                "%s starts in Slurm reservation %s (group %s)",
                self._log_name,
                self._reservation,
                group,
            )
            self.emit(12, f"Using the GPUs reserved for {group}")
            return


def start_reservation_pass(app, spawner_class) -> None:
    """Make the JupyterHub application ``app`` run the reservations' pass (Slurm's
    ``gpuhub-<id>`` made to match the hub's) when it starts and every
    ``c.SlurmReservations.interval`` seconds after; ``app.start`` is wrapped, as
    :func:`hub_ext.credits.unsettled.settle_at_start` does.  Wrapping twice is a no-op."""
    start = app.start
    if getattr(start, "reconciles_reservations", False):
        return
    state = {"task": None}

    async def one_pass() -> None:
        runner = reservations_of(spawner_class, app.config)
        specs = [(store.to_spec(row), members_of(app.db, row.group)) for row in store.load(app.db)]
        app.db.commit()  # end the read's transaction
        try:
            await runner.reconcile(specs, _partition(app.config), utcnow())
        except BackendUnavailable as e:
            app.log.warning("Slurm's reservations not checked this pass: %s", e)

    async def start_and_reconcile():
        interval = float(
            app.config.get("SlurmReservations", {}).get(
                "interval", SlurmReservations.interval.default_value
            )
        )
        state["task"] = ensure_task(
            state["task"],
            lambda: every(
                lambda: interval, one_pass, app.log, "Slurm reservations pass", first_now=True
            ),
        )
        await start()

    start_and_reconcile.reconciles_reservations = True
    app.start = start_and_reconcile
