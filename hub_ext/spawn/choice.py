"""The member's choice: untrusted ``user_options`` in, one profile and workload out, the
choice kept.

The first step of a start (:meth:`hub_ext.spawn.core.SpawnerCore.load_profile`) reads a
spawn's ``user_options`` (the REST API's body, or the spawn form through
:func:`options_from_form`) with :func:`read_choice`, a pure function over the steps of
:mod:`hub_ext.spawn.profiles`, and keeps untrusted input small:

- ``user_options`` larger than ``user_options_max_bytes`` as JSON, or a spawn form whose
  fields are, is refused with HTTP 413 before a profile is looked at; messages quote at
  most the first characters of a bad value (:func:`hub_ext.spawn.profiles.quote`).
- Nothing oversized reaches the hub database: JupyterHub's ``User.spawn`` stores the
  request's ``user_options`` on its ``orm.Spawner`` before ``Spawner.start()`` (so that a
  later start with no options reuses them); a SQLAlchemy attribute listener
  (:func:`guard_stored_options`) keeps the stored value instead of an oversized one.
- A refused choice is not the next start's default: the last accepted one is stored back
  (JupyterHub starts a server asked for with ``{}`` or no body with the stored options).

What a server runs besides JupyterLab (a notebook job: ``user_options["job"]``) is read
here too, into a :class:`hub_ext.spawn.workload.Workload`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from sqlalchemy import event

from .profiles import ProfileError, Selection, profile_overrides, select_profile
from .workload import Server, Workload

__all__ = [
    "Choice",
    "Refused",
    "guard_stored_options",
    "json_size",
    "options_from_form",
    "read_choice",
    "stored_workload",
    "wants_wait",
]


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
    a GPU (the line: :mod:`hub_ext.line`); anything else does not."""
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


class Refused(Exception):
    """A choice refused: ``status`` (400, 413) and the sentence for the member."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def options_from_form(formdata: dict, limit: int) -> dict:
    """The spawn form's fields -> ``user_options``: ``profile`` and ``<profile>--<option>``
    fields; the "Wait for a GPU" button (``gpuhub_wait=<profile>``) picks its profile and
    adds ``wait: true``; "Pay with my own credits" (``gpuhub_pay``) adds ``pay``.  Raises
    :class:`Refused` (413) when the fields are larger than ``limit`` bytes."""
    size = sum(len(key) + sum(len(v) for v in values) for key, values in formdata.items())
    if size > limit:
        raise Refused(413, too_large(size, limit))
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


@dataclass
class Choice:
    """What a start's ``user_options`` choose: the profile (``selection``, None when the
    hub has no profiles) and its merged ``overrides``, whether the member asked to wait in
    line, to pay personally (``user_options["pay"] == "self"``: when the course cannot),
    the ``workload``, and ``accepted``: the choice stored as the next start's default."""

    selection: Selection | None = None
    overrides: dict = field(default_factory=dict)
    wait: bool = False
    pay_self: bool = False
    workload: Workload = field(default_factory=Server)
    accepted: dict = field(default_factory=dict)


def read_choice(
    user_options, visible: list[dict], everything: list[dict], workloads: dict
) -> Choice:
    """Validate untrusted ``user_options`` against the profiles ``visible`` to the member
    (``everything``: all of them, so that the message tells "not open to you" from "no such
    profile"); ``workloads``: ``{option: Workload class}``.  Raises :class:`Refused`
    (400) naming the valid choices."""
    choice = Choice()
    options = user_options
    if isinstance(options, dict) and "wait" in options:  # the line (hub_ext.line)
        options = dict(options)
        choice.wait = wants_wait(options.pop("wait"))
    asked = [key for key in workloads if isinstance(options, dict) and key in options]
    if asked:  # a notebook job (hub_ext.jobs): built by the hub only
        options = dict(options)
        try:
            choice.workload = workloads[asked[0]].parse(options.pop(asked[0]))
        except ValueError as e:
            raise Refused(400, str(e)) from None
        choice.wait = choice.wait or choice.workload.waits
    if isinstance(options, dict) and "pay" in options:  # hub_ext.credits.hook
        options = dict(options)
        pay = options.pop("pay")
        if pay not in PAY_CHOICES:
            raise Refused(
                400, f"No such payer: {pay!r}. Options include: " + ", ".join(PAY_CHOICES)
            )
        choice.pay_self = pay == "self"
    if not everything:
        return choice
    try:
        choice.selection = select_profile(visible, options, everything)
    except ProfileError as e:
        raise Refused(400, str(e)) from None
    # what the workload sets over its profile (a notebook job is never culled)
    choice.overrides = {**profile_overrides(choice.selection), **choice.workload.overrides()}
    choice.accepted = {"profile": choice.selection.slug, **choice.selection.choices}
    if choice.workload.option:  # kept: a restarted hub knows what the server runs
        choice.accepted[choice.workload.option] = choice.workload.value
    return choice


def stored_workload(user_options, workloads: dict) -> Workload:
    """What stored ``user_options`` say a server runs (after a hub restart), or
    :class:`hub_ext.spawn.workload.Server`."""
    options = user_options if isinstance(user_options, dict) else {}
    for key, cls in workloads.items():
        if key in options:
            try:
                return cls.parse(options[key])
            except ValueError:
                break
    return Server()
