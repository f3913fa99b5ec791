"""GPUSlurmSpawner: batchspawner's SlurmSpawner with the hub's profiles, credits and line.

A start runs in this order (each step yields a ``progress()`` event):

1. load the profile from ``user_options`` (the same code as the Docker backend:
   :class:`hub_ext.spawn.core.SpawnerCore`); a profile sets the Slurm request through
   batchspawner's ``req_*`` traits (``req_gres``, ``req_partition``, ``req_runtime``, ...);
2. ask slurmctld (``sinfo``): when it does not answer, refuse at once in plain words;
3. submit the batch job as the member's own Unix account (``exec_prefix``: runuser), on
   the hub's host or on the submit host over ssh (:mod:`.spawner_submit`), its
   script running the notebook image in the container runtime (``container_command``,
   bubblewrap by default) with the member's workspace, the datasets read-only and only the
   GPU devices Slurm allocated (``SLURM_JOB_GPUS``); during an occurrence of a
   reservation of the member's group, with ``--reservation`` (:mod:`.spawner_reservations`);
4. while Slurm keeps the job pending, it is a place in the hub's line (:mod:`hub_ext.line`,
   :mod:`.line`): the member's place and the admins' view list it, in Slurm's priority
   order with the estimate from ``squeue --start``, and the progress page says it in the
   words of the single-node backend, updated live.  When no GPU of the profile is free
   and the member did not ask to wait (``user_options["wait"]``), the spawn is refused at
   once instead, in the same words as there;
5. once the job runs: the pre-start hooks (the credits debit: paid from the moment the GPU
   is the member's, not from the submission), then batchspawner's wrapper reports the port
   and the hub waits for JupyterLab; a job on a node that another group's reservation
   takes later is told until when it may run (:mod:`.spawner_reservations`).

GPUs are Slurm's to hand out (GRES, and the devices cgroup with ConstrainDevices=yes):
this backend never assigns devices itself.  A hub killed while a job waits keeps the job:
the line's keeper starts the spawn again after the restart and it takes the same job back
by its id (:meth:`GPUSlurmSpawner.submit_batch_script`), so it keeps its place in Slurm's
queue.  A server whose node went down is recorded as stopped for that reason
(:meth:`GPUSlurmSpawner.poll`).  A failed start cancels the job and undoes the
hooks (the debit is refunded); JupyterHub calls ``stop()`` after any failed start.
"""

from __future__ import annotations

import asyncio

from batchspawner import JobStatus, SlurmSpawner
from batchspawner.batchspawner import format_template
from tornado import web
from traitlets import Dict, Float, Int, Unicode, Union, default

from ..common import metrics
from ..common.clock import now
from ..spawn.backend import Ended
from ..spawn.core import SpawnerCore
from .availability import SlurmAvailability
from .batch import BATCH_SCRIPT, SlurmBatchJob, job_time_limit, slurm_request
from .cluster import MEMBER_PREFIX, SlurmCluster, SlurmUnavailable
from .port_report import replace_batchspawner_handler
from .spawner_end import SlurmEndSpawner
from .spawner_line import SlurmLineSpawner
from .spawner_reservations import SlurmReservationSpawner
from .spawner_submit import SubmitHostSpawner

# batchspawner's own port handler assigns any key a member posts to her spawner
replace_batchspawner_handler()


