"""The pre-start hooks of a spawn, backend-neutral: what runs around the GPU reservation.

A hook is an entry of ``c.SpawnerCore.before_container_hooks`` (the credits debit,
:class:`hub_ext.credits.hook.CreditsHook`, is one); the spawner's help lists the methods a
hook may have.  This module holds the steps every backend runs the same way, so that the
Docker spawner, the waiting line and a Slurm backend ask the hooks alike:

- :func:`resolve_hooks`: import strings to their (singleton) instances;
- :func:`check_before_reserve`: each hook's optional ``before_reserve(spawner)``, the
  cheap question "may this start go on at all?" asked before anything is reserved, so a
  member who would be refused never holds a GPU (or a place in the line) meanwhile.
"""

from __future__ import annotations

from traitlets.utils.importstring import import_item

__all__ = ["PENDING", "check_before_reserve", "resolve_hooks"]

#: In a hook's part of the state (a dict), marks a write-ahead record: written to the hub
#: database before the hook's side effect (the credits debit) and replaced once it is
#: done, so a hub killed mid-start knows the start was unfinished.
PENDING = "pending_start"


def resolve_hooks(hooks, config) -> list:
    """``hooks`` (objects, or import strings of ``SingletonConfigurable`` classes) as
    objects; an import string gives the class's one instance, configured by ``config``."""
    return [import_item(hook).instance(config=config) if isinstance(hook, str) else hook
            for hook in hooks]


async def check_before_reserve(hooks, spawner) -> None:
    """Await each hook's ``before_reserve(spawner)`` in order, where it has one.

    Runs after the profile is loaded (``spawner.credits_per_hour`` and the like are the
    profile's) and before any GPU is reserved or any place in the waiting line taken.
    The first refusal, a ``tornado.web.HTTPError`` with a sentence for the member, is
    raised as it is; nothing needs undoing, since nothing was taken.
    """
    for hook in hooks:
        check = getattr(hook, "before_reserve", None)
        if check is not None:
            await check(spawner)
