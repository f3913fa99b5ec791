"""The Slurm backend's part of the GPU board (:mod:`hub_ext.ops.board`): every node and its GPUs,
the job and member holding each, the nodes that take no jobs (drained, down: with Slurm's
reason) and the pending jobs in Slurm's order.

Read from Slurm in subprocesses (never on the event loop): ``sinfo`` (nodes, their GRES,
state and reason), ``scontrol -d show job`` (which GPU indexes each running job holds),
``squeue`` (the pending jobs by priority) and ``squeue --start`` (Slurm's expected start).
A job is the hub's when a member's spawner holds its id: its row has the member, the
server, the profile and a Stop button that stops the server through JupyterHub's REST
API, so the job is cancelled by the spawner's ``stop()`` (batchspawner ``scancel``) and
the credits are settled as on Docker.  Other jobs on the cluster are shown as ``outside``
the hub, without a button.  A GPU on a node of a reservation the hub made in Slurm
(:mod:`.reservations`) says whose it is and until when (``reserved_for``).  The board has
no utilization or memory on this backend (the hub does not run on the nodes): those are
None.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops.board import stop_path
from .cluster import JobGPUs, Node, QueuedJob, SlurmCluster, SlurmUnavailable


@dataclass(frozen=True)
class HubJob:
    """A job the hub started: whose server it is."""

    user: str
    server: str
    profile: str


def hub_jobs(users) -> dict[str, HubJob]:
    """Job id -> the member's server, over the hub's users (JupyterHub's ``UserDict``
    values) whose spawners hold a Slurm job (``job_id``, batchspawner)."""
    jobs = {}
    for user in users:
        for name, spawner in list(getattr(user, "spawners", {}).items()):
            job_id = getattr(spawner, "job_id", "")
            if job_id:
                jobs[str(job_id)] = HubJob(
                    user.name, name or "", getattr(spawner, "profile_slug", "") or ""
                )
    return jobs


def gpu_names(node: Node) -> list[str]:
    """One GRES type per GPU index of ``node`` ("" untyped), in gres.conf's order."""
    return [kind for kind, count in node.gpus.items() for _ in range(count)]


def board(
    nodes: list[Node], jobs: list[JobGPUs], hub: dict[str, HubJob], base_url: str
) -> list[dict]:
    """One JSON-ready row per GPU of every node, in the Docker board's shape (``uuid`` is
    ``<node>/gpu<index>``, ``index`` ``<node>:<index>``), plus ``node`` and, in
    ``owner``, the ``job`` id.  States: ``free``, ``held`` (by a hub job), ``outside``
    (another job on the cluster), or the node's state when it takes no jobs (``drained``,
    ``down``, ...) with Slurm's reason as ``health_reason``.  Times are Slurm's local ISO
    text."""
    holders: dict[tuple[str, int], JobGPUs] = {}
    # the hub's jobs first: a GPU one of them holds stays theirs, whatever another job's
    # line claims (its name is printed raw and may read "GRES=gpu(IDX:1)")
    for job in sorted(jobs, key=lambda j: j.job_id not in hub):
        if job.state in ("RUNNING", "COMPLETING", "SUSPENDED"):
            for node, indexes in job.gpus.items():
                for index in indexes:
                    holders.setdefault((node, index), job)
    rows = []
    for node in nodes:
        for index, kind in enumerate(gpu_names(node)):
            job = holders.get((node.name, index))
            owner = None
            if job is not None:
                mine = hub.get(job.job_id)
                owner = {
                    "user": mine.user if mine else job.user,
                    "server": mine.server if mine else "",
                    "profile": mine.profile if mine else "",
                    "since": job.start or None,
                    "known": mine is not None,
                    "stop_url": stop_path(base_url, mine.user, mine.server) if mine else None,
                    "job": job.job_id,
                    "limits": None,
                    "gpu_idle_for": None,
                }
            if not node.available:
                state = node.state
            elif owner is None:
                state = "free"
            else:
                state = "held" if owner["known"] else "outside"
            rows.append(
                {
                    "uuid": f"{node.name}/gpu{index}",
                    "index": f"{node.name}:{index}",
                    "node": node.name,
                    "name": f"{node.name} GPU {index}" + (f" ({kind})" if kind else ""),
                    "mig_profile": None,
                    "state": state,
                    "health_reason": node.reason if not node.available else "",
                    "utilization_pct": None,
                    "memory_used_mib": None,
                    "memory_total_mib": None,
                    "last_busy": None,
                    "processes": [],
                    "owner": owner,
                }
            )
    return rows


