"""The GPU kernels' spawner hook: forged kernel starts refused, a kernel ended exactly once,
a member's server taking its kernels with it.

:class:`KernelsHook` is an entry of ``c.SpawnerCore.before_container_hooks``
(:func:`hub_ext.kernels.hubconfig.apply_kernels_config` puts it first):

- ``before_reserve``: a start of a ``kernel-*`` server whose profile and
  ``user_options["kernel"]`` are not exactly those the hub stored for that kernel (a member
  forging ``POST /hub/api/users/<me>/servers/kernel-x``), or a start of any other server
  with a ``"kernel"`` option, is refused with 403 before anything is reserved or charged;
- ``after_stop``: a kernel's server stopped: the kernel ends, with the reason the hub
  stopped it for (the member's shutdown, the idle time-out, its parent server gone) or the
  one its backend found (its container ended, culled, out of credits); one conditional
  ``UPDATE`` (:func:`hub_ext.kernels.store.finish`), so a second call changes nothing.
  A member's own server stopped (by her, culled, or found gone): its kernels end too
  (:func:`hub_ext.kernels.lifecycle.stop_children`).
"""

from __future__ import annotations

from tornado import web
from traitlets.config import SingletonConfigurable

from ..common.runs import KERNEL_PREFIX
from ..jobs.workload import job_of
from ..spawn.hooks import Hook
from . import store
from .lifecycle import end, kernel_options, kernels_of, stop_children
from .workload import kernel_of

__all__ = ["KernelsHook", "ending_words"]

FORGED = (
    "Servers named kernel-… run the hub's GPU kernels and are started by the hub only: "
    "choose a GPU kernel for your notebook in JupyterLab instead."
)

#: why a kernel ended, by the stop reason its backend or a culler gave its server
#: (hub_ext.common.runs.STOP_REASONS): (the kernel's reason, the member's sentence)
BY_STOP_REASON = {
    "idle_gpu": (
        "idle_gpu",
        "The GPU kernel's GPU was idle past its profile's GPU-idle time-out: the hub "
        "stopped it and the GPU went back to the pool.",
    ),
    "max_age": (
        "max_age",
        "The GPU kernel ran for its profile's longest time: the hub stopped it.",
    ),
    "credits": ("credits", "Your credits ran out: the hub stopped the GPU kernel."),
    "reservation": (
        "reservation",
        "The GPU kernel's GPU was needed for a group's reservation: the hub stopped it.",
    ),
    "gone": ("gone", "The GPU kernel's container was gone when the hub looked."),
}


def ending_words(spawner) -> tuple[str, str]:
    """``(reason, message)`` of a kernel whose server ended without a stop the kernels
    asked for, from its spawner's ``stop_reason`` and ``stop_detail`` (None: the hub
    found the server gone, as after a restart)."""
    if spawner is None:
        return (
            "gone",
            "The GPU kernel's server was gone when the hub looked (it may have restarted).",
        )
    why = spawner.stop_reason
    detail = spawner.stop_detail
    if why == "kernel_ended":
        return (
            "died",
            f"The GPU kernel's container ended: {detail or 'it stopped'}. "
            "Start the kernel again from your notebook.",
        )
    if why == "node_down":  # Slurm: the kernel's node went down under its job
        return (
            "node_down",
            f"The GPU kernel's node went down ({detail or 'Slurm said so'}). "
            "Start the kernel again from your notebook.",
        )
    if why == "out_of_memory":
        return "out_of_memory", f"The GPU kernel ran out of memory: {detail or 'killed'}."
    if why in BY_STOP_REASON:
        return BY_STOP_REASON[why]
    return (
        "stopped",
        "The GPU kernel was stopped outside your notebook (by an admin, or the hub found "
        "its container gone).",
    )


class KernelsHook(Hook, SingletonConfigurable):
    """GPU kernels' part of every start and stop (see the module doc)."""

    name = "kernels"

    def _db(self, spawner):
        return spawner.db_session() or spawner.user.db

    async def before_reserve(self, spawner) -> None:
        """Refuse (403) a kernel start the hub did not build, or a kernel option on another
        server.  Raises ``tornado.web.HTTPError``."""
        name = spawner.name or ""
        kernel = kernel_of(spawner)
        if not name.startswith(KERNEL_PREFIX):
            if kernel is not None:
                self.log.warning(
                    "%s: a kernel option on a server that is no kernel", spawner._log_name
                )
                raise web.HTTPError(403, FORGED)
            return
        row = store.by_server(self._db(spawner), spawner.user.name, name)
        expected = kernel_options(row) if row is not None else None
        if (
            expected is None
            or row.state != "waiting"
            or kernel != expected["kernel"]
            or spawner.profile_slug != expected["profile"]
        ):
            self.log.warning(
                "Refusing the start of %s: not the hub's own start of its GPU kernel (%s)",
                spawner._log_name,
                "no such kernel" if row is None else f"kernel {row.id}, {row.state}",
            )
            raise web.HTTPError(403, FORGED)

    async def before_container(self, spawner) -> None:
        """Nothing to take: the kernel's row is its record."""

    async def undo(self, spawner) -> None:
        """Nothing to give back."""

    async def after_stop(self, spawner) -> None:
        """A kernel's server stopped (or its container ended): end the kernel, once; a
        member's own server stopped: end its kernels.  A kernel whose start failed before
        it ran is ended by :mod:`.lifecycle` instead.  Never raises."""
        try:
            if kernel_of(spawner) is None:
                if not (spawner.name or "").startswith(KERNEL_PREFIX) and job_of(spawner) is None:
                    stop_children(spawner.user, spawner.name or "")
                return
            db = self._db(spawner)
            row = store.by_server(db, spawner.user.name, spawner.name or "")
            if row is None or row.state not in store.LIVE:
                return
            if row.state == "running" or spawner.stop_reason == "kernel_ended":
                kernels = kernels_of(getattr(spawner.user, "settings", None) or {})
                reason, message = kernels.ending.pop(row.id, None) or ending_words(spawner)
                end(db, row, reason, message)
        except Exception:
            self.log.exception("GPU kernel of %s not ended", spawner._log_name)
