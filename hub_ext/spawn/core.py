"""What every backend's spawner shares: profiles, mounts, pre-start hooks, progress, hook
state.

A backend's spawner (:mod:`hub_ext.docker.spawner`, :mod:`hub_ext.slurm.spawner`) mixes
:class:`SpawnerCore` in before its JupyterHub spawner base and calls, in its ``start()``:

1. :meth:`SpawnerCore.load_profile` (``user_options`` are untrusted: HTTP 400 naming the
   valid choices);
2. :meth:`SpawnerCore.check_hooks` before anything is reserved or queued, then its own
   reservation (the Docker pool; on Slurm, the job being scheduled);
3. :meth:`SpawnerCore.run_start_hooks` just before the server's resources are in use
   (the credits debit), and :meth:`SpawnerCore.undo_start_hooks` when a later step fails;
4. in ``stop()``, :meth:`SpawnerCore.run_stop_hooks` (credits settle and refund, culling,
   run records).

Hook state (``hook_state``: the credits meter's interval, the culler's watch) lives in
spawner state under ``gpuhub_hooks``, versioned, so a hub restart hands each hook its part
again (:meth:`SpawnerCore.get_state`, :meth:`SpawnerCore.load_state`).

Also shared: the server's key (:attr:`SpawnerCore.server_key`), the hub database session
(:meth:`SpawnerCore.db_session`) and how a refusal reaches the member
(:meth:`SpawnerCore.tell_member`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json

from sqlalchemy.orm import object_session
from sqlalchemy.orm.attributes import flag_modified
from tornado import web
from traitlets import Any, CaselessStrEnum, Float, List, validate

from ..common.server_key import ServerKey
from .choice import ProfileChoice
from .hooks import PENDING, Hook, check_before_reserve, resolve_hooks
from .mounts import MemberMounts

__all__ = ["PENDING", "STATE_VERSION", "SpawnerCore"]

STATE_VERSION = 1


class SpawnerCore(ProfileChoice, MemberMounts):
    """Profiles (:class:`hub_ext.spawn.choice.ProfileChoice`), the workspace's mount point and the
    datasets (:class:`hub_ext.spawn.mounts.MemberMounts`), hooks, progress events and hook
    state, for any JupyterHub spawner.

    Subclasses list the traits a profile may override in ``_overridable`` and call
    :meth:`init_core` from ``__init__``.

    Its section of the configuration, ``c.SpawnerCore``, is read by every backend's
    spawner (traitlets gives an instance the sections of each configurable class in its
    MRO, the nearest class winning): what both backends read is set there once
    (:func:`hub_ext.config.apply_config`), a backend's own settings on its own class.
    """

    credits_per_hour = Float(
        0.0,
        config=True,
        help="""Credits charged per hour of a running server; 0 makes a profile free.
        Usually set per profile.

            c.SpawnerCore.credits_per_hour = 2.0
        """,
    )

    gpu_idle_timeout = Float(
        0.0,
        config=True,
        help="""Seconds a server's GPUs may stay idle (0% utilization on every device)
        before the hub stops it, even while its browser tab is open; 0 never.  Usually set
        per profile (``gpu_idle_timeout``); enforced by hub_ext.culling.culler.Culler.

            c.SpawnerCore.gpu_idle_timeout = 2700
        """,
    )

    cull_idle_timeout = Float(
        0.0,
        config=True,
        help="""Seconds a server may go without activity (browser, kernels, terminals)
        before jupyterhub-idle-culler stops it; 0 leaves it to the culler's site-wide
        --timeout.  Usually set per profile (``cull_idle_timeout``); read by the culler
        service through hub_ext.culling.arbiter.

            c.SpawnerCore.cull_idle_timeout = 1800
        """,
    )

    cull_max_age = Float(
        0.0,
        config=True,
        help="""Seconds a server may run at most, busy or not; 0 no limit.  The member is
        warned on the home page c.Culler.max_age_warning seconds before.  Usually set per
        profile (``cull_max_age``); enforced by hub_ext.culling.culler.Culler.

            c.SpawnerCore.cull_max_age = 8 * 3600
        """,
    )

    @validate("gpu_idle_timeout", "cull_idle_timeout", "cull_max_age")
    def _validate_seconds(self, proposal):
        if proposal["value"] < 0:
            raise ValueError(
                f"c.{type(self).__name__}.{proposal['trait'].name} must be 0 (no limit) or a "
                f"positive number of seconds, got {proposal['value']!r}"
            )
        return proposal["value"]

    before_container_hooks = List(
        Any(),
        config=True,
        help="""Hooks run after the GPUs are reserved and before the container is
        created (the credits debit is one): :class:`hub_ext.spawn.hooks.Hook` instances, or
        import strings of Hook classes (one instance per hub, configured from the hub's
        config).  A hook has (hub_ext.spawn.hooks.Hook)

        - ``async before_container(spawner)``: raise ``tornado.web.HTTPError`` to refuse;
          this is the authority (the debit);
        - ``async undo(spawner)``: a later step failed; idempotent;
        - optionally ``async before_reserve(spawner)``: a quick check before anything is
          reserved (the credits hook: can the balance pay the first interval?), which
          the waiting line asks too, before it queues a member;
        - optionally ``async after_stop(spawner)``, ``restore(spawner)`` (the hub
          restarted with this server running; ``spawner.hook_state[hook.name]`` holds
          what the hook kept) and ``async why_not(spawner, credits_per_hour)`` (why a
          profile of that price cannot start for this member now, for the spawn page).

            c.SpawnerCore.before_container_hooks = ["hub_ext.credits.hook.CreditsHook"]
        """,
    )

    kernel_transport = CaselessStrEnum(
        ["ipc", "tcp", ""],
        "ipc",
        config=True,
        help="""How the member's server reaches its kernels, passed to the server as
        ``--KernelManager.transport``: ``ipc`` (Unix sockets in the member's private
        runtime folder) or ``tcp`` (ports on 127.0.0.1, which every server sharing the
        network namespace can reach: Docker host networking, a Slurm node); ``""`` leaves
        it to the image (the project's images set ``ipc`` themselves).

            c.SpawnerCore.kernel_transport = ""
        """,
    )

    @validate("before_container_hooks")
    def _validate_hooks(self, proposal):
        for hook in proposal["value"]:
            if not isinstance(hook, str | Hook):
                raise ValueError(
                    f"c.{type(self).__name__}.before_container_hooks: {hook!r} is not a "
                    "hub_ext.spawn.hooks.Hook (subclass it) nor the import string of one"
                )
        return proposal["value"]

    _overridable: tuple[str, ...] = ()

    def get_args(self) -> list[str]:
        """JupyterHub's ``Spawner.args`` and ``--KernelManager.transport`` (issue 21: another
        member's server on the same loopback must not reach the kernels)."""
        args = list(super().get_args())
        if self.kernel_transport:
            args.append(f"--KernelManager.transport={self.kernel_transport}")
        return args

    #: Whether a notebook job's runner ends its server by itself once the hub has
    #: acknowledged its report (``GPUHUB_JOB_EXIT_AFTER_REPORT=1`` in its environment;
    #: images/base/gpuhub-notebook-job).  A backend whose scheduler keeps an account of how
    #: each job ended (Slurm: COMPLETED, FAILED, CANCELLED) sets it, and its ``stop()``
    #: waits for that end once :attr:`job_reported` is set instead of cancelling the job.
    job_exits_after_report = False

    def init_core(self) -> None:
        self.profile_slug = ""
        #: set by :mod:`hub_ext.jobs` when this notebook job's runner has reported its end
        #: (and been told so); read by a backend with job_exits_after_report, which clears it
        #: at each start (Slurm)
        self.job_reported = False
        self._configured = {name: copy.deepcopy(getattr(self, name)) for name in self._overridable}
        self._events: list[dict] = []
        self._events_changed = asyncio.Event()
        self.hook_state: dict[str, dict] = {}

    @property
    def server_key(self) -> ServerKey:
        """This server's key in the pool, the line and the culler: (user, server name)."""
        return ServerKey(self.user.name, self.name or "")

    def db_session(self):
        """The hub's own database session, found from this spawner's row (JupyterHub's
        ``Spawner.db`` is deprecated); None outside a hub (a spawner made by a test)."""
        orm_spawner = getattr(self, "orm_spawner", None)
        return object_session(orm_spawner) if orm_spawner is not None else None

    @staticmethod
    def tell_member(error: web.HTTPError) -> None:
        """Make a refusal's sentence (``log_message``) the one JupyterHub shows the member
        (``jupyterhub_message``, JupyterHub ``format_exception``), so that a refusal
        coming after the spawn page moved on reads the same on the progress page; the
        caller raises ``error`` again.  A message already set is kept."""
        if error.log_message and not hasattr(error, "jupyterhub_message"):
            error.jupyterhub_message = error.log_message

    async def check_spawn(self, options: dict | None) -> None:
        """Optional for a backend: refuse now, with the ``tornado.web.HTTPError`` that
        ``start()`` would raise, a start it would refuse before reserving anything
        (``options``: the request's ``user_options``; None: the stored ones).  Asked by
        :mod:`hub_ext.spawn.gate` before JupyterHub creates the server's token and rows.
        Default: admits every start (``start()`` decides)."""

    @contextlib.asynccontextmanager
    async def checked_spawn(self, options: dict | None):
        """:meth:`check_spawn`, then the block in which :mod:`hub_ext.spawn.gate` hands
        the admitted start to JupyterHub.  A backend whose check leaves a claim that must
        count meanwhile (the Docker backend's GPUs) overrides it."""
        await self.check_spawn(options)
        yield

    async def job_workspace(self) -> tuple[str, int, int]:
        """Optional for a backend, needed for notebook jobs (:mod:`hub_ext.jobs`): the
        member's workspace as a folder on the hub's machine, and the uid and gid that own
        what the hub writes there.  Raises ``tornado.web.HTTPError`` (404: the member has
        no workspace yet) or NotImplementedError (the backend runs no jobs)."""
        raise NotImplementedError

    def core_environment(self) -> dict:
        """The core's part of a container's environment: ``GPUHUB_WORKSPACE_MOUNT`` (where
        the workspace is mounted: the image's Jupyter Scheduler plugin sends paths under it
        to the jobs API) and, for a notebook job, ``GPUHUB_JOB`` (its
        ``user_options["job"]`` as JSON) and ``GPUHUB_JOB_ROOT`` (the same folder, read by
        ``gpuhub-notebook-job``), and ``GPUHUB_JOB_EXIT_AFTER_REPORT=1`` where the backend
        has :attr:`job_exits_after_report`; for a GPU kernel, ``GPUHUB_KERNEL`` (its
        ``user_options["kernel"]`` as JSON, read by ``gpuhub-kernel``); images/base."""
        env = {"GPUHUB_WORKSPACE_MOUNT": self.workspace_mount}
        if self.kernel:
            env["GPUHUB_KERNEL"] = json.dumps(self.kernel, sort_keys=True)
        if self.job:
            env["GPUHUB_JOB"] = json.dumps(self.job, sort_keys=True)
            env["GPUHUB_JOB_ROOT"] = self.workspace_mount
            if self.job_exits_after_report:
                env["GPUHUB_JOB_EXIT_AFTER_REPORT"] = "1"
        return env

    #: the command of a notebook job's container (on the image's PATH)
    job_command = ["gpuhub-notebook-job"]
    #: the command of a GPU kernel's container (on the image's PATH; hub_ext.kernels)
    kernel_command = ["gpuhub-kernel"]
    #: Whether this backend runs GPU kernels (:mod:`hub_ext.kernels`): a container of the
    #: kernel's profile whose command is :attr:`kernel_command`, its connection files in
    #: the member's workspace, mounted in her server at the same path.  The Docker and
    #: Slurm backends do; a backend that does not is refused kernels with 501.
    runs_gpu_kernels = False

    @property
    def hooks(self) -> list:
        """``before_container_hooks`` with import strings resolved to their instances."""
        return resolve_hooks(self.before_container_hooks, self.config)

    async def check_hooks(self) -> None:
        """Whether the hooks let this start go on, asked before anything is reserved or
        queued (:func:`hub_ext.spawn.hooks.check_before_reserve`); the profile must be loaded.
        Raises the first hook's ``HTTPError`` (402: the balance cannot pay the first
        interval)."""
        await check_before_reserve(self.hooks, self)

    # -- progress ----------------------------------------------------------------------

    def emit(self, progress: int, message: str) -> None:
        """Record a progress event for the spawn page (JupyterHub ``Spawner.progress``)."""
        self._events.append({"progress": progress, "message": message})
        self._events_changed.set()

    async def progress(self):
        sent = 0
        while True:
            while sent < len(self._events):
                yield self._events[sent]
                sent += 1
            if not self._spawn_pending:
                return
            self._events_changed.clear()
            try:
                await asyncio.wait_for(self._events_changed.wait(), timeout=1)
            except TimeoutError:
                pass

    # -- hooks -------------------------------------------------------------------------

    async def run_start_hooks(self) -> list:
        """Each hook's ``before_container``, in order; returns those done (for
        :meth:`undo_start_hooks`).  A refusal (``HTTPError``) undoes the ones before it
        and is raised."""
        done = []
        try:
            for hook in self.hooks:
                await hook.before_container(self)
                done.append(hook)
        except BaseException:
            await asyncio.shield(self.undo_start_hooks(done))
            raise
        return done

    async def undo_start_hooks(self, done: list) -> None:
        """Undo started hooks, last first (a failed or cancelled start).  Never raises."""
        for hook in reversed(done):
            try:
                await hook.undo(self)
            except Exception:
                self.log.exception("Undo of %r failed for %s", hook, self._log_name)

    async def run_stop_hooks(self) -> None:
        """Each hook's ``after_stop`` (idempotent), last first."""
        for hook in reversed(self.hooks):
            await hook.after_stop(self)

    def start_unfinished(self) -> bool:
        """Whether a hook's part of the state is a write-ahead record: the hub stopped
        during a start."""
        return any(isinstance(v, dict) and v.get(PENDING) for v in self.hook_state.values())

    # -- state -------------------------------------------------------------------------

    def get_state(self):
        """The JupyterHub spawner's state, with the hooks' parts under ``gpuhub_hooks``
        (versioned) when they have any."""
        state = super().get_state()
        if self.hook_state:
            state["gpuhub_hooks"] = {
                "version": STATE_VERSION,
                "hooks": copy.deepcopy(self.hook_state),
            }
        return state

    def load_state(self, state):
        """The JupyterHub spawner's ``load_state``, then ``gpuhub_hooks`` read back and
        each hook handed its part (a hub restart).  A backend sets what the hooks read of
        the spawner (``profile_slug``, its GPUs) before calling this."""
        super().load_state(state)
        options = self.user_options if isinstance(self.user_options, dict) else {}
        if self.job is None and isinstance(options.get("job"), dict):
            self.job = options["job"]  # a notebook job's server, found after a restart
        if self.kernel is None and isinstance(options.get("kernel"), dict):
            self.kernel = options["kernel"]  # a GPU kernel's server, likewise
        hooks = (state or {}).get("gpuhub_hooks")
        if hooks and hooks.get("version") == STATE_VERSION:
            self.hook_state = dict(hooks.get("hooks") or {})
            self.restore_hooks()

    def clear_state(self):
        super().clear_state()
        self.hook_state = {}

    def restore_hooks(self) -> None:
        """Hand each hook its part of ``hook_state`` (its ``restore``)."""
        for hook in self.hooks:
            if hook.name in self.hook_state:
                hook.restore(self)

    def persist_state(self) -> None:
        """Write this spawner's state to the hub database now, as JupyterHub's
        ``User.spawn`` does once ``start()`` returns.  A hook's write-ahead record (the
        credits debit about to be made) then survives a hub killed mid-start, and the
        meter's record of paid intervals survives one killed while the server runs.
        """
        session = self.db_session()
        if session is None:
            return
        orm_spawner = self.orm_spawner
        orm_spawner.state = self.get_state()
        # the state JupyterHub saved last may share our dicts: say it changed
        flag_modified(orm_spawner, "state")
        session.commit()
