"""A notebook job as a workload of the spawn lifecycle (:mod:`hub_ext.spawn.workload`).

A job's server is started by the hub (:mod:`.lifecycle`) with ``user_options["job"]``;
it runs ``gpuhub-notebook-job`` (images/base) in place of JupyterLab, with the same uid,
workspace, datasets, GPUs and limits, waits in line for its GPUs, is never culled (nobody
browses it; its maximum run time is the keeper's) and ends by itself when the notebook is
done.  Registered in ``c.SpawnerCore.workloads`` by its import string.
"""

from __future__ import annotations

import json

from ..spawn.workload import Workload

__all__ = ["NotebookJob", "job_of"]


class NotebookJob(Workload):
    """A notebook run as a job: ``value`` is its ``user_options["job"]`` (built by the hub
    only: :func:`hub_ext.jobs.lifecycle.job_options`, checked by :mod:`.hook`)."""

    option = "job"
    kind = "notebook"
    noun = "notebook jobs"
    command = ("gpuhub-notebook-job",)
    waits = True
    ends_by_itself = True
    ended_reason = "job_ended"

    @classmethod
    def parse(cls, value) -> NotebookJob:
        if not isinstance(value, dict) or not value.get("id"):
            raise ValueError("A notebook job's options are made by the hub only.")
        return cls(value)

    def environment(self, workspace_mount: str, exits_after_report: bool) -> dict:
        """``GPUHUB_JOB`` (its options as JSON) and ``GPUHUB_JOB_ROOT`` (the workspace's
        mount point), read by its runner, and ``GPUHUB_JOB_EXIT_AFTER_REPORT=1`` where the
        backend lets it end by itself once the hub acknowledged its report."""
        env = {
            "GPUHUB_JOB": json.dumps(self.value, sort_keys=True),
            "GPUHUB_JOB_ROOT": workspace_mount,
        }
        if exits_after_report:
            env["GPUHUB_JOB_EXIT_AFTER_REPORT"] = "1"
        return env

    def labels(self) -> dict:
        return {"job": str(self.value.get("id", ""))}

    def max_seconds(self) -> int:
        return int(self.value.get("max_seconds") or 0)

    def ledger(self, display_name: str | None) -> dict:
        """The job's name as the member's list shows it ("Notebook job: <its name>")."""
        return {"job": display_name or "Notebook job"}

    def overrides(self) -> dict:
        """No culling of the core's kinds: nobody browses a job, and its maximum run time
        is the jobs keeper's (:mod:`.lifecycle`)."""
        return {"gpu_idle_timeout": 0, "cull_idle_timeout": 0, "cull_max_age": 0}


def job_of(spawner) -> dict | None:
    """The job ``spawner`` runs (its ``user_options["job"]``), or None."""
    workload = getattr(spawner, "workload", None)
    return workload.value if isinstance(workload, NotebookJob) else None
