"""The spawner core: one lifecycle for every backend and workload.

:class:`SpawnerCore` is mixed in before a backend's JupyterHub spawner base and owns
``start()``, ``stop()`` and ``poll()``: the profile, the checks, a place in line or the
capacity, the debit, the launch, the wait until ready; on stop the settle, the release and
the record.  The backend answers the questions of :class:`hub_ext.spawn.backend.SpawnBackend`;
what a server runs is a :class:`hub_ext.spawn.workload.Workload`.  The story, step by step,
is docs/explanation/spawn.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy

from sqlalchemy.orm import object_session
from sqlalchemy.orm.attributes import flag_modified
from tornado import web
from traitlets import Any, CaselessStrEnum, Float, List, Unicode, validate

from ..common.periodic import shutting_down
from ..common.server_key import ServerKey
from .backend import Ended, SpawnBackend
from .choice import ProfileChoice
from .hooks import PENDING, Hook, check_before_reserve, resolve_hooks
from .mounts import MemberMounts
from .workload import Server

__all__ = ["PENDING", "STATE_VERSION", "SpawnerCore"]

STATE_VERSION = 1


class SpawnerCore(SpawnBackend, ProfileChoice, MemberMounts):
    """The lifecycle (:meth:`start`, :meth:`stop`, :meth:`poll`), profiles
    (:class:`hub_ext.spawn.choice.ProfileChoice`), the workspace's mount point and the
    datasets (:class:`hub_ext.spawn.mounts.MemberMounts`), hooks, progress events and hook
    state, for any JupyterHub spawner whose backend answers
    :class:`hub_ext.spawn.backend.SpawnBackend`.

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

    workloads = List(
        Unicode(),
        ["hub_ext.jobs.workload.NotebookJob"],
        config=True,
        help="""What a server may run besides JupyterLab: import strings of
        :class:`hub_ext.spawn.workload.Workload` subclasses, each asked for by its own
        ``user_options`` key (a notebook job: ``job``).

            c.SpawnerCore.workloads = ["hub_ext.jobs.workload.NotebookJob"]
        """,
    )

    _overridable: tuple[str, ...] = ()

    def get_args(self) -> list[str]:
        """JupyterHub's ``Spawner.args`` and ``--KernelManager.transport`` (issue 21: another
        member's server on the same loopback must not reach the kernels)."""
        args = list(super().get_args())
        if self.kernel_transport:
            args.append(f"--KernelManager.transport={self.kernel_transport}")
        return args

    def init_core(self) -> None:
        self.profile_slug = ""
        #: what this server runs (:mod:`hub_ext.spawn.workload`), from its ``user_options``
        self.workload = Server()
        #: set by :mod:`hub_ext.jobs` when this notebook job's runner has reported its end
        #: (and been told so); read by a backend with job_exits_after_report
        self.job_reported = False
        #: seconds this start waited in line (None: it did not): the run record says so
        self.line_wait: float | None = None
        #: why the server ended, while its stop hooks run (hub_ext.spawn.stopping, poll)
        self.stop_reason = self.stop_detail = None
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
        """The core's part of a server's environment: ``GPUHUB_WORKSPACE_MOUNT`` (where the
        workspace is mounted: the image's Jupyter Scheduler plugin sends paths under it to
        the jobs API), and the workload's own (a notebook job's ``GPUHUB_JOB``:
        :class:`hub_ext.jobs.workload.NotebookJob`); images/base."""
        return {
            "GPUHUB_WORKSPACE_MOUNT": self.workspace_mount,
            **self.workload.environment(self.workspace_mount, self.job_exits_after_report),
        }

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

    # -- the lifecycle -----------------------------------------------------------------

    async def start(self):
        """Start the server (docs/explanation/spawn.md); returns ``(ip, port)``.

        1. the profile (:meth:`load_profile`; ``user_options`` are untrusted: HTTP 400
           naming the valid choices, 413 when oversized);
        2. the checks: the hooks' ``before_reserve`` (402: the balance), then the
           backend's (:meth:`check_start`: what the launch needs, the hub's limits, the
           capacity), before anything is taken;
        3. a place in line or the capacity (:meth:`reserve`);
        4. the debit: the hooks' ``before_container`` (:meth:`run_start_hooks`);
        5. the launch (:meth:`launch`) and 6. the wait until the server answers
           (:meth:`wait_ready`).

        A start that fails or is cancelled gives back what it took (:meth:`abandon`, the
        hooks' undo, :meth:`release`); a refusal is a ``tornado.web.HTTPError`` whose
        sentence the progress page shows (:meth:`tell_member`).
        """
        self._events = []
        self.line_wait = self.stop_reason = self.stop_detail = None
        self.new_start()
        done: list = []
        try:
            await self.load_profile()
            await self.check_hooks()  # a member who cannot pay takes nothing
            await self.check_start()
            await self.reserve()
            async with self.rest_of_start():
                done = await self.run_start_hooks()
                ip, port = await self.launch()
                return await self.wait_ready(ip, port)
        except web.HTTPError as e:
            self.tell_member(e)
            await asyncio.shield(self._give_back(done))
            raise
        except BaseException:
            if self.keeps_start_at_shutdown and shutting_down():
                # JupyterHub cancels the starts under way at the end of its clean-up: as
                # after a kill -9, what they hold is left to the next hub, which takes it
                # back (the backend's adopt)
                self.log.info("%s: the hub shuts down during the start; kept", self._log_name)
                raise
            await asyncio.shield(self._give_back(done))
            raise
        finally:
            self.start_ended()

    async def _give_back(self, done: list) -> None:
        """Undo a failed or cancelled start: the launch, the hooks, the reservation.
        Never raises."""
        await self.abandon()
        await self.undo_start_hooks(done)
        try:
            self.release("start failed")
        except Exception:
            self.log.exception("Could not release what the start of %s took", self._log_name)

    async def stop(self, now=False):
        """Stop the server (:meth:`end`), then settle: the hooks' ``after_stop`` (credits
        settled and the unused part refunded, the run record closed, a notebook job ended)
        and :meth:`release`.  Idempotent.  When :meth:`end` raises, the stop is settled
        only if the backend says so (:meth:`stop_failed`), and the error is raised."""
        hook_state = copy.deepcopy(self.hook_state)  # a backend's own stop may clear state
        settle = True
        try:
            await self.end(now)
        except Exception:
            settle = await self.stop_failed()
            raise
        finally:
            try:
                if settle:
                    self.hook_state = hook_state
                    await self.run_stop_hooks()
            finally:
                self.hook_state = {}
                self.stop_reason = self.stop_detail = None
                self.release("stopped")

    async def poll(self):
        """The backend's :meth:`poll_server`; a server found ended by itself, not during
        its start, is settled here when the backend says why (:meth:`why_ended`): JupyterHub
        calls no ``stop()`` for a server whose poll says it ended."""
        status = await self.poll_server()
        if status is not None and not self._spawn_pending:
            ended = await self.why_ended(status)
            if ended is not None:
                await self.settle_end(ended)
        return status

    async def settle_end(self, ended: Ended) -> None:
        """The stop hooks of a server that ended without the hub (``ended``: why), then
        the hook state and the reason cleared and its resources released.  Idempotent:
        the hooks are.  Never raises an Exception."""
        self.stop_reason, self.stop_detail = ended.reason, ended.detail
        try:
            await self.run_stop_hooks()
        except Exception:
            self.log.exception("The stop hooks of %s failed", self._log_name)
        finally:
            self.hook_state = {}
            self.stop_reason = self.stop_detail = None
        try:
            self.release(ended.reason)
        except Exception:
            self.log.exception("Could not release what %s held", self._log_name)

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
        """The JupyterHub spawner's state, with the profile's slug (``gpuhub_profile``: the
        board names it after a restart), the backend's part (``gpuhub``, versioned:
        :meth:`saved_state`) and the hooks' parts (``gpuhub_hooks``, versioned) when they
        have any."""
        state = super().get_state()
        if self.profile_slug:
            state["gpuhub_profile"] = self.profile_slug
        saved = self.saved_state()
        if saved:
            state["gpuhub"] = {**saved, "version": STATE_VERSION}
        if self.hook_state:
            state["gpuhub_hooks"] = {
                "version": STATE_VERSION,
                "hooks": copy.deepcopy(self.hook_state),
            }
        return state

    def load_state(self, state):
        """A hub restart: the profile's slug, the backend's part (:meth:`adopt`), the
        JupyterHub spawner's ``load_state``, the workload from the stored ``user_options``,
        then ``gpuhub_hooks`` read back and each hook handed its part."""
        state = state or {}
        saved = state.get("gpuhub") or {}
        self.profile_slug = state.get("gpuhub_profile") or saved.get("profile", "")
        self.adopt(saved if saved.get("version") == STATE_VERSION else {})
        super().load_state(state)
        if isinstance(self.workload, Server):
            # a notebook job's server, found after a restart
            self.workload = self.stored_workload()
        hooks = state.get("gpuhub_hooks")
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
