"""A GPU kernel's life in the hub: created, waiting in the line, running, ended, settled.

A GPU kernel is a JupyterHub named server of its member, ``kernel-<12 hex>``, that the hub
starts itself with ``User.spawn(server_name, options)``, as :mod:`hub_ext.jobs.lifecycle`
starts a notebook job (docs: explanation/gpu-kernels).  So it goes through the same start
as any server: the profile, the hooks (credits: 402), the line (it always waits:
``user_options["kernel"]`` asks to, :mod:`hub_ext.spawn.choice`), the pool's exclusive
GPUs, the debit, the meter, the run record.  Its container runs ``gpuhub-kernel``
(images/base) instead of JupyterLab, reached by the member's server over ipc sockets in a
folder of her workspace.

- :func:`create`: the checks of :mod:`.checks`, the per-member limit, then the spawner's
  own early refusal (``check_spawn``: the profile, the credits hook's 402, the hub's server
  limits, the per-member GPU limit); only then the kernel is stored and launched.  A
  refusal leaves nothing: no row, no server, no debit.
- :func:`launch`: ``User.spawn`` as a task; when it returns the kernel is running; when it
  fails before running the kernel ends here (``failed``, or the reason it was stopped
  for), the only end that :mod:`.hook` does not decide.
- :func:`stop`: a waiting kernel leaves the line; a running one's server is stopped (the
  GPU goes back to the line's head in the same step, the unused interval refunded).
- :class:`Kernels`: the settings (``c.Kernels.*``) and the keeper, a pass every
  ``c.Kernels.check_interval`` seconds: the kernels whose member's server (its *parent*)
  stopped, was culled or is gone; the GPU kernels' own idle time-out; kernels whose
  container ended; waiting kernels to launch (after a hub restart, or behind the member's
  other kernel of the same profile: the line holds one place per member and profile);
  ended kernels forgotten after ``c.Kernels.keep_ended``.  While someone waits in line for
  the kind of GPU a kernel holds, the shorter ``c.Kernels.contended_idle_timeout`` applies
  to it too (:func:`waiting_for`): an idle kernel then yields its GPU to the line's head.
  It runs from the hub's start (:func:`keep_from_start`).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from jupyterhub import orm
from jupyterhub.slugs import is_valid_display_name, normalise_unicode
from jupyterhub.utils import utcnow as hub_utcnow
from tornado import web
from traitlets import Float, Int
from traitlets.config import SingletonConfigurable

from ..common import metrics
from ..common.clock import now
from ..common.periodic import after_start, ensure_task, every
from ..common.server_key import ServerKey
from ..culling.rules import duration
from ..culling.watched import held_devices
from ..jobs.lifecycle import forget, the_line
from ..spawn.choice import json_size
from ..spawn.profiles import gpu_request
from ..spawn.stopping import stop_server
from . import store
from .checks import KernelRefused, check_connection_dir, kernel_profile, read_request
from .workload import GPUKernel

__all__ = [
    "Kernels",
    "create",
    "kernel_options",
    "keep_from_start",
    "kernels_of",
    "launch",
    "stop",
    "waiting_for",
]

#: what the member reads when a kernel ends, by reason (a stop of the hub's own)
WORDS = {
    "shutdown": "You shut the GPU kernel down.",
    "parent_gone": (
        "The GPU kernel stopped because the server it ran for stopped; start it again "
        "from your notebook."
    ),
    "left": "The GPU kernel was shut down while it waited for a GPU.",
}
#: the end reason of a kernel idle past ``c.Kernels.contended_idle_timeout`` while others
#: waited for its GPU (also its run record's stop reason, hub_ext.common.runs)
CONTENDED = "idle_contended"


class Kernels(SingletonConfigurable):
    """The GPU kernels' settings and their keeper (one per hub process)."""

    per_user = Int(
        4,
        min=0,
        config=True,
        help="""GPU kernels one member may have waiting or running (0: no limit);
        GPUHUB_KERNELS_PER_USER.

            c.Kernels.per_user = 4
        """,
    )
    idle_timeout = Float(
        900.0,
        min=0.0,
        config=True,
        help="""Seconds a GPU kernel may go without running a cell (its last activity,
        reported by gpuhub-kernel while a cell runs, or its GPUs busy) before the hub
        shuts it down and gives its GPU back; 0 never.  Shorter than a server's idle
        time-out: a kernel holds a GPU.  GPUHUB_KERNEL_IDLE_TIMEOUT.

            c.Kernels.idle_timeout = 900
        """,
    )
    contended_idle_timeout = Float(
        300.0,
        min=0.0,
        config=True,
        help="""Seconds a GPU kernel may go without running a cell while another start
        waits in line for the kind of GPU it holds (whole GPUs, or its MIG slice; the
        same pool) before the hub shuts it down and its GPU goes to the line's head; 0
        off.  Kernels idle with nobody waiting keep ``idle_timeout``.  Takes effect only
        when shorter than ``idle_timeout``.  GPUHUB_KERNEL_CONTENDED_IDLE_TIMEOUT.

            c.Kernels.contended_idle_timeout = 300
        """,
    )
    keep_ended = Float(
        3600.0,
        min=0.0,
        config=True,
        help="""Seconds an ended kernel is kept, with its reason, for the member's server
        to read (``GET /hub/api/gpuhub/kernels/<id>``); then forgotten.

            c.Kernels.keep_ended = 3600
        """,
    )
    check_interval = Float(
        5.0,
        min=0.05,
        config=True,
        help="""Seconds between the keeper's passes (parents gone, idle kernels,
        containers ended, waiting kernels to start).

            c.Kernels.check_interval = 5
        """,
    )

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        #: kernel id -> the task watching its start
        self.starting: dict[str, asyncio.Task] = {}
        #: kernel id -> (reason, message) of a stop the hub asked for, read by its end
        self.ending: dict[str, tuple[str, str]] = {}
        #: ids of kernels being created (stored, still checked): not the keeper's yet
        self.creating: set[str] = set()
        self.users = None
        self._keeper = None

    def ensure_keeper(self, users) -> None:
        """Start the keeper once per hub process; ``users``: JupyterHub's ``UserDict``.
        Needs a running event loop."""
        if users is not None:
            self.users = users
        if self.users is None:
            return
        self._keeper = ensure_task(
            self._keeper,
            lambda: every(lambda: self.check_interval, self.check_once, self.log, "Kernels pass"),
        )

    @property
    def keeping(self) -> bool:
        """Whether the keeper runs (the hub has started)."""
        return self._keeper is not None and not self._keeper.done()

    def user(self, name: str):
        """JupyterHub's ``User`` of ``name``, or None."""
        orm_user = orm.User.find(self.users.db, name)
        return self.users[orm_user] if orm_user is not None else None

    async def check_once(self) -> None:
        """One pass of the keeper (see the module doc)."""
        db = self.users.db
        for user_name, server_name in store.forget_ended(db, now() - self.keep_ended):
            user = self.user(user_name)
            if user is not None:
                forget(user, server_name)
        line = the_line(db)
        rows = store.load(db, states=store.LIVE)
        for state in store.LIVE:
            metrics.GPU_KERNELS.labels(state=state).set(sum(r.state == state for r in rows))
        for row in rows:
            try:
                await self._check(db, line, row)
            except Exception:
                self.log.exception(
                    "GPU kernel %s of %s: the keeper's check failed", row.id, row.user
                )

    async def _check(self, db, line, row) -> None:
        if row.id in self.creating:
            return
        user = self.user(row.user)
        if user is None:
            end(db, row, "failed", "Its member was deleted.")
            return
        task = self.starting.get(row.id)
        if not await parent_alive(user, row.parent):
            await stop(user, row, "parent_gone", WORDS["parent_gone"])
            return
        if task is not None and not task.done():
            return
        spawner = spawner_of(user, row.server_name)
        key = ServerKey(row.user, row.server_name)
        if row.state == "waiting":
            if spawner is not None and spawner.ready:
                mark_running(db, row, spawner)
            elif key in line.places or (spawner is not None and spawner.active):
                return  # in line (kept through a restart: the line starts it) or starting
            elif not held_back(user, row, line):
                self.log.info("GPU kernel %s of %s: starting its server", row.id, row.user)
                launch(user, row)
        elif spawner is None or not spawner.active:
            await ended_unseen(user, row, spawner)
        elif spawner.ready and await spawner.poll() is not None:
            await stop_kernel_server(user, row.server_name)
        else:
            await self._check_idle(user, row, spawner, line)

    async def _check_idle(self, user, row, spawner, line) -> None:
        """End a running kernel idle past ``idle_timeout``, or past
        ``contended_idle_timeout`` while others wait for its kind of GPU."""
        idle = idle_seconds(spawner, row)
        if self.idle_timeout and idle > self.idle_timeout:
            await stop(
                user,
                row,
                "idle",
                f"The GPU kernel ran no cell for {duration(self.idle_timeout)}, the GPU "
                "kernels' idle time-out: its GPU went back to the pool. Start it again to "
                "go on.",
            )
            return
        if not self.contended_idle_timeout or idle <= self.contended_idle_timeout:
            return
        waiting = await waiting_for(user, row, line)
        if not waiting:
            return
        members = f"{waiting} member{'' if waiting == 1 else 's'}"
        self.log.info(
            "GPU kernel %s of %s idle for %.0f s while %s waited: yielding its GPU(s) %s",
            row.id,
            row.user,
            idle,
            members,
            ",".join(row.gpus) or "-",
        )
        await stop(
            user,
            row,
            CONTENDED,
            f"The GPU kernel ran no cell for {duration(self.contended_idle_timeout)} while "
            f"{members} waited for a GPU: its GPU went to the next in line. Start it again "
            "to go on (it waits in line if no GPU is free).",
        )


