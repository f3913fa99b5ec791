"""Whether a profile's job can run on the cluster at all, and a refusal by ``sbatch`` in words.

A job asks for memory (``--mem``), CPUs (``--cpus-per-task``) and GPUs (``--gres``) on one
node of a partition (:func:`job_request`, from the same values the spawner submits).  When
no node of that partition has them, Slurm refuses the submission ("Memory specification
can not be satisfied", "Requested node configuration is not available"): the member reads
which of the three does not fit and how much the nodes have (:func:`sbatch_refusal`), and
``gpuhub config check --reach`` names the profile before anyone tries
(:meth:`hub_ext.slurm.config.SlurmBackend.check_profiles`).  Both compare with
:func:`hub_ext.common.limits.misfit`.
"""

from __future__ import annotations

import re

from ..common.limits import Request, memory_bytes, misfit
from .availability import gres_of
from .batch import slurm_request
from .cluster import Node, parse_gres_request

__all__ = ["Request", "job_request", "partition_misfit", "sbatch_refusal", "slurm_reason"]


def job_request(values: dict) -> Request:
    """What a job asks of one node, from a profile's trait values (``overrides`` over the
    configured ones): ``req_memory``/``req_nprocs`` or JupyterHub's ``mem_limit``/
    ``cpu_limit`` (:func:`hub_ext.slurm.batch.slurm_request`), ``req_gres`` or ``gpus``.
    Raises ValueError for a memory size that cannot be read."""
    memory, cpus = slurm_request(
        values.get("req_memory"),
        values.get("req_nprocs"),
        values.get("mem_limit"),
        values.get("cpu_limit"),
    )
    kind, count = parse_gres_request(gres_of(values, {}))
    return Request(
        memory_bytes(memory + "M" if memory.isdigit() else memory),  # Slurm: MB by default
        float(cpus) if cpus.isdigit() else None,
        count,
        kind,
    )


def partition_misfit(request: Request, partition: str, nodes: list[Node]) -> str:
    """Why ``request`` can never run on ``partition`` (every node of it, up or not), or
    ``""`` when one of its nodes can hold it."""
    mine = [n for n in nodes if partition in n.partitions]
    if not mine:
        return f"the partition {partition!r}, which the cluster does not have"
    return misfit(request, [n.capacity() for n in mine], f"the nodes of partition {partition}")


_SBATCH_ERROR = re.compile(r"^sbatch: error: (?:Batch job submission failed: )?(.*)$", re.M)


def slurm_reason(stderr: str) -> str:
    """Slurm's own reason in sbatch's error output (its last ``sbatch: error:`` line, less
    the prefixes), at most 200 characters; ``""`` when there is none."""
    reasons = _SBATCH_ERROR.findall(stderr or "")
    return reasons[-1].strip()[:200] if reasons else ""


def sbatch_refusal(
    stderr: str, profile: str, request: Request, partition: str, nodes: list[Node]
) -> str:
    """The member's sentence for a submission ``sbatch`` refused (``stderr``) for the
    profile called ``profile``: what does not fit and how much the nodes have, when that is
    why; else Slurm's own reason.  Either way the profile, not the member, must change."""
    why = partition_misfit(request, partition, nodes) if nodes else ""
    if why:
        return (
            f"{profile} cannot start on this cluster: it asks for {why}. "
            "Ask an admin to fix the profile."
        )
    reason = slurm_reason(stderr) or "no reason given"
    return f"The cluster refused to run {profile} ({reason}). Ask an admin to check the profile."
