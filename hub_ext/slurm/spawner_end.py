"""The Slurm backend's spawner, how its job ended (a mixin of
:class:`hub_ext.slurm.spawner.GPUSlurmSpawner`, whose ``stop()`` and ``poll()`` call it):

- :meth:`SlurmEndSpawner._ends_by_itself`: a notebook job that reported its end is left to
  end by itself (its runner exits with the notebook's code), so Slurm's accounting shows
  COMPLETED or FAILED, not CANCELLED;
- :meth:`SlurmEndSpawner._why_ended`: ``stop_reason``/``stop_detail`` of a job that ended
  without the hub, from Slurm's state of the job and of its node (OUT_OF_MEMORY,
  NODE_FAIL, a node down, CANCELLED, TIMEOUT, PREEMPTED).

Reads the spawner's ``job_id``, ``job``, ``job_reported``, ``job_status``, ``cluster``,
``req_memory``, ``req_runtime``, ``startup_poll_interval`` and ``query_job_status()``.
"""

from __future__ import annotations

import asyncio

from batchspawner import JobStatus

from ..spawn.backend import Ended
from .cluster import SlurmUnavailable

__all__ = ["SlurmEndSpawner"]


class SlurmEndSpawner:
    """How a Slurm server's job ended, in the words of its run record and its member."""

    async def _ends_by_itself(self, timeout: float) -> bool:
        """Whether this server is a notebook job whose runner has reported its end
        (:attr:`job_reported`) and whose batch job ends by itself within ``timeout``
        seconds (no longer RUNNING in squeue: COMPLETING, or gone).  False when it is
        still running then (an image whose runner predates ``GPUHUB_JOB_EXIT_AFTER_REPORT``
        lingers until stopped): the caller cancels it."""
        if not (self.workload.ends_by_itself and self.job_reported):
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            status = await self.query_job_status()
            if status not in (JobStatus.RUNNING, JobStatus.UNKNOWN) or (
                self.job_status.startswith("COMPLETING")
            ):
                return True
            if loop.time() >= deadline:
                self.log.warning(
                    "%s: job %s still runs %.0f s after its report; cancelling it",
                    self._log_name,
                    self.job_id,
                    timeout,
                )
                return False
            await asyncio.sleep(self.startup_poll_interval)

    async def _why_ended(self, last: str, reason: str) -> Ended:
        """Why the job ended, from its state (``squeue -t all`` keeps it ``MinJobAge``
        seconds: NODE_FAIL, OUT_OF_MEMORY) and its node's state and reason in Slurm;
        ``last`` is the job's last status ("RUNNING node1"), ``reason`` the workload's
        (``gone``, ``job_ended``) when nothing else explains it.  Never raises."""
        node = last.partition(" ")[2].strip()
        state, found = "", []
        try:
            state = (
                await self.cluster.run("squeue", "-h", "-j", self.job_id, "-t", "all", "-o", "%T")
            ).strip()
            found = [n for n in await self.cluster.nodes(fresh=True) if n.name == node]
        except SlurmUnavailable as e:
            self.log.warning(
                "Cannot read why job %s of %s ended: %s", self.job_id, self._log_name, e
            )
        if self.workload.ends_by_itself and state in ("COMPLETED", "FAILED"):
            # its runner exited by itself: after its report to a hub that restarted since
            # (the normal end of a job), or without one (the report's absence says so)
            detail = f"Slurm job {self.job_id} ended by itself ({state})"
            self.log.info("%s: %s", self._log_name, detail)
            return Ended(reason, detail)
        if state == "OUT_OF_MEMORY":
            self.log.warning("%s stopped: job %s ended as %s", self._log_name, self.job_id, state)
            return Ended(
                "out_of_memory",
                f"out of memory: the server used more than its "
                f"{self.req_memory or 'memory'} (Slurm: {state})",
            )
        if found and not found[0].available:
            detail = f"node {node} {found[0].state}: {found[0].reason or state}"
        elif state == "NODE_FAIL":
            detail = f"node {node or '?'} failed (Slurm: {state})"
        else:
            self.log.warning(
                "%s stopped: job %s ended (%s) without the hub",
                self._log_name,
                self.job_id,
                state or "gone from Slurm",
            )
            return Ended(reason, self._ended_detail(state))
        self.log.warning(
            "%s stopped: job %s ended as %s; %s",
            self._log_name,
            self.job_id,
            state or "gone",
            detail,
        )
        return Ended("node_down", detail)

    def _ended_detail(self, state: str) -> str:
        """What Slurm says of a job that ended without the hub (squeue's state, "" when
        Slurm has forgotten it), in a member's words."""
        job = f"Slurm job {self.job_id}"
        if state == "CANCELLED":
            return f"{job} was cancelled outside the hub"
        if state in ("TIMEOUT", "DEADLINE"):
            limit = f"its time limit ({self.req_runtime})" if self.req_runtime else "its time limit"
            return f"{job} reached {limit}"
        if state == "PREEMPTED":
            return f"{job} was preempted by the cluster"
        return f"{job} ended ({state or 'no longer known to Slurm'})"