def pending_rows(
    queue: list[QueuedJob], starts: dict[str, str], hub: dict[str, HubJob], base_url: str
) -> list[dict]:
    """The pending jobs in Slurm's order, each with its position in its partition's line,
    Slurm's reason (``Resources``, ``Priority``, ...) and expected start (or None)."""
    rows, positions = [], {}
    for job in queue:
        if job.state != "PENDING":
            continue
        positions[job.partition] = positions.get(job.partition, 0) + 1
        mine = hub.get(job.job_id)
        rows.append(
            {
                "position": positions[job.partition],
                "job": job.job_id,
                "user": mine.user if mine else job.user,
                "server": mine.server if mine else "",
                "profile": mine.profile if mine else "",
                "partition": job.partition,
                "reason": job.reason,
                "expected_start": starts.get(job.job_id),
                "known": mine is not None,
                "stop_url": stop_path(base_url, mine.user, mine.server) if mine else None,
            }
        )
    return rows


def node_rows(nodes: list[Node]) -> list[dict]:
    """Every node: state, Slurm's reason, partitions, GPUs in all and free."""
    return [
        {
            "name": n.name,
            "state": n.state,
            "reason": n.reason,
            "partitions": n.partitions,
            "gpus": sum(n.gpus.values()),
            "free": n.free(),
            "available": n.available,
        }
        for n in nodes
    ]


async def reservation_texts(handler, cluster: SlurmCluster, nodes: list[Node]) -> dict[str, str]:
    """Node -> "2 GPUs reserved for ml101 until 16:00 UTC", for the nodes of the hub's
    active Slurm reservations (:mod:`.reservations`); {} (logged) when unreadable."""
    from ..reservations import store
    from ..reservations.backend import BackendRefused, BackendUnavailable
    from .reservations import SlurmReservations, until_text

    try:
        found = await SlurmReservations(cluster, config=handler.settings["config"]).read()
    except (BackendRefused, BackendUnavailable) as e:
        handler.log.warning("No Slurm reservations for the GPU board: %s", e)
        return {}
    texts = {}
    for r in found.values():
        row = store.get(handler.db, r.reservation_id)
        if r.active:
            text = until_text(r, row.group if row else "a removed reservation", nodes)
            texts.update(dict.fromkeys(r.nodes, text))
    return texts


async def board_model(handler, cluster: SlurmCluster) -> dict:
    """The board of the cluster (see the module doc); with Slurm not answering, empty
    rows and the error in ``error``."""
    base_url = handler.hub.base_url
    try:
        nodes = await cluster.nodes(fresh=True)
        jobs = await cluster.job_gpus()
        queue = await cluster.queue()
        starts = await cluster.start_times()
    except SlurmUnavailable as e:
        handler.log.warning("%s for the GPU board: %s", e.what, e)
        return {
            "inventory": "slurm",
            "error": f"{e.what}: {e}",
            "summary": dict.fromkeys(("total", "free", "allocated", "outside", "unhealthy"), 0),
            "devices": [],
            "nodes": [],
            "pending": [],
        }
    hub = hub_jobs(handler.users.values())
    rows = board(nodes, jobs, hub, base_url)
    reserved = await reservation_texts(handler, cluster, nodes)
    for row in rows:
        row["reserved_for"] = reserved.get(row["node"])
    count = {
        state: sum(1 for r in rows if r["state"] == state) for state in ("free", "held", "outside")
    }
    return {
        "inventory": "slurm",
        "error": "",
        "summary": {
            "total": len(rows),
            "free": count["free"],
            "allocated": count["held"],
            "outside": count["outside"],
            "unhealthy": len(rows) - sum(count.values()),
        },
        "devices": rows,
        "nodes": node_rows(nodes),
        "pending": pending_rows(queue, starts, hub, base_url),
    }
