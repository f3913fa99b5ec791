"""GPUSlurmSpawner: the Slurm backend, batchspawner's SlurmSpawner answering the spawn
lifecycle.

The lifecycle of a start and a stop is the core's (:class:`hub_ext.spawn.core.SpawnerCore`;
docs/explanation/spawn.md); this spawner answers its questions
(:class:`hub_ext.spawn.backend.SpawnBackend`) with Slurm:

- the checks: the job's request from the profile (batchspawner's ``req_*`` traits; its
  ``gpus``, ``mem_limit`` and ``cpu_limit`` become GRES, ``--mem`` and
  ``--cpus-per-task``), the member's workspace and the image on shared storage
  (:mod:`.batch`), and slurmctld (``sinfo``): refused at once in plain words when it does
  not answer, or when no GPU of the profile is free and no wait was asked;
- the reserve: the batch job (:func:`hub_ext.slurm.batch.make_batch_job`, a value) submitted
  as the member's own Unix account (``exec_prefix``: runuser), here or on the submit host
  over ssh (:mod:`.submit`), during an occurrence of a reservation of the member's group
  with ``--reservation`` (:mod:`.reservations`); while Slurm keeps it pending it is a place
  in the hub's line (:mod:`.line`), in Slurm's priority order, and the start goes on when
  Slurm runs it: the debit follows, paid from the moment the GPU is the member's;
- the launch: batchspawner's wrapper in the job reports the port; a job on a node that
  another group's reservation takes later is told until when it may run.

GPUs are Slurm's to hand out (GRES, and the devices cgroup with ConstrainDevices=yes):
this backend never assigns devices itself.  A hub killed while a job waits keeps the job:
the line's keeper starts the spawn again after the restart and it takes the same job back
by its id, so it keeps its place in Slurm's queue.  A server whose node went down is
recorded as stopped for that reason (:meth:`GPUSlurmSpawner.why_ended`).
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path

from batchspawner import JobStatus, SlurmSpawner
from batchspawner.batchspawner import format_template
from tornado import web
from traitlets import default

from ..common import metrics
from ..common.clock import now
from ..reservations.enforce import Reservations
from ..spawn.backend import Ended
from ..spawn.core import SpawnerCore
from . import availability
from .batch import (
    BATCH_SCRIPT,
    BatchJob,
    check_mount_points,
    check_runner,
    job_time_limit,
    make_batch_job,
    member_ids,
    prepare_workspace,
    rootfs_of,
    slurm_request,
    token_file,
)
from .cluster import MEMBER_PREFIX, SlurmCluster, SlurmUnavailable, job_end, parse_gres_request
from .enforce import SlurmHeld, attach_enforcement, device_nodes
from .line import attach_line, left_jobs, report_place, write_token
from .network import NetworkScript, SandboxNetwork
from .port_report import replace_batchspawner_handler
from .reservations import (
    choose_reservation,
    group_of,
    reservation_changed,
    reservations_of,
)
from .settings import SlurmSettings
from .submit import SUBMIT_HOST_DOWN, SubmitHost, run_batch_command

# batchspawner's own port handler assigns any key a member posts to her spawner
replace_batchspawner_handler()


class GPUSlurmSpawner(SpawnerCore, SlurmSettings, SlurmSpawner):
    """A SlurmSpawner with profiles, credits, progress and the line of the Docker backend,
    and its spawn page (free GPUs from Slurm: :mod:`hub_ext.slurm.availability`)."""

    #: notebook jobs and GPU kernels run here, each a batch job of its own; a GPU kernel
    #: usually on another node than its member's server, reached through the hub's relay
    #: (docs: explanation/gpu-kernels, "Slurm: a relay")
    runs_workloads = frozenset({"job", "kernel"})
    gpu_kernel_transport = "relay"

    #: a notebook job's runner exits by itself once its report is acknowledged (the batch
    #: job ends COMPLETED or FAILED in sacct); :meth:`end` waits for that end
    job_exits_after_report = True

    #: a start cut off by the hub's shutdown keeps its job: the next hub takes it back
    #: by its id (take_back_job), with its place in Slurm's queue
    keeps_start_at_shutdown = True

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
        self.cluster = SlurmCluster.shared(
            self.slurm_env, self.submit, self.exec_prefix
        )  # one cached node list
        self.gpu_devices: list[str] = []  # the running job's GPUs (the run record)
        self._submitting = False  # a job may exist from here on (cancelled by name)
        self._last_status = ""  # the job's status before the latest query (poll)
        self._reservation = ""  # the --reservation of the job being submitted, or ""
        self._workspace = ""  # the member's workspace, made by check_start
        self._line_from = 0.0  # the loop's time from which the queue is read for the job
        if self.db_session() is not None:
            self.line()  # the places kept from before a restart count from the start
            self.enforce_reservations()

    @property
    def submit(self) -> SubmitHost:
        """Where the Slurm commands run (:mod:`.submit`)."""
        return SubmitHost(self.submit_host, tuple(self.submit_ssh_command))

    def line(self):
        """The hub's line, with Slurm's queue as its backend (:mod:`.line`)."""
        api_url = self.hub.api_url if self.hub is not None else ""
        return attach_line(
            self.config, self.cluster, self.line_poll_interval, self.db_session(), api_url
        )

    def get_env(self):
        """JupyterHub's environment of the server, ``slurm_env``, and the core's variables
        (:meth:`hub_ext.spawn.core.SpawnerCore.core_environment`)."""
        env = super().get_env()
        env.update(self.slurm_env)
        env.update(self.core_environment())
        return env

    # -- a start (hub_ext.spawn.backend.SpawnBackend) ---------------------------------

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
        self._workspace = prepare_workspace(
            self.member_workspace(), *self.member_ids(), self.log, self._log_name
        )
        rootfs = rootfs_of(self.image_dir, self.image)
        check_mount_points(rootfs, self.image, self.checked_datasets(), self.log, self._log_name)
        if self.workload.command:  # a notebook job's runner must be in the image
            check_runner(
                rootfs,
                self.image,
                self.workload.command[0],
                self.container_path,
                self.workload.noun,
                self.log,
                self._log_name,
            )
        try:
            nodes = await self.cluster.nodes(fresh=True, timeout=self.scheduler_timeout)
        except SlurmUnavailable as e:
            metrics.SPAWNS_REFUSED.labels(reason="scheduler_down").inc()
            self.log.error("Refusing spawn of %s: %s: %s", self._log_name, e.what, e)
            raise web.HTTPError(503, e.member_message) from None
        self.check_free_gpus(
            nodes, await availability.slurm_reservations(self.cluster, self.config, self.log)
        )
        await self._choose_reservation()

    async def _choose_reservation(self) -> None:
        """A GPU job in the window of a reservation of the member's group carries its
        ``--reservation`` (:func:`hub_ext.slurm.reservations.choose_reservation`)."""
        self._reservation = ""
        if not parse_gres_request(self.req_gres)[1]:
            return
        chosen = await choose_reservation(
            self.config,
            self.db_session(),
            {g.name for g in self.user.groups},
            self.req_partition,
            self.log,
            self._log_name,
        )
        if chosen is not None:
            self._reservation = chosen[0]
            self.emit(12, f"Using the GPUs reserved for {chosen[1]}")

    def check_free_gpus(self, nodes, reservations=()) -> None:
        """No node of the profile's partition with its GPUs free (``nodes``: sinfo, just
        read) and no wait asked: refused at once (HTTP 409) in the words of its spawn page
        card (:func:`hub_ext.slurm.availability.gpus_in`).  A member who asked to wait
        goes on to the queue, unless no node could ever hold the request; so does a
        start whose place was kept from before a hub restart.  GPUs of a Slurm
        reservation of a group the member is not in (``reservations``) count as taken
        (:func:`hub_ext.slurm.availability.as_member_sees`).  Slurm
        may still keep a job pending that found a GPU free here (another start took it
        first): it is then a place in line."""
        kind, count = parse_gres_request(self.req_gres)
        if not count or self.server_key in self.line().places:
            return
        gpus = self._as_member_sees(
            nodes, reservations, kind, count, self.req_partition or self.cluster.default_partition
        )
        if not gpus.refusal or (self.wait_requested and gpus.can_wait):
            return
        metrics.SPAWNS_REFUSED.labels(reason="no_gpu_free").inc()
        self.log.warning(
            "Refusing spawn of %s (no_gpu_free, gres %s, partition %s): %s",
            self._log_name,
            self.req_gres,
            self.req_partition or "default",
            gpus.refusal,
        )
        raise web.HTTPError(409, gpus.refusal)

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
        await self._until_running()
        place = self.line().started(self.server_key)
        if place is not None:
            self.line_wait = max(0.0, now() - place.queued_at)
        self.emit(30, f"Job {self.job_id} runs on {self.state_gethost()}")
        self.gpu_devices = await self.job_devices()

    async def _until_running(self) -> None:
        """Wait until Slurm runs the job: while it is pending it is a place in the hub's
        line (:func:`hub_ext.slurm.line.report_place`).  Raises RuntimeError when the job
        disappeared (batchspawner's words), HTTPError(409) when the place ended."""
        while (status := await self.query_job_status()) != JobStatus.RUNNING:
            if status == JobStatus.PENDING:
                await report_place(
                    self.line(),
                    self.server_key,
                    self.job_id,
                    profile=self.profile_slug,
                    profile_name=self.profile_name,
                    count=parse_gres_request(self.req_gres)[1],
                    user_options=self.user_options,
                    not_before=self._line_from,
                    show=self.emit,
                    log=self.log,
                    who=self._log_name,
                )
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
        try:
            out = await self.run_command(cmd, input=job.script, env=self.get_env())
        except RuntimeError as e:  # sbatch refused it: run_command gives its error output
            if str(e).startswith(SUBMIT_HOST_DOWN):
                raise
            raise await self.refused_by_sbatch(str(e)) from None
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

    async def take_back_job(self) -> bool:
        """Before a submission: this server's job left by a hub that stopped during the
        start (found by its name and owner, and by the id spawner state kept, if any).
        A pending one is taken back (True: ``self.job_id`` is its id; its place in
        Slurm's queue stays); any other (one that ran while the hub was down, with a
        token JupyterHub no longer honours) is cancelled.  The new API token is handed
        first (:meth:`hand_token`), so a job that starts meanwhile reads it."""
        await write_token(
            self.submit,
            self.exec_prefix,
            self.user.name,
            self.token_file(),
            self.api_token,
            self.scheduler_timeout * 10,
            self.log,
            self._log_name,
        )
        state = getattr(getattr(self, "orm_spawner", None), "state", None) or {}
        try:
            jobs = await self.line().backend.read(fresh=True)
        except SlurmUnavailable as e:
            self.log.warning("Cannot look for the earlier job of %s: %s", self._log_name, e)
            return False
        kept, others = left_jobs(
            jobs, self.user.name, self.job_name, str(state.get("job_id") or "")
        )
        for job in others:
            self.log.warning(
                "%s: cancelling job %s (%s), left by a hub that stopped during its start",
                self._log_name,
                job.job_id,
                job.state,
            )
            try:
                await self.cluster.run("scancel", job.job_id)
            except SlurmUnavailable:
                self.log.exception("Could not cancel job %s", job.job_id)
        if kept is None:
            return False
        self.job_id = kept.job_id
        self.persist_state()
        self.log.info(
            "%s takes back job %s, pending since before the hub restarted",
            self._log_name,
            kept.job_id,
        )
        self.emit(15, f"Your job {kept.job_id} kept its place in the cluster's queue")
        return True

    # -- the batch job (hub_ext.slurm.batch) --------------------------------------------

    def member_workspace(self) -> str:
        """The member's workspace on the shared storage every node sees."""
        return self.workspace.format(username=self.user.name)

    def member_ids(self) -> tuple[int, int]:
        """The member's uid and gid on the cluster (:func:`hub_ext.slurm.batch.member_ids`)."""
        return member_ids(self.user.name)

    def token_file(self) -> str:
        """Where the job finds the API token of this start (in the member's workspace)."""
        return token_file(self.member_workspace(), self.name)

    def batch_job(self, command: str = "") -> BatchJob:
        """This start's batch job as a value (:func:`hub_ext.slurm.batch.make_batch_job`):
        batchspawner's request (its ``req_*`` traits), the member, the workspace, the
        datasets, the container; ``command`` the one the job runs
        (:meth:`cmd_formatted_for_batch`), "" for the commands' fields alone."""
        import batchspawner

        return make_batch_job(
            SlurmSpawner.get_req_subvars(self),
            template=self.batch_script,
            username=self.user.name,
            job_name=self.job_name,
            workspace=self.member_workspace(),
            workspace_mount=self.workspace_mount,
            token_file=self.token_file(),
            gpu_device=self.gpu_device,
            container_command=self.container_command,
            rootfs=rootfs_of(self.image_dir, self.image),
            image=self.image,
            datasets=self.member_datasets(),
            batchspawner_dir=str(Path(batchspawner.__file__).parent),
            container_path=self.container_path,
            environment=list(self.core_environment()),
            network=self.network_script(),
            reservation=self._reservation,
            command=command,
            user_options=self.user_options if isinstance(self.user_options, dict) else {},
        )

    def get_req_subvars(self):
        """batchspawner's fields of its commands (``exec_prefix``, ``squeue``,
        ``scancel``): this start's batch job's options, the member's name quoted."""
        return self.batch_job().options

    def cmd_formatted_for_batch(self):
        """batchspawner's command in the batch script: its wrapper (it reports the port to
        the hub, then runs the command with ``runpy``), or in an isolated sandbox the
        network's (:mod:`hub_ext.slurm.sandbox_net`, which does the same through the
        sandbox's forwarders), around JupyterLab, or around the workload's command (a
        notebook job's ``gpuhub-notebook-job``)."""
        wrapper = self.network_script().wrapper or self.batchspawner_singleuser_cmd
        command = list(self.workload.command or self.cmd)
        return " ".join([wrapper, *command, *self.get_args()])

    def network_script(self) -> NetworkScript:
        """The batch script's part of the job's network (:mod:`hub_ext.slurm.network`,
        ``c.SandboxNetwork``): none for a ``container_command`` without its ``{network}``
        field."""
        settings = SandboxNetwork(parent=self)
        if "{network}" not in self.container_command:
            if settings.isolated:
                self.log.warning(
                    "%s: container_command has no {network} field: the job shares the "
                    "node's network (c.SandboxNetwork.isolated)",
                    self._log_name,
                )
            return NetworkScript()
        return settings.script()

    @property
    def job_name(self) -> str:
        """The Slurm job name (``--job-name``, what squeue and sacct show) of this server,
        one per member and server name: ``gpuhub-<member>-<server>``, and for a notebook
        job ``gpuhub-notebook-<member>-job-<12 hex of the job id>``."""
        kind = "-".join(filter(None, ["gpuhub", self.workload.kind]))
        return f"{kind}-{self.user.name}-{self.name or 'default'}"

    async def run_command(self, cmd, input=None, env=None):
        """batchspawner's Slurm commands, run here or on the submit host
        (:func:`hub_ext.slurm.submit.run_batch_command`).  Raises RuntimeError with the
        command's error output (batchspawner reads it)."""
        return await run_batch_command(
            self.submit,
            cmd,
            input=input,
            env=env,
            slurm_env=self.slurm_env,
            timeout=self.submit_timeout,
            log=self.log,
            who=self._log_name,
        )

    def state_isunknown(self):
        """Slurm's "cannot contact the controller", or a submit host that did not answer:
        the job's state is unknown, and a running server is left running."""
        return super().state_isunknown() or (self.job_status or "").startswith(SUBMIT_HOST_DOWN)

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

    async def node_address(self, node: str) -> str:
        """The address the hub reaches ``node`` at (its NodeAddr in Slurm)."""
        for n in await self.cluster.nodes():
            if n.name == node and n.address:
                return n.address
        return node

    async def job_workspace(self) -> tuple[str, int, int]:
        """The member's workspace on the shared storage (the hub's host sees it, as for
        :meth:`check_start`) and the member's uid and gid on the cluster, for a notebook
        job.  Raises HTTPError(403) without a cluster account, HTTPError(404) without a
        workspace."""
        uid, gid = self.member_ids()
        path = self.member_workspace()
        if not os.path.isdir(path):
            raise web.HTTPError(
                404, "You have no workspace yet: start a server once and save your notebook."
            )
        return path, uid, gid

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
        seconds) and its node's state in Slurm (:func:`hub_ext.slurm.cluster.job_end`);
        ``last`` is the job's last status ("RUNNING node1"), ``reason`` the workload's
        when nothing else explains it.  Never raises."""
        node = last.partition(" ")[2].strip()
        state, found = "", None
        try:
            state = (
                await self.cluster.run("squeue", "-h", "-j", self.job_id, "-t", "all", "-o", "%T")
            ).strip()
            found = next((n for n in await self.cluster.nodes(fresh=True) if n.name == node), None)
        except SlurmUnavailable as e:
            self.log.warning(
                "Cannot read why job %s of %s ended: %s", self.job_id, self._log_name, e
            )
        ended = Ended(
            *job_end(
                self.job_id,
                state,
                node,
                found,
                self.workload.ends_by_itself,
                reason,
                self.req_memory,
                self.req_runtime,
            )
        )
        self.log.warning(
            "%s stopped: job %s ended as %s (%s): %s",
            self._log_name,
            self.job_id,
            state or "gone",
            ended.reason,
            ended.detail,
        )
        return ended

    # -- reservations (hub_ext.slurm.reservations, .enforce) ----------------------------

    @classmethod
    async def reservation_changed(cls, handler, spec, reservation_id: int) -> None:
        """Slurm's ``gpuhub-<id>`` made to match ``spec`` (None: deleted).  Raises
        BackendRefused (Slurm's words) or BackendUnavailable."""
        await reservation_changed(handler.settings["config"], handler.db, spec, reservation_id)

    def enforce_reservations(self) -> None:
        """Make the hub's :class:`~hub_ext.reservations.enforce.Reservations` read Slurm
        (:mod:`.enforce`) and start its passes (once per process; needs the hub
        database)."""
        db = self.db_session()
        if db is None:
            return
        settings = getattr(self.user, "settings", None) or {}
        attach_enforcement(reservations_of(self.config), self.config, db, settings.get("users"))

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

    def open_to_me(self, reservation) -> bool:
        """Whether this member may use Slurm's ``reservation``: one of its users, or of its
        group in the hub (joined since the last pass)."""
        return self.user.name in reservation.users or group_of(
            self.db_session(), reservation.reservation_id
        ) in {g.name for g in self.user.groups}

    def _as_member_sees(self, nodes, reservations, kind: str, count: int, partition: str):
        """GPUs free for this member (:func:`hub_ext.slurm.availability.as_member_sees`):
        those of a Slurm reservation of a group she is not in count as taken."""
        return availability.as_member_sees(
            nodes,
            reservations,
            self.open_to_me,
            lambda reservation_id: group_of(self.db_session(), reservation_id),
            kind,
            count,
            partition,
        )

    # -- what is free now (the spawn page, the board) ------------------------------------

    async def gpu_snapshot(self):
        return await availability.nodes_snapshot(
            self.cluster, self.scheduler_timeout, self.config, self.log
        )

    def gpus_now(self, snapshot, overrides: dict):
        """The profile's GPUs on its partition (``req_partition``, or Slurm's default
        partition) and of its GRES type; when Slurm does not answer, the card says so."""
        kind, count = parse_gres_request(availability.gres_of(overrides, self._configured))
        if snapshot.error:
            return availability.GPUsNow(
                count=count, kind=kind, refusal=snapshot.error if count else ""
            )
        partition = (
            overrides.get("req_partition", self._configured.get("req_partition"))
            or snapshot.default_partition
        )
        return self._as_member_sees(snapshot.nodes, snapshot.reservations, kind, count, partition)

    def limits_of(self, overrides: dict) -> tuple:
        return availability.limits_of(overrides, self._configured)

    async def image_facts(self, image: str) -> dict:
        return await availability.image_facts(rootfs_of(self.image_dir, image))

    @classmethod
    async def availability(cls, config, log) -> dict:
        return await availability.cluster_availability(SlurmCluster.of_config(config), log)

    @classmethod
    async def held_gpus(cls, handler, user, servers: list[str]) -> list[dict]:
        """The GPUs of the running jobs of ``user``'s ``servers``
        (:func:`hub_ext.slurm.availability.jobs_held_gpus`)."""
        cluster = SlurmCluster.of_config(handler.settings["config"])
        return await availability.jobs_held_gpus(cluster, handler.log, user, servers)

    @classmethod
    async def gpu_board(cls, handler) -> dict:
        """The GPU board's rows for the cluster (:mod:`hub_ext.slurm.board`)."""
        from .board import board_model

        return await board_model(handler, SlurmCluster.of_config(handler.settings["config"]))
