"""The member's choice: untrusted ``user_options`` in, one profile applied, the choice kept.

:class:`ProfileChoice` is a part of every backend's spawner, through
:class:`hub_ext.spawn.core.SpawnerCore` (a configurable mixin: its traits are set as
``c.SpawnerCore.<trait>`` for both backends).  It runs the
steps of :mod:`hub_ext.spawn.profiles` on a spawn's ``user_options`` (the REST API's body, or the
spawn form through :meth:`ProfileChoice.options_from_form`) and keeps untrusted input small:

- ``user_options`` larger than ``user_options_max_bytes`` as JSON, or a spawn form whose
  fields are, is refused with HTTP 413 before a profile is looked at; messages quote at
  most the first characters of a bad value (:func:`hub_ext.spawn.profiles.quote`).
- Nothing oversized reaches the hub database: JupyterHub's ``User.spawn`` stores the
  request's ``user_options`` on its ``orm.Spawner`` before ``Spawner.start()`` (so that a
  later start with no options reuses them); a SQLAlchemy attribute listener
  (:func:`guard_stored_options`) keeps the stored value instead of an oversized one.
- A refused choice is not the next start's default: the last accepted one is stored back
  (JupyterHub starts a server asked for with ``{}`` or no body with the stored options).
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
from typing import NoReturn

from sqlalchemy import event
from sqlalchemy.orm import object_session
from tornado import web
from traitlets import Callable, Int, List, Union, validate
from traitlets.config import LoggingConfigurable

from ..common import metrics
from .profiles import (
    ProfileError,
    apply_overrides,
    init_profiles,
    profile_overrides,
    select_profile,
    visible_profiles,
)

__all__ = ["ProfileChoice", "guard_stored_options", "json_size", "wants_wait"]


def json_size(value) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON (of its ``repr`` when JSON cannot say it)."""
    try:
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    except (TypeError, ValueError):
        return len(repr(value).encode())


def too_large(size: int, limit: int) -> str:
    """The sentence a member reads when their choices are larger than ``limit`` bytes."""
    return (
        f"Your choices are too large ({size} bytes; at most {limit}). Pick a profile on "
        "the spawn page."
    )


#: ``user_options["pay"]``: "course" (the default: a course pays during its window, if
#: it can) or "self" (when the course's account cannot pay, the member pays)
PAY_CHOICES = ("course", "self")