async def waiting_for(user, row, line) -> int:
    """How many members wait in ``line`` for the kind of GPU that ``row``'s kernel holds
    (its profile's: whole GPUs, or its MIG slice); the line is one per hub, on Docker
    this host's pool."""
    if not line.places:
        return 0
    _, everything = await user.spawner.get_profiles()
    profile = next((p for p in everything if p.get("slug") == row.profile), {})
    _, mig = gpu_request(profile.get("gpus", 0))
    units = mig or "gpu"
    return len({p.key[0] for p in list(line.places.values()) if p.units == units})


def spawner_of(user, name: str):
    """JupyterHub's spawner of ``user``'s server ``name``, or None when she has none."""
    return user.spawners[name] if name in user.orm_spawners else None


def idle_seconds(spawner, row) -> float:
    """Seconds since the kernel last had activity (its server's, in JupyterHub's clock:
    a cell run, its GPUs busy), or since it started running (a wait in line is no
    idleness)."""
    since = datetime.fromtimestamp(row.started or now(), UTC).replace(tzinfo=None)
    last = spawner.orm_spawner.last_activity
    if last is not None and last > since:
        since = last
    return max(0.0, (hub_utcnow(with_tz=False) - since).total_seconds())


async def parent_alive(user, parent: str) -> bool:
    """Whether the member's server ``parent`` (a kernel's) still runs: JupyterHub has it
    active and, once it is ready, its backend's ``poll()`` says it runs (a container
    killed under it is seen at once, not at JupyterHub's next poll)."""
    if parent not in user.orm_spawners:
        return False
    spawner = user.spawners[parent]
    if not spawner.active:
        return False
    if spawner.pending or not spawner.ready:
        return True
    return await spawner.poll() is None


