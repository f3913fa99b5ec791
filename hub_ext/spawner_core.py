"""What every backend's spawner shares: profiles, pre-start hooks, progress, hook state.

A backend (:class:`hub_ext.spawner.GPUDockerSpawner`, :class:`hub_ext.slurm.spawner.
GPUSlurmSpawner`) mixes :class:`SpawnerCore` in before its JupyterHub spawner base and
calls, in its ``start()``:

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
again (:meth:`SpawnerCore.restore_hook_state`).
"""

from __future__ import annotations

import asyncio
import copy
import inspect

from sqlalchemy.orm import object_session
from tornado import web
from traitlets import Any, Callable, Float, List, Union, validate
from traitlets.config import LoggingConfigurable

from . import metrics
from .hooks import PENDING, check_before_reserve, resolve_hooks
from .profiles import (
    ProfileError,
    apply_overrides,
    init_profiles,
    profile_overrides,
    select_profile,
    visible_profiles,
)

__all__ = ["PENDING", "STATE_VERSION", "SpawnerCore"]

STATE_VERSION = 1


class SpawnerCore(LoggingConfigurable):
    """Profiles, hooks, progress events and hook state, for any JupyterHub spawner.

    Subclasses list the traits a profile may override in ``_overridable`` and call
    :meth:`init_core` from ``__init__``.
    """

    profile_list = Union(
        [List(), Callable()],
        default_value=[],
        config=True,
        help="""Profiles in KubeSpawner's schema (see hub_ext.profiles), or a callable,
        sync or async, taking the spawner and returning that list.

            c.GPUSlurmSpawner.profile_list = [{"display_name": "CPU only", "default": True}]
        """,
    )

    credits_per_hour = Float(
        0.0,
        config=True,
        help="""Credits charged per hour of a running server; 0 makes a profile free.
        Usually set per profile.

            c.GPUSlurmSpawner.credits_per_hour = 2.0
        """,
    )

    before_container_hooks = List(
        Any(),
        config=True,
        help="""Hooks run once the server's resources are its own (Docker: GPUs reserved,
        before the container; Slurm: the job is running) -- the credits debit is one:
        objects, or import strings of ``SingletonConfigurable`` classes.  The protocol
        (``before_container``, ``undo``, ``after_stop``, ``restore``, ``why_not``) is
        described at hub_ext.spawner.GPUDockerSpawner.before_container_hooks.

            c.GPUSlurmSpawner.before_container_hooks = ["hub_ext.credits.hook.CreditsHook"]
        """,
    )

    _overridable: tuple[str, ...] = ()

    def init_core(self) -> None:
        self.profile_slug = ""
        self._configured = {name: copy.deepcopy(getattr(self, name))
                            for name in self._overridable}
        self._events: list[dict] = []
        self._events_changed = asyncio.Event()
        self.hook_state: dict[str, dict] = {}

    @validate("credits_per_hour")
    def _validate_price(self, proposal):
        if proposal["value"] < 0:
            raise ValueError(f"c.{type(self).__name__}.credits_per_hour must be 0 or more, "
                             f"got {proposal['value']!r}")
        return proposal["value"]

    @property
    def hooks(self) -> list:
        """``before_container_hooks`` with import strings resolved to their instances."""
        return resolve_hooks(self.before_container_hooks, self.config)

    async def check_hooks(self) -> None:
        """Whether the hooks let this start go on, asked before anything is reserved or
        queued (:func:`hub_ext.hooks.check_before_reserve`); the profile must be loaded.
        Raises the first hook's ``HTTPError`` (402: the balance cannot pay the first
        interval)."""
        await check_before_reserve(self.hooks, self)

    # -- profiles ----------------------------------------------------------------------

    async def get_profiles(self) -> tuple[list[dict], list[dict]]:
        """(visible to this member, all) after :func:`init_profiles`."""
        profile_list = self.profile_list
        if callable(profile_list):
            profile_list = profile_list(self)
            if inspect.isawaitable(profile_list):
                profile_list = await profile_list
        try:
            profiles = init_profiles(profile_list)
        except ProfileError as e:
            self.log.error("profile_list is misconfigured: %s", e)
            raise web.HTTPError(500, f"The profile list is misconfigured: {e}") from e
        groups = [g.name for g in getattr(self.user, "groups", [])]
        admin = bool(getattr(self.user, "admin", False))
        return visible_profiles(profiles, groups, admin), profiles

    async def load_profile(self) -> None:
        """Validate ``user_options`` and apply the chosen profile's overrides.

        Raises ``HTTPError(400)`` naming the valid choices.
        """
        for name, value in self._configured.items():
            setattr(self, name, copy.deepcopy(value))
        visible, everything = await self.get_profiles()
        if not everything:
            self.profile_slug = ""
            return
        try:
            selection = select_profile(visible, self.user_options, everything)
        except ProfileError as e:
            metrics.SPAWNS_REFUSED.labels(reason="bad_options").inc()
            self.log.warning("Refusing spawn of %s: %s", self._log_name, e)
            raise web.HTTPError(400, str(e)) from e
        apply_overrides(self, profile_overrides(selection))
        self.profile_slug = selection.slug
        self._record_choice({"profile": selection.slug, **selection.choices})
        self.log.info("%s uses profile %s %s", self._log_name, selection.slug,
                      selection.choices or "")

    def _record_choice(self, chosen: dict) -> None:
        """Keep the full choice (``{}`` becomes the default profile's slug) as this
        server's ``user_options``: the admin panel shows it, and JupyterHub uses it as the
        default of the next start (JupyterHub ``User.spawn``)."""
        if self.user_options == chosen:
            return
        self.user_options = chosen
        orm_spawner = getattr(self, "orm_spawner", None)
        if orm_spawner is None:
            return
        from sqlalchemy import inspect as sa_inspect

        orm_spawner.user_options = chosen
        session = sa_inspect(orm_spawner).session
        if session is not None:
            session.commit()

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
            stopped = getattr(hook, "after_stop", None)
            if stopped is not None:
                await stopped(self)

    def start_unfinished(self) -> bool:
        """Whether a hook's part of the state is a write-ahead record: the hub stopped
        during a start."""
        return any(isinstance(v, dict) and v.get(PENDING) for v in self.hook_state.values())

    # -- state -------------------------------------------------------------------------

    def hook_state_for_db(self) -> dict:
        """The ``gpuhub_hooks`` entry of spawner state, or ``{}``."""
        if not self.hook_state:
            return {}
        return {"gpuhub_hooks": {"version": STATE_VERSION,
                                 "hooks": copy.deepcopy(self.hook_state)}}

    def restore_hook_state(self, state: dict | None) -> None:
        """Read ``gpuhub_hooks`` back and hand each hook its part after a hub restart."""
        hooks = (state or {}).get("gpuhub_hooks")
        if hooks and hooks.get("version") == STATE_VERSION:
            self.hook_state = dict(hooks.get("hooks") or {})
            self.restore_hooks()

    def restore_hooks(self) -> None:
        """Hand each hook its part of ``hook_state`` (its ``restore``)."""
        for hook in self.hooks:
            restore = getattr(hook, "restore", None)
            if restore is not None and getattr(hook, "name", None) in self.hook_state:
                restore(self)

    def persist_state(self) -> None:
        """Write this spawner's state to the hub database now, as JupyterHub's
        ``User.spawn`` does once ``start()`` returns.  A hook's write-ahead record (the
        credits debit about to be made) then survives a hub killed mid-start.
        """
        orm_spawner = getattr(self, "orm_spawner", None)
        # the hub's own session, found from its row (Spawner.db is deprecated)
        session = object_session(orm_spawner) if orm_spawner is not None else None
        if session is None:
            return
        orm_spawner.state = self.get_state()
        session.commit()