def wants_wait(value) -> bool:
    """``user_options["wait"]``: true, 1, "1", "true", "on", "yes" ask to wait in line for
    a GPU (:mod:`hub_ext.docker.spawner_line`); anything else does not."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "on", "yes")
    return value is True or value == 1


class _StoredOptions:
    """What :func:`guard_stored_options` keeps: one limit and log for the hub process."""

    limit = 8192
    log = logging.getLogger(__name__)


def _keep_small(target, value, oldvalue, initiator):
    """``orm.Spawner.user_options`` "set" listener: an oversized value is not stored."""
    if value is None or json_size(value) <= _StoredOptions.limit:
        return value
    _StoredOptions.log.warning(
        "Not storing user_options of %d bytes (over %d) for server %r of user id %s",
        json_size(value),
        _StoredOptions.limit,
        getattr(target, "name", "?"),
        getattr(target, "user_id", "?"),
    )
    return oldvalue if isinstance(oldvalue, dict) else {}


def guard_stored_options(limit: int, log: logging.Logger) -> None:
    """Keep ``user_options`` over ``limit`` bytes of JSON out of the hub database, whoever
    sets them (``User.spawn``, the REST API's PUT and PATCH of a server).  Idempotent; the
    latest ``limit`` and ``log`` count.  A SQLAlchemy attribute event with ``retval=True``
    (SQLAlchemy docs, "AttributeEvents.set")."""
    from jupyterhub import orm

    _StoredOptions.limit, _StoredOptions.log = limit, log
    if not event.contains(orm.Spawner.user_options, "set", _keep_small):
        event.listen(orm.Spawner.user_options, "set", _keep_small, retval=True)


class ProfileChoice(LoggingConfigurable):
    """The profile list, the member's ``user_options`` validated, the choice kept."""

    #: ``user_options["pay"] == "self"``: pay personally when the course cannot (this start)
    pay_self = False
    #: ``user_options["job"]``: the notebook job this server runs (built by the hub only,
    #: checked by hub_ext.jobs.hook), or None for an interactive server
    job = None
    #: ``user_options["kernel"]``: the GPU kernel this server runs (built by the hub only,
    #: checked by hub_ext.kernels.hook), or None
    kernel = None

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
        config=True,
        help="""The largest ``user_options`` a spawn accepts, in bytes of compact JSON (the
        REST API's body, or the spawn form's fields together); larger ones are refused with
        HTTP 413 and never stored.  Real choices are a few dozen bytes.

            c.SpawnerCore.user_options_max_bytes = 8192
        """,
    )

    @validate("user_options_max_bytes")
    def _validate_max_bytes(self, proposal):
        if proposal["value"] < 256:
            raise ValueError(
                f"c.{type(self).__name__}.user_options_max_bytes must be at "
                f"least 256 (bytes), got {proposal['value']!r}"
            )
        return proposal["value"]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        guard_stored_options(self.user_options_max_bytes, self.log)
        # the choice stored before any start of this spawner object: JupyterHub's
        # User.spawn overwrites it with the request's before start() runs
        stored = getattr(getattr(self, "orm_spawner", None), "user_options", None)
        self._accepted_choice = copy.deepcopy(stored) if isinstance(stored, dict) else {}

    def options_from_form(self, formdata):
        """Form fields -> ``user_options``: ``profile`` and ``<profile>--<option>`` fields;
        the "Wait for a GPU" button (``gpuhub_wait=<profile>``) picks its profile and adds
        ``wait: true``.

        Raises ``HTTPError(413)`` when the fields are larger than ``user_options_max_bytes``
        (JupyterHub's spawn page shows the message above the form).
        """
        size = sum(len(key) + sum(len(v) for v in values) for key, values in formdata.items())
        if size > self.user_options_max_bytes:
            metrics.SPAWNS_REFUSED.labels(reason="bad_options").inc()
            self.log.warning("Refusing the spawn form of %s: %d bytes", self._log_name, size)
            raise web.HTTPError(413, too_large(size, self.user_options_max_bytes))
        options = {}
        profile = formdata.get("profile", [None])[0]
        wait_for = formdata.get("gpuhub_wait", [None])[0]
        if wait_for:  # the card's "Wait for a GPU" button
            profile, options["wait"] = wait_for, True
        if formdata.get("gpuhub_pay", [None])[0]:  # the card's "Pay with my own credits"
            options["pay"] = formdata["gpuhub_pay"][0]
        if profile is not None:
            options["profile"] = profile
            prefix = f"{profile}--"
            for key, values in formdata.items():
                if key.startswith(prefix) and values:
                    options[key[len(prefix) :]] = values[0]
        return options

    async def get_profiles(self) -> tuple[list[dict], list[dict]]:
        """(visible to this member, all) after :func:`init_profiles`."""
        profile_list = self.profile_list
        if callable(profile_list):
            profile_list = profile_list(self)
            if inspect.isawaitable(profile_list):
                profile_list = await profile_list
        try:
            profiles = init_profiles(profile_list, self._overridable)
        except ProfileError as e:
            self.log.error("profile_list is misconfigured: %s", e)
            raise web.HTTPError(500, f"The profile list is misconfigured: {e}") from e
        groups = [g.name for g in getattr(self.user, "groups", [])]
        admin = bool(getattr(self.user, "admin", False))
        return visible_profiles(profiles, groups, admin), profiles

    async def load_profile(self) -> None:
        """Step 1 of a start: validate ``user_options`` and apply the chosen profile.

        Raises ``HTTPError(413)`` for options over ``user_options_max_bytes`` and
        ``HTTPError(400)`` naming the valid choices for a choice that is not one; either
        way the last accepted choice stays the next start's default.
        """
        for name, value in self._configured.items():
            setattr(self, name, copy.deepcopy(value))
        size = json_size(self.user_options)
        if size > self.user_options_max_bytes:
            self._refuse(413, too_large(size, self.user_options_max_bytes))
        visible, everything = await self.get_profiles()
        options = self.user_options
        self.wait_requested = self.pay_self = False
        if isinstance(options, dict) and "wait" in options:  # hub_ext.docker.spawner_line
            options = dict(options)
            self.wait_requested = wants_wait(options.pop("wait"))
        self.job = None
        if isinstance(options, dict) and "job" in options:  # a notebook job: hub_ext.jobs
            options = dict(options)
            self.job = options.pop("job")
            if not isinstance(self.job, dict) or not self.job.get("id"):
                self._refuse(400, "A notebook job's options are made by the hub only.")
            self.wait_requested = True  # a job waits in line for its GPUs
        self.kernel = None
        if isinstance(options, dict) and "kernel" in options:  # a GPU kernel: hub_ext.kernels
            options = dict(options)
            self.kernel = options.pop("kernel")
            if not isinstance(self.kernel, dict) or not self.kernel.get("id"):
                self._refuse(400, "A GPU kernel's options are made by the hub only.")
            self.wait_requested = True  # a GPU kernel waits in line for its GPUs
        if isinstance(options, dict) and "pay" in options:  # hub_ext.credits.hook
            options = dict(options)
            pay = options.pop("pay")
            if pay not in PAY_CHOICES:
                self._refuse(
                    400, f"No such payer: {pay!r}. Options include: " + ", ".join(PAY_CHOICES)
                )
            self.pay_self = pay == "self"
        if not everything:
            self.profile_slug = self.profile_name = ""
            return
        try:
            selection = select_profile(visible, options, everything)
        except ProfileError as e:
            self._refuse(400, str(e))
        apply_overrides(self, profile_overrides(selection))
        if self.job:
            # a notebook job is never idle (nobody browses it) and has its own maximum run
            # time, enforced by hub_ext.jobs: no culling of SpawnerCore's kinds
            self.gpu_idle_timeout = self.cull_idle_timeout = self.cull_max_age = 0
        if self.kernel:
            # a GPU kernel's idleness is its cells' (hub_ext.kernels applies the kernels'
            # own time-out), not the idle culler's
            self.cull_idle_timeout = 0
        self.profile_slug = selection.slug
        self.profile_name = selection.profile.get("display_name") or selection.slug
        self._accepted_choice = {"profile": selection.slug, **selection.choices}
        if self.job:  # kept: a restarted hub knows the server runs this job
            self._accepted_choice["job"] = self.job
        if self.kernel:  # likewise for a GPU kernel
            self._accepted_choice["kernel"] = self.kernel
        self._keep_choice(self._accepted_choice)
        self.log.info(
            "%s uses profile %s %s", self._log_name, selection.slug, selection.choices or ""
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