class GPUSlurmSpawner(
    SlurmEndSpawner,
    SlurmReservationSpawner,
    SlurmLineSpawner,
    SubmitHostSpawner,
    SlurmAvailability,
    SlurmBatchJob,
    SpawnerCore,
    SlurmSpawner,
):
    """A SlurmSpawner with profiles, credits, progress and the line of the Docker backend,
    and its spawn page (:mod:`hub_ext.spawn.page`, free GPUs from Slurm:
    :mod:`hub_ext.slurm.availability`)."""

    slurm_env = Dict(
        config=True,
        help="""Environment of the Slurm commands the hub runs (sbatch, squeue, sinfo,
        scancel), e.g. the cluster's configuration file.

            c.GPUSlurmSpawner.slurm_env = {"SLURM_CONF": "/etc/slurm/slurm.conf"}
        """,
    )

    scheduler_timeout = Float(
        3.0,
        config=True,
        help="""Seconds slurmctld has to answer the check before a spawn (``sinfo``); a
        spawn is refused at once, in plain words, when it does not.

            c.GPUSlurmSpawner.scheduler_timeout = 3
        """,
    )

    line_poll_interval = Float(
        2.0,
        config=True,
        help="""Seconds between two reads of Slurm's queue for the places in line (one
        read for every waiting member).

            c.GPUSlurmSpawner.line_poll_interval = 2
        """,
    )

    job_exit_timeout = Float(
        30.0,
        config=True,
        help="""Seconds a notebook job whose runner has reported its end has to end by
        itself (its runner exits with the notebook's exit code, so that Slurm's accounting
        shows COMPLETED or FAILED) before the hub cancels it with ``scancel``.

            c.GPUSlurmSpawner.job_exit_timeout = 30
        """,
    )

    #: a notebook job's runner exits by itself once its report is acknowledged (the batch
    #: job ends COMPLETED or FAILED in sacct); :meth:`stop` waits for that end
    job_exits_after_report = True

    gpus = Union(
        [Int(), Unicode()],
        default_value=0,
        config=True,
        help="""GPUs per server, as in the Docker backend's profiles: a count, or a GRES
        type and count such as "a100:2".  Becomes ``req_gres`` ("gpu:2", "gpu:a100:2")
        unless a profile sets ``req_gres`` itself.  Usually set per profile.

            c.GPUSlurmSpawner.gpus = 1
        """,
    )

    _overridable = (
        "image",
        "gpus",
        "gpu_idle_timeout",
        "cull_idle_timeout",
        "cull_max_age",
        "mem_limit",
        "cpu_limit",
        "req_gres",
        "req_partition",
        "req_account",
        "req_qos",
        "req_runtime",
        "req_memory",
        "req_nprocs",
        "credits_per_hour",
        "datasets",
        "default_url",
        "environment",
    )

    @default("exec_prefix")
    def _default_exec_prefix(self):
        # the hub runs as root on the submit host; sbatch runs as the member, so that Slurm
        # (munge) knows the job as theirs
        return MEMBER_PREFIX

    @default("batch_script")
    def _default_batch_script(self):
        return BATCH_SCRIPT

    @default("batchspawner_singleuser_cmd")
    def _default_wrapper(self):
        return "python3 -m batchspawner.singleuser"

    @default("req_srun")
    def _default_srun(self):
        return ""  # the container runs in the batch step, which holds the job's GPUs

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.init_core()
        self.cluster = SlurmCluster.shared(
            self.slurm_env, self.submit, self.exec_prefix
        )  # one cached node list
        self.gpu_devices: list[str] = []  # the running job's GPUs (the run record)
        self.profile_name = ""
        self._submitting = False  # a job may exist from here on (cancelled by name)
        self._last_status = ""  # the job's status before the latest query (poll)
        if self.db_session() is not None:
            self.line()  # the places kept from before a restart count from the start
            self.enforce_reservations()

    def get_env(self):
        """JupyterHub's environment of the server, ``slurm_env``, and the core's variables
        (:meth:`hub_ext.spawn.core.SpawnerCore.core_environment`)."""
        env = super().get_env()
        env.update(self.slurm_env)
        env.update(self.core_environment())
        return env

    # -- a start (hub_ext.spawn.backend.SpawnBackend) ---------------------------------

    #: a start cut off by the hub's shutdown keeps its job: the next hub takes it back
    #: by its id (take_back_job), with its place in Slurm's queue
    keeps_start_at_shutdown = True

    def new_start(self) -> None:
        self._submitting = False  # a job may exist only from here on
        self.job_reported = False
        self.gpu_devices = []  # none until the job runs

    async def check_start(self) -> None:
        """The job's request from the profile (a profile sets it through batchspawner's
        ``req_*`` traits; its ``gpus``, ``mem_limit`` and ``cpu_limit`` become GRES,
        ``--mem`` and ``--cpus-per-task``, enforced by the cluster's cgroups), the
        member's workspace (made when missing) and the image's mount points, then
        slurmctld: refused at once in plain words when it does not answer (503), or when
        no GPU of the profile is free and no wait was asked (409)."""
        if self.gpus and not self.req_gres:
            self.req_gres = f"gpu:{self.gpus}"
        self.req_memory, self.req_nprocs = slurm_request(
            self.req_memory, self.req_nprocs, self.mem_limit, self.cpu_limit
        )
        if self.workload.option:
            self._job_time_limit()
        self._workspace = self.prepare_workspace()
        self.check_mount_points(self.checked_datasets())
        if self.workload.command:
            self.check_job_runner()
        try:
            nodes = await self.cluster.nodes(fresh=True, timeout=self.scheduler_timeout)
        except SlurmUnavailable as e:
            metrics.SPAWNS_REFUSED.labels(reason="scheduler_down").inc()
            self.log.error("Refusing spawn of %s: %s: %s", self._log_name, e.what, e)
            raise web.HTTPError(503, e.member_message) from None
        self.check_free_gpus(nodes, await self.slurm_reservations())
        await self.choose_reservation()

    async def reserve(self) -> None:
        """Submit the batch job (or take back the one a stopped hub left pending) and wait
        until Slurm runs it; while Slurm keeps it pending it is a place in the hub's line
        (:meth:`_report_place`).  The GPUs are the running job's (``gpu_devices``)."""
        self.emit(
            10,
            f"Asking the cluster for {self.req_gres or 'a CPU-only'} server "
            f"(partition {self.req_partition or 'default'})",
        )
        self.log.info(
            "%s submits a job (gres %s) with workspace %s",
            self._log_name,
            self.req_gres,
            self._workspace,
        )
        # where the server listens is reported by the job (batchspawner's wrapper)
        self.ip = self.traits()["ip"].default_value
        self.port = self.traits()["port"].default_value
        if self.server:
            self.server.port = self.port
        self._submitting = True
        await self.submit_batch_script()
        if not self.job_id:
            raise RuntimeError("Jupyter batch job submission failure (no jobid in output)")
        while (status := await self.query_job_status()) != JobStatus.RUNNING:
            if status == JobStatus.PENDING:
                await self._report_place()
            elif status != JobStatus.UNKNOWN:
                self.log.warning(
                    "Job %s neither pending nor running: %s", self.job_id, self.job_status
                )
                self.clear_state()
                raise RuntimeError(
                    "The Jupyter batch job has disappeared while pending in the queue or "
                    "died immediately after starting."
                )
            await asyncio.sleep(self.startup_poll_interval)
        place = self.line().started(self.server_key)
        if place is not None:
            self.line_wait = max(0.0, now() - place.queued_at)
        self.emit(30, f"Job {self.job_id} runs on {self.state_gethost()}")
        self.gpu_devices = await self.job_devices()

    async def launch(self) -> tuple[str, int]:
        """The job runs (and is paid for): wait until its server reports its port."""
        self.persist_state()
        self.emit(50, "Waiting for JupyterLab to answer")
        self.ip = self.state_gethost()
        while self.port == 0:
            await asyncio.sleep(self.startup_poll_interval)
        self.log.info("Notebook server job %s started at %s:%s", self.job_id, self.ip, self.port)
        return self.ip, self.port

    async def wait_ready(self, ip: str, port: int) -> tuple[str, int]:
        """The node's address for the hub; a job on a node another group's reservation
        takes later is told until when it may run."""
        self.tell_next_window()
        address = await self.node_address(ip)
        self.emit(95, f"Server is up on {ip}")
        return address, port

    def _job_time_limit(self) -> None:
        """A notebook job's maximum run time as its ``--time`` (:func:`.batch.job_time_limit`);
        a site's limit Slurm would not read is left for sbatch to refuse."""
        try:
            self.req_runtime = job_time_limit(self.req_runtime, self.workload.max_seconds())
        except (TypeError, ValueError) as e:
            self.log.warning("%s: time limit left as it is: %s", self._log_name, e)

    async def submit_batch_script(self):
        """Submit the job; its id goes to the hub database at once.  A job of this server
        left pending by a hub that stopped during the start is taken back instead (same
        id: its place in Slurm's queue stays; :meth:`take_back_job`)."""
        if await self.take_back_job():
            return self.job_id
        job = self.batch_job(self.cmd_formatted_for_batch())  # hub_ext.slurm.batch
        cmd = " ".join(
            (
                format_template(self.exec_prefix, **job.options),
                format_template(self.batch_submit_cmd, **job.options),
            )
        )
        self.log.info("%s submits: %s", self._log_name, cmd)
        self.log.debug("%s's batch script:\n%s", self._log_name, job.script)
        out = await self.run_command(cmd, input=job.script, env=self.get_env())
        try:
            self.job_id = job_id = self.parse_job_id(out)
        except Exception:
            self.log.error("Job submission of %s failed: %s", self._log_name, out)
            self.job_id = job_id = ""
        # the line reads Slurm's queue for this job only once it has waited a moment
        self._line_from = asyncio.get_running_loop().time() + self.line_poll_interval
        self.persist_state()
        self.emit(15, f"Submitted job {job_id}")
        return job_id

    async def job_devices(self) -> list[str]:
        """The GPUs Slurm gave the running job, as the board names them
        (``<node>/gpu<index>``), for the run record; ``[]`` when Slurm cannot say."""
        try:
            jobs = await self.cluster.job_gpus(self.job_id)
        except SlurmUnavailable as e:
            self.log.warning("%s: no GPU list of job %s: %s", self._log_name, self.job_id, e)
            return []
        return [
            f"{node}/gpu{i}" for job in jobs for node, indexes in job.gpus.items() for i in indexes
        ]

    @property
    def job_name(self) -> str:
        """The Slurm job name (``--job-name``, what squeue and sacct show) of this server,
        one per member and server name: ``gpuhub-<member>-<server>``, and for a notebook
        job ``gpuhub-notebook-<member>-job-<12 hex of the job id>``."""
        kind = "-".join(filter(None, ["gpuhub", self.workload.kind]))
        return f"{kind}-{self.user.name}-{self.name or 'default'}"

    async def _cancel_job(self) -> None:
        """Cancel this server's job by id, or by name and owner when a start was cut off
        before sbatch answered (its id never reached us).  Never raises."""
        try:
            if self.job_id:
                await self.cancel_batch_job()
            elif getattr(self, "_submitting", False):
                await self.cluster.run("scancel", "--name", self.job_name, "--user", self.user.name)
        except Exception:
            self.log.exception("Could not cancel the job of %s", self._log_name)

    async def abandon(self) -> None:
        """Cancel the job of a failed or cancelled start.  Never raises."""
        await self._cancel_job()

    def release(self, why: str) -> None:
        """End this server's place in line, if it has one (its job is Slurm's to hand
        GPUs to)."""
        line = self.line()
        place = line.places.get(self.server_key)
        if place is not None and place.waiter is not None:
            place.waiter.cancel()  # the start was its only reader
        line.remove(self.server_key, "stopped", "The pending server was stopped.")
        line.backend.untrack(self.server_key)

    async def node_address(self, node: str) -> str:
        """The address the hub reaches ``node`` at (its NodeAddr in Slurm)."""
        for n in await self.cluster.nodes():
            if n.name == node and n.address:
                return n.address
        return node

    # -- a running server --------------------------------------------------------------

    async def end(self, now: bool = False) -> None:
        """Cancel the job (batchspawner's ``stop``).  A notebook job that has reported its
        end is not cancelled while it ends by itself (:meth:`_ends_by_itself`): Slurm keeps
        its COMPLETED or FAILED."""
        if self.job_id and await self._ends_by_itself(0 if now else self.job_exit_timeout):
            self.log.info(
                "%s: job %s ended by itself after its report", self._log_name, self.job_id
            )
            self.stop_reason = "job_ended"
        elif self.job_id:
            await SlurmSpawner.stop(self, now=now)
        else:  # a start stopped before sbatch answered
            await self._cancel_job()

    async def poll_server(self):
        """batchspawner's status query: None while the job is pending or runs."""
        self._last_status = self.job_status  # "RUNNING node1": where it ran at the last look
        status = await self.query_job_status()
        if status == JobStatus.PENDING and not self._spawn_pending:
            # the hub restarted while this start waited: not a server yet.  JupyterHub
            # clears it; the job stays in Slurm's queue and the line's keeper starts the
            # spawn again, which takes the job back
            self.log.info(
                "%s: job %s is still pending from before the restart", self._log_name, self.job_id
            )
            self.clear_state()
            return 1
        if status in (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.UNKNOWN):
            return None
        return 1

    async def why_ended(self, status) -> Ended | None:
        """A job that ended without the hub stopping it: its run record says ``gone``
        (``job_ended`` for a notebook job, ``stop_detail`` what Slurm says: "Slurm job 12
        was cancelled outside the hub"), ``out_of_memory`` when the job's cgroup killed it
        past its memory (Slurm's OUT_OF_MEMORY), or ``node_down`` ("node node2 down:
        <Slurm's reason>") when its node went down or failed.  A notebook job that ended
        by itself after its report (:attr:`job_reported`) is a normal end: ``job_ended``
        without a detail."""
        if not (self.job_id and (self.hook_state or self.workload.ends_by_itself)):
            return None
        if self.job_reported:  # after its report: the job's normal end
            return Ended(self.workload.ended_reason)
        return await self._why_ended(self._last_status, self.workload.ended_reason)

    async def poll(self):
        """The core's poll (a job ended without the hub is settled there), then an ended
        job forgotten, as batchspawner's poll does."""
        status = await super().poll()
        if status is not None:
            self.clear_state()
        return status
