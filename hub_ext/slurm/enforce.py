"""The Slurm backend's part of the enforced reservations: the hub's servers on the nodes
Slurm reserved, for :class:`hub_ext.reservations.enforce.Reservations` (the warning, the
stop at the window's start, the course budget: :mod:`hub_ext.reservations.budget`).

Slurm's ``gpuhub-<id>`` reservation (:mod:`.reservations`) is made with ``IGNORE_JOBS``:
a job already running on its nodes when its window starts keeps running, whoever owns it.
The hub stops its own servers of non-members there, as on the Docker backend, with the
same rules (:func:`hub_ext.reservations.policy.to_stop`), read against what Slurm holds:

- a window holds the GPUs of its Slurm reservation's nodes (:meth:`SlurmHeld.held`; whole
  nodes, so a reservation of 1 GPU on nodes of 2 holds 2, as the cards say);
- the servers holding units are the hub's running jobs, counted by their GPUs on the nodes
  of the Slurm reservations of the windows open now or starting within the warning time
  (a job elsewhere is neither stopped nor paid for by a course);
- the free units are the free GPUs on those nodes (Slurm's own ``sinfo``).

So at a window's start every non-member's server with a GPU on its nodes is stopped (with
reason ``reservation`` and the pro rata refund), and a member's server there (with or
without ``--reservation``) counts inside the window: its course pays
(:class:`hub_ext.reservations.budget.CourseBudget`).  The GPUs of windows on different
nodes are counted together per kind, as the Docker pool's are.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from ..reservations.enforce import ReservationBackend, Reservations
from ..reservations.policy import Window
from .cluster import JobGPUs, Node
from .reservations import SlurmReservation, SlurmReservations

__all__ = ["SlurmHeld", "attach_enforcement", "job_since"]


def job_since(job: JobGPUs | None) -> float:
    """A running job's StartTime (read with ``TZ=UTC``) in seconds since the epoch; now
    when Slurm did not say."""
    try:
        return datetime.fromisoformat(job.start).replace(tzinfo=UTC).timestamp()
    except (AttributeError, TypeError, ValueError):
        return time.time()


def device_nodes(devices: list[str]) -> dict[str, int]:
    """The spawner's ``gpu_devices`` (``<node>/gpu<index>``) -> GPUs per node."""
    found: dict[str, int] = {}
    for device in devices:
        node = device.rpartition("/gpu")[0]
        if node:
            found[node] = found.get(node, 0) + 1
    return found


class SlurmHeld(ReservationBackend):
    """What the enforcement asks, read from Slurm (``scontrol show reservation``,
    ``sinfo``, ``scontrol -d show job``) and from the hub's spawners (``users``, JupyterHub's
    UserDict; their ``job_id`` and, for a job that just started, ``gpu_devices``)."""

    def __init__(self, runner: SlurmReservations, rules: Reservations):
        self.runner, self.rules = runner, rules
        self.reserved: dict[str, SlurmReservation] = {}
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[str, JobGPUs] = {}

    async def read(self) -> None:
        """Slurm's ``gpuhub-<id>`` reservations; when there is one, the nodes and the
        jobs too.  Raises SlurmUnavailable or BackendUnavailable (the pass is skipped)."""
        self.reserved = await self.runner.read()
        if not self.reserved:
            self.nodes, self.jobs = {}, {}
            return
        cluster = self.runner.cluster
        self.nodes = {n.name: n for n in await cluster.nodes(fresh=True)}
        self.jobs = {j.job_id: j for j in await cluster.job_gpus() if j.state == "RUNNING"}

    def held(self, window: Window) -> int:
        """The GPUs of the nodes of ``window``'s Slurm reservation (at least the window's
        own count: a reservation Slurm does not have holds what the hub asked)."""
        r = self.reserved.get(self.runner.name(window.reservation or 0))
        gpus = sum(sum(self.nodes[n].gpus.values()) for n in r.nodes if n in self.nodes) if r else 0
        return max(window.gpus, gpus)

    def nodes_of(self, window: Window) -> set[str]:
        """The nodes of ``window``'s Slurm reservation, as the last pass read them."""
        r = self.reserved.get(self.runner.name(window.reservation or 0))
        return set(r.nodes) if r else set()

    def _watched(self) -> set[str]:
        """The nodes of the Slurm reservations of the windows open now or soon."""
        names = {self.runner.name(w.reservation or 0) for w in self.rules.open + self.rules.soon}
        return {n for name in names if name in self.reserved for n in self.reserved[name].nodes}

    def holdings(self) -> list[tuple]:
        watched = self._watched()
        if not watched or self.rules.users is None:
            return []
        found = []
        for user in list(self.rules.users.values()):
            for name, spawner in list(user.spawners.items()):
                job_id = getattr(spawner, "job_id", "")
                if not job_id or not spawner.active:
                    continue
                job = self.jobs.get(job_id)
                if getattr(spawner, "gpu_devices", None):  # fresh: a start reads it
                    per_node = device_nodes(spawner.gpu_devices)
                elif job is not None:
                    per_node = {node: len(i) for node, i in job.gpus.items()}
                else:
                    continue
                count = sum(n for node, n in per_node.items() if node in watched)
                if count:
                    found.append(((user.name, name or ""), "gpu", count, job_since(job)))
        return found

    def free_units(self, units: str) -> int:
        if units != "gpu":
            return 0
        return sum(self.nodes[n].free() for n in self._watched() if n in self.nodes)


def attach_enforcement(runner: SlurmReservations, config, db, users) -> Reservations:
    """The hub's ``Reservations`` reading Slurm through ``runner`` (once per process);
    its passes start on the first call with a running event loop."""
    rules = Reservations.instance(config=config)
    if rules.backend is None:
        rules.backend = SlurmHeld(runner, rules)
    rules.attach(rules.backend, db, users)
    return rules
