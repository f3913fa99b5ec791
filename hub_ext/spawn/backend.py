"""What a backend provides to the spawn lifecycle: :class:`SpawnBackend`, the declared seam.

The lifecycle (:class:`hub_ext.spawn.core.SpawnerCore`: ``start()``, ``stop()``, ``poll()``)
is written once; a backend's spawner fills in the methods below, as batchspawner's
``SlurmSpawner`` fills in ``BatchSpawnerBase`` and dockerspawner's ``SwarmSpawner`` its
object hooks.  The story of a spawn, step by step, is docs/explanation/spawn.md; how to
write a backend is docs/howto/write-a-backend.md.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from .page import GPUsNow

__all__ = ["Ended", "SpawnBackend"]


@dataclass(frozen=True)
class Ended:
    """Why a server ended without the hub stopping it, for its stop hooks (the run record,
    the credits settle, a notebook job's end): ``reason`` is one of
    :data:`hub_ext.common.runs.STOP_REASONS`, ``detail`` the backend's words or None."""

    reason: str
    detail: str | None = None


class SpawnBackend:
    """The questions the lifecycle asks a backend.  Methods that raise NotImplementedError
    are required; the others are optional, their defaults documented on each.

    A start (:meth:`hub_ext.spawn.core.SpawnerCore.start`) asks, in this order:
    :meth:`new_start`, :meth:`check_start`, :meth:`reserve`, then (the debit between)
    :meth:`launch` and :meth:`wait_ready`, and :meth:`start_ended` however it ends; a
    failed start is undone by :meth:`abandon` and :meth:`release`.  A stop asks
    :meth:`end`, then :meth:`release`; a poll asks :meth:`poll_server` and, for a server
    that ended by itself, :meth:`why_ended`.  A restart hands back :meth:`saved_state`
    through :meth:`adopt`.  The spawn page and the gate ask what is free now
    (:meth:`gpu_snapshot`, :meth:`gpus_now`; :mod:`hub_ext.spawn.page`).
    Each method raises ``tornado.web.HTTPError`` with a sentence for the member to refuse.
    """

    #: Optional: a start cut off by the hub's own shutdown is left for the next hub, which
    #: takes it back (Slurm: the job keeps its place in the queue); default: undone.
    keeps_start_at_shutdown = False

    #: Optional: the workloads the backend runs besides the interactive server, which
    #: every backend runs, by their ``user_options`` key
    #: (:attr:`hub_ext.spawn.workload.Workload.option`: ``"job"`` a notebook job,
    #: ``"kernel"`` a GPU kernel); the hub refuses any other with 501 and the workload's
    #: words (:meth:`hub_ext.spawn.workload.Workload.not_run`).  Default: none.
    runs_workloads: frozenset[str] = frozenset()

    #: Optional: how a member's server reaches its GPU kernels, told to it as
    #: ``GPUHUB_KERNEL_TRANSPORT`` (images/base ``gpuhub_kernels.transport``): ``"ipc"``
    #: sockets in a folder of her workspace both containers mount (one machine), or
    #: ``"relay"`` through the hub (:mod:`hub_ext.kernels.relay`: the kernel runs on
    #: another node).  Default: ``"ipc"``.
    gpu_kernel_transport = "ipc"

    #: Optional: a notebook job's runner ends its server by itself once the hub has
    #: acknowledged its report (``GPUHUB_JOB_EXIT_AFTER_REPORT=1``), for a backend whose
    #: scheduler keeps an account of how each job ended (Slurm); default: the hub stops it.
    job_exits_after_report = False

    def runs(self, workload) -> bool:
        """Whether the backend runs ``workload`` (a
        :class:`~hub_ext.spawn.workload.Workload` subclass or instance): the interactive
        server always, another when :attr:`runs_workloads` names its option."""
        return workload.option is None or workload.option in self.runs_workloads

    # -- a start -------------------------------------------------------------------------

    def new_start(self) -> None:
        """Optional: forget what the last start left behind; asked first.  Default:
        nothing."""

    async def check_start(self) -> None:
        """Everything the backend refuses before anything is taken, the profile loaded and
        the hooks asked: what the launch will need (the member's uid, workspace, datasets),
        the hub's limits, whether capacity can be had or waited for."""
        raise NotImplementedError

    async def reserve(self) -> None:
        """Take the capacity of the profile, at once or after a wait in the hub's line
        (then set ``line_wait``, seconds); the debit follows."""
        raise NotImplementedError

    def rest_of_start(self):
        """Optional: a context manager around the debit, the launch and the wait (a start
        that waited in line gets its own time limit for the rest).  Default: none."""
        return contextlib.nullcontext()

    async def launch(self) -> tuple[str, int]:
        """Start the server from its spec; returns ``(ip, port)`` where it will serve."""
        raise NotImplementedError

    async def wait_ready(self, ip: str, port: int) -> tuple[str, int]:
        """Optional: wait until the server answers; returns where the hub reaches it.
        Default: ``(ip, port)`` at once (JupyterHub's own wait follows)."""
        return ip, port

    async def abandon(self) -> None:
        """A start failed or was cancelled after :meth:`reserve`: undo the launch
        (container, batch job) if there was one.  Idempotent; never raises."""
        raise NotImplementedError

    def release(self, why: str) -> None:
        """Give back what :meth:`reserve` took (GPUs, a place in line); ``why`` for the
        log.  Idempotent: JupyterHub calls ``stop()`` after a failed start, and may twice."""
        raise NotImplementedError

    def start_ended(self) -> None:
        """Optional: the start ended, whichever way (its claims are spent).  Default:
        nothing."""

    # -- a running server ----------------------------------------------------------------

    async def poll_server(self) -> int | None:
        """None while the server runs (or starts), else its exit status (JupyterHub
        ``Spawner.poll``)."""
        raise NotImplementedError

    async def why_ended(self, status: int) -> Ended | None:
        """Optional: a server found ended by :meth:`poll_server` (``status``), not
        during its start: why, when its stop must be settled now (JupyterHub calls no
        ``stop()`` for a server whose poll says it ended); None leaves it to the hooks'
        own passes.  Default: None."""
        return None

    async def end(self, now: bool = False) -> None:
        """Stop the server.  Raises when it may still run."""
        raise NotImplementedError

    async def stop_failed(self) -> bool:
        """Optional: :meth:`end` raised: whether the stop is settled all the same (the stop
        hooks run; GPUs the backend cannot see are not at stake).  Default: True."""
        return True

    # -- what is free now (the spawn page, the gate, the board) ---------------------------

    async def gpu_snapshot(self):
        """What the backend knows of its GPUs now, read once per page; never raises (an
        unreadable inventory is part of the snapshot)."""
        raise NotImplementedError

    def gpus_now(self, snapshot, overrides: dict) -> GPUsNow:
        """A profile's GPUs (``overrides``: the profile's trait values) as ``snapshot``
        has them: free and in all, and why they cannot be had now."""
        raise NotImplementedError

    def limits_of(self, overrides: dict) -> tuple:
        """(memory, CPUs) the backend enforces for a profile, as
        :func:`hub_ext.common.limits.limits_text` reads them (None: no limit)."""
        raise NotImplementedError

    async def image_facts(self, image: str) -> dict:
        """What ``image`` holds ({"python", "framework", "framework_version", "cuda",
        "description"}: :func:`hub_ext.spawn.page.facts_from_labels`); ``{}`` when
        unknown."""
        raise NotImplementedError

    @classmethod
    async def availability(cls, config, log) -> dict:
        """The counts over every GPU of the backend, for ``GET
        /hub/api/gpuhub/availability`` (:mod:`hub_ext.ops.handlers`; a class method: asked
        with the hub's ``config`` and no spawner): ``inventory``, ``total``, ``free``,
        ``allocated``, ``outside``, ``unhealthy``, ``error``."""
        raise NotImplementedError

    @classmethod
    async def gpu_board(cls, handler) -> dict:
        """The GPU board's model for admins (:mod:`hub_ext.ops.board`; ``handler``: the
        board's request handler)."""
        raise NotImplementedError

    @classmethod
    async def held_gpus(cls, handler, user, servers: list[str]) -> list[dict]:
        """The GPUs ``user``'s servers named in ``servers`` hold now, for ``GET
        /hub/api/gpuhub/gpus/mine`` (:mod:`hub_ext.ops.my_gpus`, which says who may ask):
        one row per GPU, ``{"uuid", "name", "held_by": <server name>,
        "utilization_pct", "memory_used_mib", "memory_total_mib", "simulated"}``
        (percent, MiB; None where the backend cannot say).  Never a GPU another server
        holds; never raises for an unreadable inventory (the rows lose their figures)."""
        raise NotImplementedError

    @classmethod
    async def reservation_changed(cls, handler, spec, reservation_id: int) -> None:
        """Optional: a hub reservation was made or changed (``spec``, a
        :class:`hub_ext.reservations.rules.Spec`) or is being deleted (None), before the
        change is kept.  A backend that holds reservations itself (Slurm) raises
        :class:`hub_ext.reservations.backend.BackendRefused` or ``BackendUnavailable``;
        by default nothing (the hub enforces them)."""

    def goes_first(self, gpus: GPUsNow) -> bool:
        """Optional: whether this member passes those waiting in line for ``gpus`` (a
        reservation's window of their group is open), so the card is not disabled for the
        others' places.  Default: False."""
        return False

    def runs_until(self, gpus: GPUsNow) -> str:
        """Optional: how long a start of ``gpus`` may run before a reservation of a group
        the member is not in may stop it ("1 GPU is reserved for ML101 from 14:00 UTC to
        16:00 UTC: a server started now may run until then (about 40 min)."), or ``""``.
        Default: ``""``."""
        return ""

    async def check_spawn(self, options: dict | None) -> None:
        """Optional: refuse now, with the ``tornado.web.HTTPError`` that
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
        """Optional, needed for notebook jobs and GPU kernels (a backend whose
        :attr:`runs_workloads` names them; :mod:`hub_ext.jobs`, :mod:`hub_ext.kernels`):
        the member's workspace as a folder on the hub's machine, and the uid and gid that
        own what the hub writes there.  Raises ``tornado.web.HTTPError`` (404: the member
        has no workspace yet)."""
        raise NotImplementedError

    # -- a hub restart -------------------------------------------------------------------

    def saved_state(self) -> dict:
        """Optional: the backend's part of spawner state (kept under ``gpuhub``).
        Default: nothing."""
        return {}

    def adopt(self, saved: dict) -> None:
        """Optional: the hub restarted; take back what :meth:`saved_state` named (``{}``
        when nothing).  Default: nothing."""
