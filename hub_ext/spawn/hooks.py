"""The pre-start hooks of a spawn, backend-neutral: what runs around the GPU reservation.

A hook is an entry of ``c.SpawnerCore.before_container_hooks`` (the credits debit,
:class:`hub_ext.credits.hook.CreditsHook`, and the culler, :class:`hub_ext.culling.culler.Culler`,
are two): a :class:`Hook`, whose methods are the seam.  This module holds the steps every
backend runs the same way, so that the Docker spawner, the waiting line and a Slurm
backend ask the hooks alike:

- :func:`register_hook`: the one way a part of the hub adds its hook to the configuration;
- :func:`resolve_hooks`: import strings to their (singleton) instances;
- :func:`check_before_reserve`: each hook's optional ``before_reserve(spawner)``, the
  cheap question "may this start go on at all?" asked before anything is reserved, so a
  member who would be refused never holds a GPU (or a place in the line) meanwhile.
"""

from __future__ import annotations

from traitlets.utils.importstring import import_item

__all__ = ["PENDING", "Hook", "check_before_reserve", "register_hook", "resolve_hooks"]

#: In a hook's part of the state (a dict), marks a write-ahead record: written to the hub
#: database before the hook's side effect (the credits debit) and replaced once it is
#: done, so a hub killed mid-start knows the start was unfinished.
PENDING = "pending_start"


class Hook:
    """A pre-start hook: :meth:`before_container` and :meth:`undo` are required (they
    raise NotImplementedError here); :meth:`before_reserve`, :meth:`after_stop`,
    :meth:`restore` and :meth:`why_not` are optional, their defaults doing nothing.  Each
    takes the spawner (a :class:`hub_ext.spawn.core.SpawnerCore` of either backend).
    ``name`` keys the hook's part of the spawner's ``hook_state``.

    A mixin beside ``SingletonConfigurable`` (one instance per hub, which an import
    string in the configuration names)::

        class Audit(Hook, SingletonConfigurable):
            name = "audit"
            ...
    """

    name = ""

    async def before_container(self, spawner) -> None:
        """Just before the server's resources are in use (the credits debit): raise
        ``tornado.web.HTTPError`` to refuse; this is the authority."""
        raise NotImplementedError

    async def undo(self, spawner) -> None:
        """A later step of the start failed, or it was cancelled: undo
        :meth:`before_container`.  Idempotent."""
        raise NotImplementedError

    async def before_reserve(self, spawner) -> None:
        """Optional: a quick check before anything is reserved or queued (can the balance
        pay the first interval?); raise ``tornado.web.HTTPError`` to refuse.  Default:
        no check."""

    async def after_stop(self, spawner) -> None:
        """Optional: the server stopped.  Idempotent.  Default: nothing."""

    def restore(self, spawner) -> None:
        """Optional: the hub restarted with this server running;
        ``spawner.hook_state[self.name]`` holds what the hook kept (a dict with
        :data:`PENDING` set when the hub stopped during the start).  Default: nothing."""

    async def why_not(self, spawner, credits_per_hour: float) -> str:
        """Optional: a sentence saying why a profile of that price (credits per hour)
        cannot start for this member now, or ``""``; the spawn page disables such a
        profile and shows the sentence.  Default: ``""``."""
        return ""

    def who_pays(self, spawner, credits_per_hour: float) -> tuple[str, bool]:
        """Optional: for the spawn page's card, who pays for a profile of that price
        ("Paid by ML101 during its reservation until 16:00 UTC", or ``""``: not this hook's
        say) and whether the member may choose to pay personally instead.  Default:
        ``("", False)``."""
        return "", False


def register_hook(c, hook: str, first: bool = False) -> None:
    """Add ``hook`` (the import string of a :class:`Hook` class) to the hooks both
    backends run, ``c.SpawnerCore.before_container_hooks`` of the JupyterHub config ``c``,
    once: last (the order the parts of the hub register in), or ``first``.  The hooks a
    site configured stay."""
    core = c.SpawnerCore
    hooks = list(core.before_container_hooks) if "before_container_hooks" in core else []
    if first:
        hooks = [hook] + [h for h in hooks if h != hook]
    elif hook not in hooks:
        hooks.append(hook)
    core.before_container_hooks = hooks


def resolve_hooks(hooks, config) -> list:
    """``hooks`` (objects, or import strings of ``SingletonConfigurable`` classes) as
    objects; an import string gives the class's one instance, configured by ``config``."""
    return [
        import_item(hook).instance(config=config) if isinstance(hook, str) else hook
        for hook in hooks
    ]


async def check_before_reserve(hooks, spawner) -> None:
    """Await each hook's ``before_reserve(spawner)`` in order, where it has one.

    Runs after the profile is loaded (``spawner.credits_per_hour`` and the like are the
    profile's) and before any GPU is reserved or any place in the waiting line taken.
    The first refusal, a ``tornado.web.HTTPError`` with a sentence for the member, is
    raised as it is; nothing needs undoing, since nothing was taken.
    """
    for hook in hooks:
        await hook.before_reserve(spawner)