def held_back(user, row, line) -> bool:
    """Whether ``row`` waits behind its member's other kernel of the same profile that is
    in line, granted or starting: the line keeps one place per member and profile, so
    this one starts after that one has its GPU."""
    for other in store.load(user.db, row.user, ("waiting",)):
        if other.id == row.id or other.profile != row.profile:
            continue
        key = ServerKey(other.user, other.server_name)
        if key in line.places or key in line.granted:
            return True
        spawner = spawner_of(user, other.server_name)
        if spawner is not None and spawner.pending == "spawn":
            return True
        task = Kernels.instance().starting.get(other.id)
        if task is not None and not task.done():
            return True
    return False


def keep_from_start(app) -> None:
    """Make the JupyterHub application ``app`` start the kernels' keeper when it starts
    (as :func:`hub_ext.jobs.lifecycle.keep_from_start` does for jobs), so that a
    restarted hub ends the kernels whose server is gone and starts those that waited,
    before any request about kernels.  Wrapping twice is a no-op."""
    after_start(
        app, "keeps_kernels", lambda: Kernels.instance(config=app.config).ensure_keeper(app.users)
    )


def kernels_of(settings) -> Kernels:
    """The hub's :class:`Kernels`, configured from the hub's config (tornado ``settings``)."""
    kernels = Kernels.instance(config=settings.get("config"))
    kernels.ensure_keeper(settings.get("users"))
    return kernels


def kernel_options(row) -> dict:
    """The ``user_options`` of a kernel's server, built from its row only (the kernels
    hook refuses a start of a ``kernel-*`` server with any other options)."""
    return {
        "profile": row.profile,
        "wait": True,
        "kernel": {
            "id": row.id,
            "parent": row.parent,
            "notebook": row.notebook,
            "cwd": row.cwd,
            "connection_dir": row.connection_dir,
        },
    }


