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
from tornado import web
from traitlets import Dict, Float, Int, Unicode, Union, default

from ..common import metrics
from ..common.clock import now
from ..common.periodic import shutting_down
from ..spawn.core import SpawnerCore
from .availability import SlurmAvailability
from .batch import BATCH_SCRIPT, SlurmBatchJob, job_time_limit, slurm_request
from .cluster import MEMBER_PREFIX, SlurmCluster, SlurmUnavailable
from .kernels import SlurmKernels
from .port_report import replace_batchspawner_handler
from .spawner_end import SlurmEndSpawner
from .spawner_line import SlurmLineSpawner
from .spawner_reservations import SlurmReservationSpawner
from .spawner_submit import SUBMIT_HOST_DOWN, SubmitHostSpawner

# batchspawner's own port handler assigns any key a member posts to her spawner
replace_batchspawner_handler()


class GPUSlurmSpawner(
    SlurmKernels,
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
        self._hooks_done: list | None = None
        self.gpu_devices: list[str] = []  # the running job's GPUs (the run record)
        self.profile_name = ""
        self.line_wait: float | None = None  # seconds in line before the job ran
        self.stop_reason = self.stop_detail = None  # why the server ended (poll)
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

    # -- start -------------------------------------------------------------------------

    async def start(self):
        """Start the server (the steps in the module doc); returns ``(ip, port)``.

        Raises ``tornado.web.HTTPError`` with a sentence for the member.
        """
        self._events = []
        self._hooks_done = None
        self._submitting = False  # a job may exist only from here on
        self.line_wait = self.stop_reason = self.stop_detail = None
        self.job_reported = False
        self.gpu_devices = []  # none until the job runs
        try:
            await self.load_profile()
            if self.gpus and not self.req_gres:
                self.req_gres = f"gpu:{self.gpus}"
            # the profile's limits are the job's request, which the cluster's cgroups
            # enforce (cgroup.conf ConstrainRAMSpace, ConstrainCores)
            self.req_memory, self.req_nprocs = slurm_request(
                self.req_memory, self.req_nprocs, self.mem_limit, self.cpu_limit
            )
            if self.job:
                self._job_time_limit()
            await self.check_hooks()  # a member who cannot pay is not queued at all
            workspace = self.prepare_workspace()
            self.check_mount_points(self.checked_datasets())
            if self.job:
                self.check_job_runner()
            try:
                nodes = await self.cluster.nodes(fresh=True, timeout=self.scheduler_timeout)
            except SlurmUnavailable as e:
                metrics.SPAWNS_REFUSED.labels(reason="scheduler_down").inc()
                self.log.error("Refusing spawn of %s: %s: %s", self._log_name, e.what, e)
                raise web.HTTPError(503, e.member_message) from None
            self.check_free_gpus(nodes, await self.slurm_reservations())
            await self.choose_reservation()
            self.emit(
                10,
                f"Asking the cluster for {self.req_gres or 'a CPU-only'} server "
                f"(partition {self.req_partition or 'default'})",
            )
            self.log.info(
                "%s submits a job (gres %s) with workspace %s",
                self._log_name,
                self.req_gres,
                workspace,
            )
            self._submitting = True
            ip, port = await super().start()
            if self._hooks_done is None:  # running before the first status query
                self._hooks_done = await self.run_start_hooks()
            self.tell_next_window()
            address = await self.node_address(ip)
            self.emit(95, f"Server is up on {ip}")
            return address, port
        except web.HTTPError as e:
            self.tell_member(e)
            await asyncio.shield(self._abandon_start())
            raise
        except BaseException:
            if shutting_down():
                # JupyterHub cancels the starts under way at the end of its clean-up: as
                # after a kill -9, the job and its place in line are left to the next hub,
                # which takes the job back by its id (take_back_job; re-adoption)
                self.log.info(
                    "%s: the hub shuts down during the start; job %s is kept",
                    self._log_name,
                    self.job_id or "(being submitted)",
                )
                raise
            await asyncio.shield(self._abandon_start())
            raise

    def _job_time_limit(self) -> None:
        """A notebook job's maximum run time as its ``--time`` (:func:`.batch.job_time_limit`);
        a site's limit Slurm would not read is left for sbatch to refuse."""
        try:
            self.req_runtime = job_time_limit(
                self.req_runtime, int(self.job.get("max_seconds") or 0)
            )
        except (TypeError, ValueError) as e:
            self.log.warning("%s: time limit left as it is: %s", self._log_name, e)

    async def submit_batch_script(self):
        """Submit the job; its id goes to the hub database at once.  A job of this server
        left pending by a hub that stopped during the start is taken back instead (same
        id: its place in Slurm's queue stays; :meth:`take_back_job`)."""
        if await self.take_back_job():
            return self.job_id
        try:
            job_id = await super().submit_batch_script()
        except RuntimeError as e:  # sbatch refused it: run_command gives its error output
            if str(e).startswith(SUBMIT_HOST_DOWN):
                raise
            raise await self.refused_by_sbatch(str(e)) from None
        # the line reads Slurm's queue for this job only once it has waited a moment
        self._line_from = asyncio.get_running_loop().time() + self.line_poll_interval
        self.persist_state()
        self.emit(15, f"Submitted job {job_id}")
        return job_id

    async def refused_by_sbatch(self, stderr: str) -> web.HTTPError:
        """The member's words for a job sbatch refused (:func:`.fit.sbatch_refusal`: what of
        the profile's memory, CPUs and GPUs no node of its partition has), a 503 for
        :meth:`start` to raise; Slurm's own words go to the log."""
        from .fit import Request, job_request, sbatch_refusal

        try:
            request = job_request(
                {
                    "req_memory": self.req_memory,
                    "req_nprocs": self.req_nprocs,
                    "req_gres": self.req_gres,
                }
            )
        except ValueError:
            request = Request(None, None)
        try:
            nodes = await self.cluster.nodes()
        except SlurmUnavailable:
            nodes = []
        partition = self.req_partition or self.cluster.default_partition
        message = sbatch_refusal(
            stderr, self.profile_name or "This server", request, partition, nodes
        )
        self.log.error("sbatch refused the job of %s: %s", self._log_name, stderr)
        metrics.SPAWNS_REFUSED.labels(reason="sbatch").inc()
        return web.HTTPError(503, message)

    async def query_job_status(self):
        """batchspawner's status query; during a start, a pending job reports its place
        in line, and the first time the job runs the pre-start hooks run (the debit)."""
        status = await super().query_job_status()
        if not self._spawn_pending:
            return status
        if status == JobStatus.PENDING:
            await self._report_place()
        elif status == JobStatus.RUNNING and self._hooks_done is None:
            self._hooks_done = []
            place = self.line().started(self.server_key)
            if place is not None:
                self.line_wait = max(0.0, now() - place.queued_at)
            self.emit(30, f"Job {self.job_id} runs on {self.state_gethost()}")
            self.gpu_devices = await self.job_devices()
            self._hooks_done = await self.run_start_hooks()
            self.persist_state()
            self.emit(50, "Waiting for JupyterLab to answer")
        return status

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
        kind = "gpuhub-notebook" if self.job else "gpuhub"
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

    async def _abandon_start(self) -> None:
        """Undo a failed or cancelled start: cancel the job, undo the hooks.  Never
        raises."""
        await self._cancel_job()
        await self.undo_start_hooks(self._hooks_done or [])
        self._hooks_done = None
        try:
            line = self.line()
            place = line.places.get(self.server_key)
            if place is not None and place.waiter is not None:
                place.waiter.cancel()  # this start was its only reader
            line.remove(self.server_key, "stopped", "The pending server was stopped.")
            line.backend.untrack(self.server_key)
        except Exception:
            self.log.exception("Could not end the place in line of %s", self._log_name)

    async def node_address(self, node: str) -> str:
        """The address the hub reaches ``node`` at (its NodeAddr in Slurm)."""
        for n in await self.cluster.nodes():
            if n.name == node and n.address:
                return n.address
        return node

    # -- stop / poll / state -----------------------------------------------------------

    async def stop(self, now=False):
        """Cancel the job, then the hooks' ``after_stop`` (credits settle and refund).  A
        notebook job that has reported its end is not cancelled while it ends by itself
        (:meth:`_ends_by_itself`): Slurm keeps its COMPLETED or FAILED."""
        try:
            if self.job_id and await self._ends_by_itself(0 if now else self.job_exit_timeout):
                self.log.info(
                    "%s: job %s ended by itself after its report", self._log_name, self.job_id
                )
                self.stop_reason = "job_ended"
            elif self.job_id:
                await super().stop(now=now)
            else:  # a start stopped before sbatch answered
                await self._cancel_job()
        finally:
            await self.run_stop_hooks()
            self.hook_state = {}
            self.stop_reason = self.stop_detail = None

    async def poll(self):
        """batchspawner's poll.  A server whose job ended without the hub stopping it is
        stopped here for the hooks (``after_stop``): its run record says ``gone``
        (``job_ended`` for a notebook job, ``kernel_ended`` for a GPU kernel,
        ``stop_detail`` what Slurm says: "Slurm job 12
        was cancelled outside the hub"),
        ``out_of_memory`` when the job's cgroup killed it past its memory (Slurm's
        OUT_OF_MEMORY), or ``node_down`` with ``stop_detail`` ("node node2 down: <Slurm's
        reason>") when its node went down or failed (:class:`hub_ext.culling.culler.Culler`).
        A notebook job that ended by itself after its report (:attr:`job_reported`) is a
        normal end: ``job_ended`` without a detail."""
        last = self.job_status  # "RUNNING node1": where the job ran at the last look
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
        if not self._spawn_pending and self.job_id and (self.hook_state or self.job):
            # ended behind the hub's back: JupyterHub's User.stop calls no stop() for a
            # server whose poll says it ended, so the stop hooks run here (idempotent:
            # credits settled and the unused part refunded, the run record closed, a
            # notebook job ended with why: hub_ext.jobs.hook)
            self.stop_reason = self.ended_reason()
            if not self.job_reported:  # after its report: the job's normal end
                await self._why_ended(last)
            try:
                await self.run_stop_hooks()
            finally:
                self.stop_reason = self.stop_detail = None
        self.clear_state()
        return 1

    def get_state(self):
        state = super().get_state()  # batchspawner's and the hooks' (SpawnerCore)
        if self.profile_slug:  # the board names it after a hub restart too
            state["gpuhub_profile"] = self.profile_slug
        return state

    def load_state(self, state):
        self.profile_slug = (state or {}).get("gpuhub_profile", "")
        super().load_state(state)  # batchspawner's, then the hooks' (SpawnerCore)
