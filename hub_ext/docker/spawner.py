"""GPUDockerSpawner: DockerSpawner with profiles and exclusive GPUs from the pool.

A start runs in this order (each step yields a ``progress()`` event):

1. load the profile from ``user_options`` (untrusted: a bad one is HTTP 400 naming the
   valid choices, an oversized one HTTP 413; :mod:`hub_ext.spawn.choice`) and apply its
   overrides;
2. ask the hooks whether the start may go on at all (:meth:`GPUDockerSpawner.check_hooks`:
   the credits hook refuses a balance below the first interval with HTTP 402), before
   anything is reserved or any place in the line taken;
3. reserve the profile's GPUs from :class:`hub_ext.docker.pool.GPUPool`: refused at once with
   HTTP 409 and a sentence a member understands when none is free, or, when the member
   asked to wait (``user_options["wait"]``), a wait in line for them
   (:mod:`hub_ext.docker.spawner_line`, :mod:`hub_ext.line`);
4. run the pre-start hooks (:attr:`GPUDockerSpawner.before_container_hooks`, e.g. the
   credits debit), each with an undo for a failed start;
5. create and start the container with a Docker ``DeviceRequest`` for exactly the
   reserved device UUIDs and labels that name the owner and the devices;
6. wait for the server to answer, polling briskly so that the hub's own exponential
   back-off (JupyterHub ``wait_for_http_server``) finds it up at its first try.

If any step after 3 fails or the start is cancelled, everything taken is given back:
the container is removed, the undo hooks run, the GPUs return to the pool.  ``stop()``
and ``clear_state()`` release too, idempotently: JupyterHub calls ``stop()`` after a
failed start and may call it twice (JupyterHub docs, "Spawners").

The allocation lives in spawner state (versioned) and in container labels, so a hub
restart rebuilds it (:mod:`hub_ext.docker.reconcile`).

What every backend shares (the member's choice of profile, the pre-start hooks and their
undo, progress events, hook state, and their traits: ``credits_per_hour``, the culling
timeouts, ``before_container_hooks``) is :class:`hub_ext.spawn.core.SpawnerCore`, mixed
in; ``c.SpawnerCore.<trait>`` sets them for both backends, ``c.GPUDockerSpawner.<trait>``
for this one alone (the hub's own settings: :mod:`hub_ext.docker.hubconfig`).

Four parts live in modules of their own, mixed into the class (their traits are set as
``c.GPUDockerSpawner.<trait>`` all the same): the member's choice (:mod:`hub_ext.spawn.choice`:
the profile list, ``user_options`` validated and kept small, the form's fields), the
container a member lives in (:mod:`hub_ext.docker.container`: workspace, datasets, uid, limits,
labels, the device request), the spawn page (:mod:`hub_ext.spawn.page`: the profile
cards, fed from the pool by :mod:`hub_ext.docker.availability`) and the reservation of the
GPUs, at once or after a wait in line (:mod:`hub_ext.docker.spawner_line`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time

from docker.errors import APIError, ImageNotFound, NotFound
from dockerspawner import DockerSpawner
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import (
    Bool,
    Float,
    Int,
    Unicode,
    Union,
    default,
)

from ..common.notices import notices
from ..spawn.core import STATE_VERSION, SpawnerCore
from ..spawn.profiles import LABEL_PREFIX, gpu_request
from ..spawn.stopping import exit_words
from .availability import PoolAvailability
from .container import MemberContainer
from .inventory import InventoryError
from .pool import GPUPool
from .readiness import port_open
from .reconcile import ensure_reconciler
from .server_limits import ServerLimits
from .spawner_line import TOPIC as LINE_TOPIC
from .spawner_line import LineSpawner


class GPUDockerSpawner(
    LineSpawner, ServerLimits, PoolAvailability, MemberContainer, SpawnerCore, DockerSpawner
):
    """A DockerSpawner that gives each server exclusive GPUs and a chosen profile."""

    gpus = Union(
        [Int(), Unicode()],
        default_value=0,
        config=True,
        help="""GPUs per server: a count of whole GPUs, or a MIG slice profile such as
        "1g.5gb" for one MIG device.  Usually set per profile.

            c.GPUDockerSpawner.gpus = 1
        """,
    )

    host_network = Bool(
        False,
        config=True,
        help="""Run servers on the host's network, on 127.0.0.1 and a free port each.
        The default is a Docker bridge network (network_name).

            c.GPUDockerSpawner.host_network = True
        """,
    )

    hub_id = Unicode(
        "gpuhub",
        config=True,
        help="""Names this hub in container labels, so that reconciliation only looks at
        its own containers when several hubs share one Docker engine.

            c.GPUDockerSpawner.hub_id = "lab-hub"
        """,
    )

    ready_poll_interval = Float(
        0.01,
        config=True,
        help="""Seconds between checks whether a starting server's port takes connections
        (a TCP connect, refused at once while nothing listens: cheap for the hub, so it
        can be short); once it does, one HTTP request, which the server answers as soon as
        its event loop runs.

            c.GPUDockerSpawner.ready_poll_interval = 0.01
        """,
    )

    #: Seconds between asking Docker whether a starting server's container still runs.
    _exit_check_interval = 0.5

    runs_gpu_kernels = True  # hub_ext.kernels: a container of its own, ipc in the workspace

    # Traits a profile may override; restored to their configured values at each start,
    # so one start's profile never leaks into the next.
    _overridable = (
        "image",
        "mem_limit",
        "cpu_limit",
        "environment",
        "volumes",
        "extra_host_config",
        "extra_create_kwargs",
        "gpus",
        "credits_per_hour",
        "cmd",
        "default_url",
        "pids_limit",
        "shm_size",
        "gpu_idle_timeout",
        "cull_idle_timeout",
        "cull_max_age",
    )

    @default("name_template")
    def _default_name_template(self):
        return "{prefix}-{username}--{servername}" if self.name else "{prefix}-{username}"

    @default("remove")
    def _default_remove(self):
        return True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # one pool per hub process, configured by c.GPUPool.*
        self.pool = GPUPool.instance(config=self.config)
        self.allocation = None
        self.init_core()
        self.profile_name = ""
        self._start_timeout = self.start_timeout  # configured; a wait in line adds to it
        self._container_may_live = False  # a failed stop left the container behind
        self._labels_read = False  # poll() looked at the container's labels
        self.stop_reason = self.stop_detail = None  # why the server ended (poll)
        self._job_end_seen = False  # a job's end was seen by poll (_job_ended)
        ensure_reconciler(self.pool, lambda: self.client, self.hub_id)
        if self.db_session() is not None:
            self.line()  # the places kept from before a restart count from the start

    # -- progress ----------------------------------------------------------------------

    # -- start / stop ------------------------------------------------------------------

    async def start(self):
        """Start the server (the steps in the module doc); returns ``(ip, port)``.

        Raises ``tornado.web.HTTPError`` with a sentence for the member; its
        ``jupyterhub_message`` is that sentence, which the progress page shows when the
        refusal comes after the spawn page moved on (JupyterHub ``format_exception``).
        """
        try:
            return await self._start()
        except web.HTTPError as e:
            self.tell_member(e)
            raise
        finally:
            # check_spawn's claim is spent: the GPUs are held (or the place in line
            # taken), or the start failed and holds nothing
            self.gpu_claim = None

    @contextlib.asynccontextmanager
    async def checked_spawn(self, options: dict | None):
        """:meth:`check_spawn`, then the block in which the spawn gate hands the admitted
        start to JupyterHub (``spawn_single_user``); its GPU claim counts meanwhile, as
        it does while the spawn is pending.  Raises what :meth:`check_spawn` raises."""
        await self.check_spawn(options)
        self.handing_over = True
        try:
            yield
        finally:
            self.handing_over = False

    async def check_spawn(self, options: dict | None) -> None:
        """Refuse now a start that :meth:`start` would refuse before reserving anything:
        the profile (400, 413), the hooks (402: the balance), the hub's server limits (429)
        and the GPUs (409: none free, or members already in line, and no wait asked).

        Asked by :mod:`hub_ext.spawn.gate` before JupyterHub's ``User.spawn`` creates the
        server's API token, OAuth client and database rows, which a refused start would
        only delete again.  ``options``: the request's ``user_options`` (None: the stored
        ones, as ``User.spawn`` reads them).  Advisory: :meth:`start` checks all of it
        again and the pool's reservation stays the authority.  Raises
        ``tornado.web.HTTPError`` with the same words and status as :meth:`start`.
        """
        self.gpu_claim = None
        if options is None:
            options = getattr(self.orm_spawner, "user_options", None) or {}
        self.user_options = options
        try:
            await self.load_profile()
            await self.check_hooks()
            count, mig = gpu_request(self.gpus)
            devices = None
            if count:
                try:
                    devices = await self.pool.devices()
                except InventoryError:
                    pass  # start() refuses with the pool's words
            # from here on nothing yields: the claim below counts before the next check
            self.check_start_limits()
            if devices is not None:
                self.check_gpus_now(devices, count, mig, self._units_text(count, mig))
        except web.HTTPError as e:
            self.tell_member(e)
            raise

    @staticmethod
    def _units_text(count: int, mig: str | None) -> str:
        unit = f"{mig} GPU slice" if mig else "GPU"
        return f"{count} {unit}{'s' if count > 1 else ''}"

    async def _start(self):
        self._events = []
        self._job_end_seen = False
        self._labels_read = True  # this start writes state and labels alike
        await self.load_profile()
        container = await self.container_settings()
        await self.check_hooks()
        self.check_start_limits()
        count, mig = gpu_request(self.gpus)
        self.allocation = None
        self.line_wait = None
        waited = False
        try:  # a granted place is forgotten however the start ends (cancelled included)
            if count:
                what = self._units_text(count, mig)
                waited = await self.reserve_gpus(count, mig, what)
                self.log.info(
                    "%s holds GPU(s) %s%s",
                    self._log_name,
                    ",".join(self.allocation.uuids),
                    " after a wait in line" * waited,
                )
                if not waited:
                    self.emit(
                        20, f"Reserved {what} for you alone: {', '.join(self.allocation.uuids)}"
                    )
                self.tell_next_window(mig)
            async with self.timed_rest(waited):
                return await self._start_container(container)
        finally:
            if count:
                self.line().forget(self.server_key)  # only a granted place; idempotent

    async def _start_container(self, container):
        """Steps 3 to 5, with the GPUs reserved; undone on failure."""
        done_hooks = []
        try:
            done_hooks = await self.run_start_hooks()
            await self._prepare_workspace(container)
            self._prepare_container(container)
            self.emit(50, f"Starting container {self.object_name} from {self.image}")
            try:
                ip, port = await super().start()
            except ImageNotFound as e:
                raise web.HTTPError(
                    500,
                    f"The image {self.image} of this profile is not on this node. "
                    "Ask an admin to build it.",
                ) from e
            self.emit(80, "Waiting for JupyterLab to answer")
            if await self._wait_until_ready(ip, port):
                self.emit(95, "Server is up")
            else:
                self.emit(90, "JupyterLab is slow to answer; still waiting")
            if self.allocation is not None:
                self.allocation.starting = False
            return ip, port
        except BaseException:
            await asyncio.shield(self._abandon_start(done_hooks))
            raise

    async def _abandon_start(self, done_hooks) -> None:
        """Undo a failed or cancelled start: container, hooks, GPUs.  Never raises."""
        try:
            obj = await self.get_object()
            if obj is not None:
                if not obj["State"]["Running"]:
                    self.log.error(
                        "Last lines of %s's container: %s",
                        self._log_name,
                        await self._container_logs(),
                    )
                await self.docker("remove_container", obj["Id"], force=True)
            self.object_id = ""
        except Exception:
            self.log.exception("Could not remove the container of failed %s", self._log_name)
        await self.undo_start_hooks(done_hooks)
        self.release_gpus("start failed")

    async def get_ip_and_port(self):
        if self.host_network:
            return self.ip, self.port
        return await super().get_ip_and_port()

    async def get_url(self):
        """Where this server's container really serves (JupyterHub ``Spawner.get_url``).

        JupyterHub asks after a restart, for a server whose ``poll()`` says it runs
        (``init_spawners``).  A hub killed while the server was starting left in its
        database the address of a server that never got one (the hub's host name and a
        random port), so the container is asked: with host networking, ``ip`` and the
        port in its labels; on a bridge network, its address (DockerSpawner
        ``get_ip_and_port``).  Falls back to the database's URL when Docker cannot say;
        never raises (JupyterHub does not catch errors here).
        """
        try:
            if self.host_network:
                obj = await self.get_object()
                labels = (obj or {}).get("Config", {}).get("Labels") or {}
                self.port = int(labels[LABEL_PREFIX + "port"])
            ip, port = await self.get_ip_and_port()
        except Exception as e:  # noqa: BLE001 - an old container without the label, or Docker
            self.log.warning(
                "%s: where its container serves is unknown (%r); trying %s",
                self._log_name,
                e,
                self.server.url,
            )
            return self.server.url
        return f"{self.server.proto}://{ip}:{port}{self.server.base_url}"

    async def _wait_until_ready(self, ip, port) -> bool:
        """Wait until the server answers HTTP at all, or its container dies, for at most
        ``http_timeout`` seconds.  Returns False when it has not answered by then
        (JupyterHub's own wait, ``Spawner.http_timeout``, then decides).

        First the port, with a TCP connect every ``ready_poll_interval`` seconds: while
        nothing listens the kernel refuses at once, so the checks can be frequent without
        taking CPU from the starting server.  Once the port takes connections (Jupyter
        Server binds it at the first turn of its event loop, ``ServerApp.init_httpserver``),
        one HTTP request to ``/api``; a failed one (reset, time-out) goes back to the port
        checks.  So the server is found up within about ``ready_poll_interval`` of
        binding, and JupyterHub's own first check (``Server.wait_up``) then succeeds at
        once.

        Fails fast with HTTP 500 and the container's last log lines when it exits (asked of
        Docker every ``_exit_check_interval`` seconds).
        """
        url = f"http://{ip}:{port}{self.server.base_url if self.server else '/'}api"
        client = AsyncHTTPClient()
        deadline = time.monotonic() + self.http_timeout
        next_exit_check = time.monotonic() + self._exit_check_interval
        while time.monotonic() < deadline:
            if await port_open(ip, port):
                try:
                    await client.fetch(
                        url, request_timeout=2, follow_redirects=False, raise_error=False
                    )
                    return True
                except (ConnectionError, OSError, HTTPClientError):
                    pass
            if time.monotonic() >= next_exit_check:
                next_exit_check = time.monotonic() + self._exit_check_interval
                status = await self.poll()
                if status is not None:
                    logs = await self._container_logs()
                    self.log.error(
                        "Container of %s exited during start (%s): %s", self._log_name, status, logs
                    )
                    raise web.HTTPError(
                        500,
                        "The server's container stopped while starting. "
                        "Ask an admin to look at the hub log.",
                    )
            await asyncio.sleep(self.ready_poll_interval)
        return False  # the hub's own wait reports the time-out as usual

    async def _container_logs(self) -> str:
        try:
            out = await self.docker("logs", self.object_name, tail=20)
            return out.decode("utf-8", "replace")
        except Exception:
            return "(no logs)"

    async def poll(self):
        """DockerSpawner's poll, and re-adoption of a running container's devices and
        hook state (the credits meter).

        A hub killed between creating the container and saving state comes back with the
        container running and nothing of ours in state: the container's labels say which
        devices it holds and what the hooks had recorded (the paid interval), so this
        server owns its devices again and stays metered.

        A container the kernel's OOM killer ended (:meth:`_ended_out_of_memory`) is
        stopped here for the hooks, with stop reason ``out_of_memory``.
        """
        status = await super().poll()
        if status is not None:
            await self._ended_out_of_memory()
            await self._job_ended(status)
        if (
            status is None
            and not self._labels_read
            and (self.allocation is None or not self.hook_state or self.start_unfinished())
        ):
            self._labels_read = True  # once per container, not at every poll
            obj = await self.get_object()
            labels = (obj or {}).get("Config", {}).get("Labels") or {}
            uuids = [u for u in labels.get(LABEL_PREFIX + "devices", "").split(",") if u]
            if uuids and self.allocation is None:
                self.profile_slug = labels.get(LABEL_PREFIX + "profile", "")
                self.allocation = self.pool.restore(
                    self.server_key,
                    uuids,
                    float(labels.get(LABEL_PREFIX + "since") or time.time()),
                    profile=self.profile_slug,
                )
                self.log.info(
                    "%s re-adopted GPU(s) %s from its container's labels",
                    self._log_name,
                    ",".join(uuids),
                )
            hook_state = labels.get(LABEL_PREFIX + "hook-state")
            if hook_state and (not self.hook_state or self.start_unfinished()):
                try:
                    self.hook_state = dict(json.loads(hook_state))
                except (TypeError, ValueError):
                    self.log.error("%s: unreadable hook state label %r", self._log_name, hook_state)
                else:
                    self.log.info(
                        "%s re-adopted its hook state (%s) from its container's labels",
                        self._log_name,
                        ", ".join(self.hook_state),
                    )
                    self.restore_hooks()
        return status

    async def _ended_out_of_memory(self) -> None:
        """The container ended without the hub: if the kernel's OOM killer ended it past
        its ``mem_limit`` (Docker ``State.OOMKilled``), run the hooks' ``after_stop`` now
        with stop reason ``out_of_memory``, so the run record says so and the member is
        told (:class:`hub_ext.culling.culler.Culler`); the credits settle and refund as after a
        stop.  JupyterHub's ``User.stop`` calls no ``stop()`` for a server whose poll says
        it ended; a dead container ended otherwise is left to the hooks' own passes
        (``gone``).  Only for a running server (not during its start, whose failure undoes
        the hooks); idempotent (the hook state is emptied).  Never raises."""
        if self._spawn_pending or not self.hook_state:
            return
        try:
            obj = await self.get_object()
        except Exception as e:  # noqa: BLE001 - unknown: the hooks' passes settle it
            self.log.warning("%s: cannot read why its container ended: %s", self._log_name, e)
            return
        state = (obj or {}).get("State") or {}
        if not state.get("OOMKilled"):
            return
        limit = f"{self.mem_limit // 2**20}M" if self.mem_limit else "memory limit"
        self.stop_reason = "out_of_memory"
        self.stop_detail = (
            f"out of memory: the server used more than its {limit} "
            f"(Docker: OOMKilled, exit code {state.get('ExitCode')})"
        )
        self.log.warning(
            "%s stopped: its container %s was killed out of memory",
            self._log_name,
            self.object_name,
        )
        await self._stop_hooks_now()

    async def _stop_hooks_now(self) -> None:
        """The hooks' ``after_stop`` for a container that ended by itself (JupyterHub calls
        no ``stop()`` for it), then the hook state and the stop reason cleared.  Never
        raises an Exception."""
        try:
            await self.run_stop_hooks()
        except Exception:
            self.log.exception("The stop hooks of %s failed", self._log_name)
        finally:
            self.hook_state = {}
            self.stop_reason = self.stop_detail = None

    async def _job_ended(self, status) -> None:
        """A notebook job's or a GPU kernel's container ended by itself (its runner
        exited, or it was killed): run the hooks' ``after_stop`` now, once, with stop
        reason ``job_ended`` or ``kernel_ended``, so the job or kernel is ended
        (hub_ext.jobs.hook, hub_ext.kernels.hook), the credits settle and the GPUs go
        back; JupyterHub calls no ``stop()`` for a server whose poll says it ended.
        Never raises."""
        if self._spawn_pending or not (self.job or self.kernel) or self._job_end_seen:
            return
        try:
            obj = await self.get_object()
        except Exception as e:  # noqa: BLE001 - unknown: JupyterHub's poll asks again
            self.log.warning("%s: cannot read its container: %s", self._log_name, e)
            return
        if obj is None:  # never made (a start the hub forgot in a restart), or removed
            return
        self._job_end_seen = True
        self.stop_reason = "job_ended" if self.job else "kernel_ended"
        self.stop_detail = exit_words((obj.get("State") or {}).get("ExitCode"))
        try:
            await self._stop_hooks_now()
        finally:
            self.release_gpus("job ended")
        try:  # nobody restarts a job's or a kernel's container
            await self.docker("remove_container", self.object_name, force=True)
        except Exception as e:  # noqa: BLE001 - reconciliation meets it again
            self.log.info("Container of %s not removed: %s", self._log_name, e)

    async def stop(self, now=False):
        """Stop and remove the container, run the hooks' ``after_stop``, free the GPUs.

        When Docker fails to stop or remove the container (other than "already gone"),
        the error is raised and the GPUs are *not* freed while the container may still
        run: the pool keeps them as held by a container the hub no longer runs, and
        reconciliation frees them once Docker says the container is gone.
        """
        hook_state = copy.deepcopy(self.hook_state)  # DockerSpawner.stop() clears state
        try:
            try:
                await super().stop(now=now)
            except (NotFound, APIError) as e:
                if getattr(e, "status_code", None) not in (404, 409):
                    raise
                self.log.info("Container of %s already gone: %s", self._log_name, e)
            self.hook_state = hook_state
            await self.run_stop_hooks()
        except Exception:
            self._container_may_live = await self._container_exists()
            raise
        finally:
            self.hook_state = {}
            self.release_gpus("stopped")
            notices().withdraw(self.user.name, self.name or "", LINE_TOPIC)

    async def stop_object(self):
        """DockerSpawner's ``docker stop``.  The container no longer runs, so its GPUs go
        back to the pool now: the line's head gets them while the container is removed
        and the stop hooks settle (a GPU kernel's hand-off), not after.  A stopped
        container holds no device; reconciliation ignores it."""
        await super().stop_object()
        self.release_gpus("stopped")

    async def _container_exists(self) -> bool:
        """Whether Docker still has this server's container (True when it cannot tell)."""
        try:
            return await self.get_object() is not None
        except Exception:  # noqa: BLE001 - unsure: keep the devices busy
            return True

    def release_gpus(self, why: str) -> None:
        """Give this server's GPUs back to the pool.  Idempotent.

        After a stop that left the container behind, the devices stay busy, handed to
        reconciliation (:meth:`hub_ext.docker.pool.GPUPool.disown`) instead.
        """
        if self._container_may_live:
            disowned = self.pool.disown(self.server_key)
            if disowned is not None:
                self.log.error(
                    "%s: the container may still run; GPU(s) %s stay busy until Docker removes it",
                    self._log_name,
                    ",".join(disowned.uuids),
                )
            self._container_may_live = False
        else:
            released = self.pool.release(self.server_key)
            if released is not None:
                self.log.info(
                    "%s released GPU(s) %s (%s)", self._log_name, ",".join(released.uuids), why
                )
        self.allocation = None

    # -- state -------------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()  # DockerSpawner's and the hooks' (SpawnerCore)
        if self.allocation is not None:
            state["gpuhub"] = {**self.allocation.to_state(), "version": STATE_VERSION}
        return state

    def load_state(self, state):
        saved = state.get("gpuhub") if state else None
        if saved and saved.get("version") == STATE_VERSION and saved.get("uuids"):
            self.profile_slug = saved.get("profile", "")
            self.allocation = self.pool.restore(
                self.server_key,
                saved["uuids"],
                saved.get("since", time.time()),
                profile=self.profile_slug,
            )
        super().load_state(state)  # DockerSpawner's, then the hooks' (SpawnerCore)

    def clear_state(self):
        super().clear_state()  # the hooks' state too (SpawnerCore)
        self.release_gpus("state cleared")