def display_name(notebook: str) -> str:
    """The kernel's server as the member's home page and the admin panel list it: "GPU
    kernel: <notebook>", within JupyterHub's rules for a display name."""
    words = " ".join(normalise_unicode(notebook).split())[:200]
    name = f"GPU kernel: {words}" if words else "GPU kernel"
    return name if is_valid_display_name(name) else "GPU kernel"


# -- create ------------------------------------------------------------------------------


async def create(kernels: Kernels, user, body, parent: str) -> store.KernelRow:
    """Check and create a GPU kernel of ``user`` for her server ``parent`` from a request
    body; returns its row (waiting, its start launched).  Raises :class:`KernelRefused`
    (400, 402, 403, 404, 409, 413, 429, 501, 503) having left nothing behind."""
    request = read_request(body, user.name, parent)
    db = user.db
    live = store.count_live(db, user.name)
    if kernels.per_user and live >= kernels.per_user:
        raise KernelRefused(
            409,
            f"You have {live} GPU kernels waiting or running; each member may have "
            f"{kernels.per_user}. Shut one down first.",
        )
    if not user.spawner.runs(GPUKernel):
        raise KernelRefused(501, GPUKernel.not_run())
    visible, everything = await user.spawner.get_profiles()
    profile = kernel_profile(visible, everything, request.profile)
    kernel_id = store.new_id()
    server_name = store.server_name_of(kernel_id)
    spawner = user.get_or_create_spawner(server_name, display_name(request.notebook))
    row = None
    kernels.creating.add(kernel_id)
    try:
        workspace, uid, _ = await spawner.job_workspace()
        check_connection_dir(workspace, request.connection_dir, uid)
        row = store.insert(
            db,
            id=kernel_id,
            user=user.name,
            profile=profile["slug"],
            server_name=server_name,
            parent=parent,
            notebook=request.notebook,
            cwd=request.cwd,
            connection_dir=request.connection_dir,
        )
        options = kernel_options(row)
        size = json_size(options)
        if size > spawner.user_options_max_bytes:  # load_profile's 413, in a kernel's words
            raise KernelRefused(
                413,
                f"The kernel's paths come to {size} bytes; a GPU kernel takes at most "
                f"{spawner.user_options_max_bytes}. Use shorter paths.",
            )
        # the start's own checks, before anything is reserved: the profile as the
        # spawner loads it, the hooks (credits: 402), the hub's limits and the GPUs
        spawner.user_options = options
        await spawner.check_spawn(options)
    except web.HTTPError as e:
        forget(user, server_name, None)
        if row is not None:
            store.delete(db, row)
        raise KernelRefused(e.status_code, e.log_message or e.reason or "Refused.") from None
    except BaseException:
        forget(user, server_name, None)
        if row is not None:
            store.delete(db, row)
        raise
    finally:
        kernels.creating.discard(kernel_id)
    kernels.log.info(
        "%s created GPU kernel %s (%s, profile %s) for %s in server %r",
        user.name,
        row.id,
        server_name,
        row.profile,
        row.notebook or "a notebook",
        parent,
    )
    if not held_back(user, row, the_line(db)):
        launch(user, row)
    return row


# -- start --------------------------------------------------------------------------------


def launch(user, row) -> asyncio.Task:
    """Start the kernel's server in the background (``User.spawn``, as JupyterHub's
    ``spawn_single_user`` does, without a proxy route: the member's server reaches the
    kernel through its workspace on Docker, through the hub's relay on Slurm)."""
    kernels = Kernels.instance()
    name, kernel_id = row.server_name, row.id
    spawner = user.get_or_create_spawner(name, display_name(row.notebook), replace_failed=True)
    spawner._spawn_pending = True

    async def spawn():
        try:
            await user.spawn(name, options=kernel_options(row))
        finally:
            spawner._spawn_pending = False

    start = asyncio.ensure_future(spawn())
    spawner._spawn_future = start
    task = asyncio.ensure_future(_watch(user, kernel_id, name, start))
    kernels.starting[kernel_id] = task
    return task


def mark_running(db, row, spawner) -> None:
    """A waiting kernel's server started: running since now, on its GPUs."""
    if store.set_running(db, row, held_devices(spawner)):
        Kernels.instance().log.info(
            "GPU kernel %s of %s runs (%s, GPU(s) %s)",
            row.id,
            row.user,
            row.server_name,
            ",".join(row.gpus) or "none",
        )


