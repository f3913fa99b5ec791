"""The spawner core: one lifecycle for every backend and workload.

:class:`SpawnerCore` is a JupyterHub ``Spawner`` that owns ``start()``, ``stop()`` and
``poll()``: the profile, the checks, a place in line or the capacity, the debit, the
launch, the wait until ready; on stop the settle, the release and the record.  A backend's
spawner subclasses it before its JupyterHub spawner base and answers the questions of
:class:`hub_ext.spawn.backend.SpawnBackend`; what a server runs is a
:class:`hub_ext.spawn.workload.Workload`.  The story, step by step, is
docs/explanation/spawn.md; a new backend, docs/howto/write-a-backend.md.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from typing import NoReturn

from jupyterhub.spawner import Spawner
from sqlalchemy.orm import object_session
from sqlalchemy.orm.attributes import flag_modified
from tornado import web
from traitlets import (
    Any,
    Callable,
    CaselessStrEnum,
    Float,
    Int,
    List,
    Unicode,
    Union,
    default,
    validate,
)

from ..common import metrics
from ..common.periodic import shutting_down
from ..common.server_key import ServerKey
from . import page
from .backend import Ended, SpawnBackend
from .choice import (
    Refused,
    guard_stored_options,
    json_size,
    options_from_form,
    read_choice,
    stored_workload,
    too_large,
)
from .hooks import PENDING, Hook, check_before_reserve, resolve_hooks
from .mounts import Datasets, checked_datasets, member_datasets
from .profiles import (
    PROFILE_TRAITS,
    ProfileError,
    apply_overrides,
    init_profiles,
    visible_profiles,
)
from .workload import Server, workload_classes

__all__ = ["PENDING", "STATE_VERSION", "SpawnerCore"]

STATE_VERSION = 1


class SpawnerCore(SpawnBackend, Spawner):
    """The lifecycle (:meth:`start`, :meth:`stop`, :meth:`poll`), the member's choice of
    profile and workload, the mounts, the hooks, the progress events and the hook state,
    for a JupyterHub spawner whose backend answers :class:`hub_ext.spawn.backend.SpawnBackend`.

    Its section of the configuration, ``c.SpawnerCore``, is read by every backend's
    spawner (traitlets gives an instance the sections of each configurable class in its
    MRO, the nearest class winning): what both backends read is set there once
    (:func:`hub_ext.config.apply_config`), a backend's own settings on its own class.
    """

    profile_list = Union(
        [List(), Callable()],
        default_value=[],
        config=True,
        help="""Profiles in KubeSpawner's schema (see hub_ext.spawn.profiles), or a callable,
        sync or async, taking the spawner and returning that list.

            c.SpawnerCore.profile_list = [{"display_name": "CPU only", "default": True}]
        """,
    )

    user_options_max_bytes = Int(
        8192,
        min=256,
        config=True,
        help="""The largest ``user_options`` a spawn accepts, in bytes of compact JSON (the
        REST API's body, or the spawn form's fields together); larger ones are refused with
        HTTP 413 and never stored.  Real choices are a few dozen bytes; at least 256.

            c.SpawnerCore.user_options_max_bytes = 8192
        """,
    )

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
        min=0.0,
        config=True,
        help="""Seconds a server's GPUs may stay idle (0% utilization on every device)
        before the hub stops it, even while its browser tab is open; 0 never.  Usually set
        per profile (``gpu_idle_timeout``); enforced by hub_ext.culling.culler.Culler.

            c.SpawnerCore.gpu_idle_timeout = 2700
        """,
    )

    cull_idle_timeout = Float(
        0.0,
        min=0.0,
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
        min=0.0,
        config=True,
        help="""Seconds a server may run at most, busy or not; 0 no limit.  The member is
        warned on the home page c.Culler.max_age_warning seconds before.  Usually set per
        profile (``cull_max_age``); enforced by hub_ext.culling.culler.Culler.

            c.SpawnerCore.cull_max_age = 8 * 3600
        """,
    )

    workspace_mount = Unicode(
        "/home/jovyan/work",
        config=True,
        help="""Where the workspace appears in the container.

            c.SpawnerCore.workspace_mount = "/home/jovyan/work"  # either backend
        """,
    )

    datasets = Datasets(
        config=True,
        help="""Shared datasets, mounted read-only at ``/datasets/<name>``: name ->
        {"path": host path, "groups": [JupyterHub groups; empty or missing = everyone]},
        or name -> host path (everyone).  On Slurm the path is on the nodes' shared
        storage.  A missing host path is a spawn error, never created.  ``GPUHUB_DATASETS``
        (a JSON file of this mapping) sets it for either backend.

            c.SpawnerCore.datasets = {"imagenet": {"path": "/data/imagenet",
                                                   "groups": ["vision"]}}
        """,
    )

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
        ["hub_ext.jobs.workload.NotebookJob", "hub_ext.kernels.workload.GPUKernel"],
        config=True,
        help="""What a server may run besides JupyterLab: import strings of
        :class:`hub_ext.spawn.workload.Workload` subclasses, each asked for by its own
        ``user_options`` key (a notebook job: ``job``; a GPU kernel: ``kernel``).

            c.SpawnerCore.workloads = ["hub_ext.jobs.workload.NotebookJob"]
        """,
    )

    @default("options_form")
    def _default_options_form(self):
        return page.render_form

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        guard_stored_options(self.user_options_max_bytes, self.log)
        # the choice stored before any start of this spawner object: JupyterHub's
        # User.spawn overwrites it with the request's before start() runs
        stored = getattr(getattr(self, "orm_spawner", None), "user_options", None)
        self._accepted_choice = copy.deepcopy(stored) if isinstance(stored, dict) else {}
        #: the profile's slug and name this start chose ("": none)
        self.profile_slug = self.profile_name = ""
        #: the member asked to wait in line for GPUs (``user_options["wait"]``, or a
        #: workload that waits), and to pay personally when the course cannot
        self.wait_requested = self.pay_self = False
        #: what this server runs (:mod:`hub_ext.spawn.workload`), from its ``user_options``
        self.workload = Server()
        #: set by :mod:`hub_ext.jobs` when this notebook job's runner has reported its end
        #: (and been told so); read by a backend with job_exits_after_report
        self.job_reported = False
        #: seconds this start waited in line (None: it did not): the run record says so
        self.line_wait: float | None = None
        #: why the server ended, while its stop hooks run (hub_ext.spawn.stopping, poll)
        self.stop_reason = self.stop_detail = None
        #: each profile trait as configured, restored at each start so that one start's
        #: profile never leaks into the next
        self._configured = {
            name: copy.deepcopy(getattr(self, name)) for name in self.profile_keys()
        }
        self._events: list[dict] = []
        self._events_changed = asyncio.Event()
        self.hook_state: dict[str, dict] = {}

    @classmethod
    def profile_keys(cls) -> tuple[str, ...]:
        """The keys a profile's ``spawner_override`` may set on this spawner: those of
        :data:`hub_ext.spawn.profiles.PROFILE_TRAITS` that are its traits (the Slurm
        backend's ``req_partition`` is not Docker's)."""
        traits = cls.class_traits()
        return tuple(name for name in PROFILE_TRAITS if name in traits)

    def configured_value(self, name: str):
        """Trait ``name`` as configured, before any profile's override."""
        return self._configured.get(name, getattr(self, name))

    def get_args(self) -> list[str]:
        """JupyterHub's ``Spawner.args`` and ``--KernelManager.transport`` (issue 21: another
        member's server on the same loopback must not reach the kernels)."""
        args = list(super().get_args())
        if self.kernel_transport:
            args.append(f"--KernelManager.transport={self.kernel_transport}")
        return args

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

    def core_environment(self) -> dict:
        """The core's part of a server's environment: ``GPUHUB_WORKSPACE_MOUNT`` (where the
        workspace is mounted: the image's Jupyter Scheduler plugin sends paths under it to
        the jobs API), ``GPUHUB_KERNEL_TRANSPORT`` (how its GPU kernels are reached:
        :attr:`hub_ext.spawn.backend.SpawnBackend.gpu_kernel_transport`), and the workload's own
        (a notebook job's ``GPUHUB_JOB``: :class:`hub_ext.jobs.workload.NotebookJob`);
        images/base."""
        return {
            "GPUHUB_WORKSPACE_MOUNT": self.workspace_mount,
            "GPUHUB_KERNEL_TRANSPORT": self.gpu_kernel_transport,
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

    # -- the member's choice (hub_ext.spawn.choice) ---------------------------------------

    def options_from_form(self, formdata):
        """Form fields -> ``user_options`` (:func:`hub_ext.spawn.choice.options_from_form`).
        Raises ``HTTPError(413)`` when the fields are larger than ``user_options_max_bytes``
        (JupyterHub's spawn page shows the message above the form)."""
        try:
            return options_from_form(formdata, self.user_options_max_bytes)
        except Refused as e:
            metrics.SPAWNS_REFUSED.labels(reason="bad_options").inc()
            self.log.warning("Refusing the spawn form of %s: %s", self._log_name, e.message)
            raise web.HTTPError(e.status, e.message) from None

    async def get_profiles(self) -> tuple[list[dict], list[dict]]:
        """(visible to this member, all) after :func:`hub_ext.spawn.profiles.init_profiles`.
        Raises ``HTTPError(500)`` when the list is misconfigured."""
        profile_list = self.profile_list
        if callable(profile_list):
            profile_list = profile_list(self)
            if inspect.isawaitable(profile_list):
                profile_list = await profile_list
        try:
            profiles = init_profiles(profile_list, self.profile_keys())
        except ProfileError as e:
            self.log.error("profile_list is misconfigured: %s", e)
            raise web.HTTPError(500, f"The profile list is misconfigured: {e}") from e
        groups = [g.name for g in getattr(self.user, "groups", [])]
        admin = bool(getattr(self.user, "admin", False))
        return visible_profiles(profiles, groups, admin), profiles

    async def load_profile(self) -> None:
        """Step 1 of a start: validate ``user_options`` (untrusted), apply the chosen
        profile's overrides and keep the workload (:func:`hub_ext.spawn.choice.read_choice`).

        Raises ``HTTPError(413)`` for options over ``user_options_max_bytes``,
        ``HTTPError(400)`` naming the valid choices for a choice that is not one (either
        way the last accepted choice stays the next start's default), and
        ``HTTPError(501)`` in the workload's words for one the backend does not run
        (:meth:`hub_ext.spawn.backend.SpawnBackend.runs`: a GPU kernel on Slurm).
        """
        for name, value in self._configured.items():
            setattr(self, name, copy.deepcopy(value))
        size = json_size(self.user_options)
        if size > self.user_options_max_bytes:
            self._refuse(413, too_large(size, self.user_options_max_bytes))
        visible, everything = await self.get_profiles()
        self.wait_requested = self.pay_self = False
        self.workload = Server()
        try:
            choice = read_choice(
                self.user_options, visible, everything, workload_classes(self.workloads)
            )
        except Refused as e:
            self._refuse(e.status, e.message)
        if not self.runs(choice.workload):  # e.g. a GPU kernel on a backend without them
            metrics.SPAWNS_REFUSED.labels(reason="not_run").inc()
            self.log.warning(
                "Refusing spawn of %s: this backend runs no %s",
                self._log_name,
                choice.workload.noun,
            )
            raise web.HTTPError(501, choice.workload.not_run())
        self.wait_requested, self.pay_self = choice.wait, choice.pay_self
        self.workload = choice.workload
        if choice.selection is None:
            self.profile_slug = self.profile_name = ""
            return
        apply_overrides(self, choice.overrides)
        self.profile_slug = choice.selection.slug
        self.profile_name = choice.selection.profile.get("display_name") or self.profile_slug
        self._accepted_choice = choice.accepted
        self._keep_choice(self._accepted_choice)
        self.log.info(
            "%s uses profile %s %s",
            self._log_name,
            self.profile_slug,
            choice.selection.choices or "",
        )

    def workload_asked(self, options) -> bool:
        """Whether ``options`` (untrusted ``user_options``) ask for a workload that waits
        in line by itself (a notebook job)."""
        return isinstance(options, dict) and any(
            key in options and kind.waits for key, kind in workload_classes(self.workloads).items()
        )

    def _refuse(self, status: int, message: str) -> NoReturn:
        """Refuse this start's ``user_options``: the last accepted choice is stored back
        (or ``{}``, the default, when the stored choice itself is refused)."""
        metrics.SPAWNS_REFUSED.labels(reason="bad_options").inc()
        self.log.warning("Refusing spawn of %s: %s", self._log_name, message)
        if self.user_options == self._accepted_choice:
            self._accepted_choice = {}  # e.g. its profile was removed since
        self._keep_choice(self._accepted_choice, refused=True)
        raise web.HTTPError(status, message)

    def _keep_choice(self, chosen: dict, refused: bool = False) -> None:
        """Store ``chosen`` as this server's ``user_options``: the admin panel shows it, and
        JupyterHub uses it as the default of the next start (JupyterHub ``User.spawn``).
        ``{}`` becomes the default profile's slug when accepted."""
        if not refused:
            if self.user_options == chosen:
                return
            self.user_options = chosen
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is None:
            return
        orm_spawner.user_options = copy.deepcopy(chosen)
        session = object_session(orm_spawner)
        if session is not None:
            session.commit()

    # -- the mounts and the spawn page ---------------------------------------------------

    def member_datasets(self) -> dict[str, str]:
        """Dataset name -> host path, for the member's groups (admins: all)."""
        return member_datasets(self.datasets, self.user)

    def checked_datasets(self) -> dict[str, str]:
        """:meth:`member_datasets`, each path checked to exist on this host.  Raises
        ``HTTPError(500)`` with a sentence for the member when one is missing."""
        return checked_datasets(self.datasets, self.user, self.log, self._log_name)

    async def profile_cards(self, profiles: list[dict]) -> list[dict]:
        """The spawn page's card of each profile (:func:`hub_ext.spawn.page.profile_cards`)."""
        return await page.profile_cards(self, profiles)

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
            self.workload = stored_workload(self.user_options, workload_classes(self.workloads))
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
