"""The Slurm backend's answers to the spawn page (:mod:`hub_ext.spawn.page`): free GPUs per
profile from ``sinfo`` (its partition and GRES type), and what an image holds from the
labels saved beside its unpacked filesystem; and which GPUs a member's servers hold
(:mod:`hub_ext.ops.my_gpus`).

A mixin of :class:`hub_ext.slurm.spawner.GPUSlurmSpawner`.  The node list is read through
the hub's one :class:`~hub_ext.slurm.cluster.SlurmCluster` per environment, in a
subprocess (never on the event loop) and cached ``cache_seconds`` (5 s), so a page that
polls every 5 s costs one ``sinfo`` per period however many members look.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..reservations.backend import BackendRefused, BackendUnavailable
from ..spawn.page import GPUsNow, SpawnPage, facts_from_labels
from .cluster import MEMBER_PREFIX, Node, SlurmCluster, SlurmUnavailable, parse_gres_request
from .reservations import SlurmReservation, SlurmReservations, closed_gpus, until_text
from .submit import DEFAULT_SSH, SubmitHost

#: File beside an unpacked image's ``rootfs`` with the image's labels (a JSON object),
#: written by ``scripts/slurm-cluster.sh image``.
LABELS_FILE = "labels.json"


@dataclass(frozen=True)
class NodesSnapshot:
    """The nodes as ``sinfo`` reported them for one page; ``error`` when Slurm did not
    answer (``nodes`` is then empty)."""

    nodes: list[Node]
    default_partition: str = ""
    error: str = ""
    #: Slurm's ``gpuhub-<id>`` reservations
    reservations: list[SlurmReservation] = field(default_factory=list)


def gres_of(overrides: dict, configured: dict) -> str:
    """A profile's GRES request: its ``req_gres``, or ``gpu:<gpus>`` from its ``gpus``
    (the Docker backend's name for the count), as the spawner submits it."""
    gres = overrides.get("req_gres", configured.get("req_gres", ""))
    gpus = overrides.get("gpus", configured.get("gpus", 0))
    return gres or (f"gpu:{gpus}" if gpus else "")


def gpus_in(nodes: list[Node], partition: str, kind: str, count: int) -> GPUsNow:
    """GPUs of ``kind`` ("" for any) on ``partition``'s nodes that take jobs: free and in
    all, and the refusal when no single node has ``count`` free (a job's GPUs are on one
    node)."""
    mine = [n for n in nodes if partition in n.partitions]
    up = [n for n in mine if n.available]

    def configured(n: Node) -> int:
        return n.gpus.get(kind, 0) if kind else sum(n.gpus.values())

    total = sum(configured(n) for n in up)
    free = sum(n.free(kind) for n in up)
    what = f"{kind} GPUs" if kind else "GPUs"
    refusal = ""
    if count and not any(n.free(kind) >= count for n in up):
        if not any(configured(n) >= count for n in up):
            refusal = (
                f"No GPU free: no node of the cluster's {partition} partition that "
                f"takes jobs now has {count} {what}. Try another profile or ask an "
                "admin."
            )
        elif free == 0:
            refusal = (
                f"No GPU free: all {total} {what} are in use. You can wait in line "
                "for one, try the CPU profile or come back later."
            )
        else:
            refusal = (
                f"No GPU free for this profile: it needs {count} {what} on one node "
                f"and only {free} of {total} are free. You can wait in line, try a "
                "smaller profile or come back later."
            )
    can_wait = any(configured(n) >= count for n in up)
    return GPUsNow(
        count=count, kind=kind, free=free, total=total, refusal=refusal, can_wait=can_wait
    )


class SlurmAvailability(SpawnPage):
    """Free GPUs and image facts for the spawn page, from Slurm and the image folder."""

    async def gpu_snapshot(self) -> NodesSnapshot:
        """The nodes now (cached a few seconds); never raises."""
        try:
            nodes = await self.cluster.nodes(timeout=self.scheduler_timeout)
        except SlurmUnavailable as e:
            self.log.warning("%s for the spawn page: %s", e.what, e)
            return NodesSnapshot([], error=e.member_message)
        return NodesSnapshot(
            nodes, self.cluster.default_partition, reservations=await self.slurm_reservations()
        )

    async def slurm_reservations(self) -> list[SlurmReservation]:
        """Slurm's ``gpuhub-<id>`` reservations now; [] (logged) when they cannot be read."""
        try:
            return list((await SlurmReservations(self.cluster, config=self.config).read()).values())
        except (BackendRefused, BackendUnavailable) as e:
            self.log.warning("No Slurm reservations for %s: %s", self._log_name, e)
            return []

    def open_to_me(self, reservation: SlurmReservation) -> bool:
        """Whether this member may use ``reservation``: one of its users, or of its
        group in the hub (joined since the last pass)."""
        return self.user.name in reservation.users or self.group_of(reservation.reservation_id) in {
            g.name for g in self.user.groups
        }

    def as_member_sees(
        self, nodes: list[Node], reservations, kind: str, count: int, partition: str
    ) -> GPUsNow:
        """:func:`gpus_in` with the GPUs reserved for a group the member is not in taken,
        and the reason in words in the refusal ("No GPU free for you: 2 GPUs reserved
        for ml101 until 16:00 UTC, and the others are in use. ...")."""
        seen, closing = closed_gpus(nodes, reservations, self.open_to_me, kind)
        gpus = gpus_in(seen, partition, kind, count)
        if closing is not None and gpus.refusal:
            group = self.group_of(closing.reservation_id) or "a group"
            reserved = until_text(closing, group, nodes)
            gpus = replace(
                gpus,
                refusal=(
                    f"No GPU free for you: {reserved}, and the others are in use. You can "
                    "wait in line for one, try the CPU profile or come back later."
                    if gpus.can_wait
                    else f"{reserved}. {gpus.refusal}"
                ),
            )
        return gpus

    def gpus_now(self, snapshot: NodesSnapshot, overrides: dict) -> GPUsNow:
        """The profile's GPUs on its partition (``req_partition``, or Slurm's default
        partition) and of its GRES type; when Slurm does not answer, the card says so."""
        kind, count = parse_gres_request(gres_of(overrides, self._configured))
        if snapshot.error:
            return GPUsNow(count=count, kind=kind, refusal=snapshot.error if count else "")
        partition = (
            overrides.get("req_partition", self._configured.get("req_partition"))
            or snapshot.default_partition
        )
        return self.as_member_sees(snapshot.nodes, snapshot.reservations, kind, count, partition)

    def limits_of(self, overrides: dict) -> tuple:
        """What the job asks Slurm for: ``req_memory`` (Slurm's ``--mem``, megabytes
        unless it has a K/M/G/T suffix) and ``req_nprocs`` (``--cpus-per-task``), from
        JupyterHub's ``mem_limit``/``cpu_limit`` where those are not set
        (:func:`hub_ext.slurm.batch.slurm_request`)."""
        from .batch import slurm_request

        def value(name):
            return overrides.get(name, self._configured.get(name))

        try:
            memory, cpus = slurm_request(
                value("req_memory"), value("req_nprocs"), value("mem_limit"), value("cpu_limit")
            )
        except ValueError:  # a bad size: the start itself refuses it
            memory, cpus = str(value("req_memory") or ""), str(value("req_nprocs") or "")
        return (
            memory + "M" if memory.isdigit() else memory or None,
            int(cpus) if cpus.isdigit() else None,
        )

    @classmethod
    async def availability(cls, config, log) -> dict:
        """Counts over every GPU of the cluster, for ``/hub/api/gpuhub/availability``:
        free (on nodes that take jobs), allocated to jobs, and on nodes down or drained
        (``unhealthy``)."""
        try:
            nodes = await cls.shared_cluster(config).nodes()
        except SlurmUnavailable as e:
            log.warning("%s for the availability endpoint: %s", e.what, e)
            return {
                "inventory": "slurm",
                "total": 0,
                "free": 0,
                "allocated": 0,
                "outside": 0,
                "unhealthy": 0,
                "error": e.member_message,
            }
        return {
            "inventory": "slurm",
            "total": sum(sum(n.gpus.values()) for n in nodes),
            "free": sum(n.free() for n in nodes),
            "allocated": sum(sum(n.gpus_used.values()) for n in nodes if n.available),
            "outside": 0,
            "unhealthy": sum(sum(n.gpus.values()) for n in nodes if not n.available),
            "error": "",
        }

    @classmethod
    def shared_cluster(cls, config) -> SlurmCluster:
        """The hub's cluster object for ``c.<class>.slurm_env``, ``submit_host``,
        ``submit_ssh_command`` and ``exec_prefix`` (the spawners' one: shared node
        cache)."""
        section = config.get(cls.__name__, {})
        submit = SubmitHost(
            section.get("submit_host", ""), tuple(section.get("submit_ssh_command", DEFAULT_SSH))
        )
        return SlurmCluster.shared(
            dict(section.get("slurm_env", {}) or {}),
            submit,
            section.get("exec_prefix", MEMBER_PREFIX),
        )

    @classmethod
    async def gpu_board(cls, handler) -> dict:
        """The GPU board's rows for the cluster (:mod:`hub_ext.slurm.board`)."""
        from .board import board_model

        return await board_model(handler, cls.shared_cluster(handler.settings["config"]))

    #: job id -> {node: GPU indexes} of a running job: they do not change while it runs,
    #: so a status bar that polls asks ``scontrol`` once per job, not once per poll
    _job_gpus: dict[str, dict[str, list[int]]] = {}

    @classmethod
    async def held_gpus(cls, handler, user, servers: list[str]) -> list[dict]:
        """The GPUs of the running Slurm jobs of ``user``'s ``servers`` (``scontrol -d
        show job``, once per job; GRES types from the cached ``sinfo``), as
        ``<node>/gpu<index>`` like the GPU board.  The hub does not run on the nodes, so
        utilisation and memory are None; with Slurm not answering, no rows (logged)."""
        from .board import gpu_names

        jobs = {}
        for name in servers:
            spawner = user.spawners.get(name)  # .get: never makes a spawner
            if spawner is not None and spawner.job_id and spawner.active:
                jobs[str(spawner.job_id)] = name
        if not jobs:
            return []
        cluster = cls.shared_cluster(handler.settings["config"])
        try:
            for job_id in set(jobs) - set(cls._job_gpus):
                for job in await cluster.job_gpus(job_id):
                    if job.job_id == job_id and job.state == "RUNNING" and job.gpus:
                        cls._job_gpus[job_id] = job.gpus
            types = {node.name: gpu_names(node) for node in await cluster.nodes()}
        except SlurmUnavailable as e:
            handler.log.warning("%s for %s's GPUs: %s", e.what, user.name, e)
            return []
        rows = []
        for job_id, server in jobs.items():
            for node, indexes in sorted(cls._job_gpus.get(job_id, {}).items()):
                for index in indexes:
                    kinds = types.get(node, [])
                    kind = kinds[index] if index < len(kinds) else ""
                    rows.append(
                        {
                            "uuid": f"{node}/gpu{index}",
                            "name": f"{node} GPU {index}" + (f" ({kind})" if kind else ""),
                            "held_by": server,
                            "utilization_pct": None,
                            "memory_used_mib": None,
                            "memory_total_mib": None,
                            "simulated": False,
                        }
                    )
        if len(cls._job_gpus) > 4096:  # ended jobs: forget the oldest half
            for job_id in list(cls._job_gpus)[:2048]:
                cls._job_gpus.pop(job_id, None)
        return rows

    async def image_facts(self, image: str) -> dict:
        """What an image holds, from ``labels.json`` beside its unpacked filesystem
        (``{}`` when the image is not unpacked for the nodes).  Read in a worker thread:
        the folder is on storage the nodes share, which the event loop never waits on."""
        folder = Path(self.rootfs_of(image)).parent

        def read() -> dict:
            try:
                labels = json.loads((folder / LABELS_FILE).read_text() or "{}") or {}
            except (OSError, ValueError):
                return {} if not (folder / "rootfs").is_dir() else facts_from_labels({})
            return facts_from_labels(labels)

        return await asyncio.to_thread(read)