def end(db, row, reason: str, message: str) -> bool:
    """End ``row`` once (:func:`store.finish`), counted by reason; returns whether this
    call ended it."""
    done = store.finish(db, row, reason, message)
    if done:
        metrics.GPU_KERNELS_ENDED.labels(reason=reason).inc()
        Kernels.instance().log.info(
            "GPU kernel %s of %s ended (%s): %s", row.id, row.user, reason, message
        )
    return done


async def _watch(user, kernel_id: str, name: str, start: asyncio.Future) -> None:
    kernels = Kernels.instance()
    db = user.db
    try:
        await start
    except Exception as e:  # noqa: BLE001 - every failed start ends the kernel
        why = getattr(e, "jupyterhub_message", None) or getattr(e, "log_message", None) or str(e)
        row = store.get(db, kernel_id)
        if row is not None and row.state == "waiting":
            reason, message = kernels.ending.pop(
                kernel_id, ("failed", f"It could not start: {why}")
            )
            end(db, row, reason, message)
        forget(user, name)
        return
    finally:
        kernels.starting.pop(kernel_id, None)
    spawner = user.spawners[name]
    spawner._spawn_future = None
    spawner.add_poll_callback(stop_kernel_server, user, name)
    row = store.get(db, kernel_id)
    if row is None:
        return
    mark_running(db, row, spawner)
    if kernel_id in kernels.ending:  # stopped while it was starting
        await stop_kernel_server(user, name)


async def stop_kernel_server(user, name: str) -> None:
    """Stop a kernel's server (its stop hooks end the kernel: :mod:`.hook`) and forget
    it.  Also JupyterHub's poll callback when the kernel's container ended."""
    spawner = spawner_of(user, name)
    if spawner is not None and spawner.active:
        if spawner.pending == "stop":
            return
        row = store.by_server(user.db, user.name, name)
        ending = Kernels.instance().ending.get(row.id) if row is not None else None
        # the run record's reason (hub_ext.common.runs.STOP_REASONS)
        kept = ("idle", CONTENDED, "parent_gone")
        reason = ending[0] if ending and ending[0] in kept else "stopped"
        try:
            await stop_server(spawner, reason)
        except Exception:
            Kernels.instance().log.exception("The server of GPU kernel %s did not stop", name)
            return
    row = store.by_server(user.db, user.name, name)
    if row is not None and row.state in store.LIVE:
        await ended_unseen(user, row, spawner)
    forget(user, name)


async def ended_unseen(user, row, spawner) -> None:
    """The kernel's server is gone and no stop hook ended the kernel (a hub that was down
    when it ended): end it, once, with what is known."""
    from .hook import ending_words

    reason, message = Kernels.instance().ending.pop(row.id, None) or ending_words(spawner)
    end(user.db, row, reason, message)
    forget(user, row.server_name)


# -- stop ---------------------------------------------------------------------------------


async def stop(user, row, reason: str, message: str) -> None:
    """End a kernel now: a waiting one leaves the line (or its start is given up), a
    running one's server stops (the GPU goes back to the line's head in the same step);
    ``reason`` and ``message`` are what the member's server reads.  An ended kernel is
    left as it is; a second call changes nothing."""
    db = user.db
    if row.state not in store.LIVE:
        return
    kernels = Kernels.instance()
    kernels.ending.setdefault(row.id, (reason, message))
    line = the_line(db)
    key = ServerKey(user.name, row.server_name)
    task = kernels.starting.get(row.id)
    spawner = spawner_of(user, row.server_name)
    if key in line.places:
        line.remove(key, "left", message)  # the waiting start ends; _watch ends the kernel
    elif task is not None and not task.done():
        return  # the start ends first; _watch then stops the server
    elif spawner is not None and spawner.active:
        await stop_kernel_server(user, row.server_name)
    else:
        kernels.ending.pop(row.id, None)
        end(db, row, reason, message)
        forget(user, row.server_name)


def stop_children(user, parent: str) -> None:
    """The member's server ``parent`` stopped: end its GPU kernels, in the background.
    Before the keeper runs (a hub starting up finds the server gone), the keeper's first
    pass does it instead."""
    kernels = Kernels.instance()
    if not kernels.keeping:
        return
    for row in store.load(user.db, user.name, store.LIVE, parent=parent):
        asyncio.ensure_future(stop(user, row, "parent_gone", WORDS["parent_gone"]))


def iso(seconds: float | None) -> str | None:
    """Seconds since the epoch as ISO 8601 UTC, to the second; None stays None."""
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")
