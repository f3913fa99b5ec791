"""GPUDockerSpawner: the Docker backend, DockerSpawner answering the spawn lifecycle.

The lifecycle of a start and a stop (the profile, the checks, the line or the capacity, the
debit, the launch, the wait; the settle and the release) is the core's
(:class:`hub_ext.spawn.core.SpawnerCore`; docs/explanation/spawn.md); this spawner answers
its questions (:class:`hub_ext.spawn.backend.SpawnBackend`) with the collaborators it holds:
the node's GPU pool (:class:`hub_ext.docker.pool.GPUPool`), the pool and the line together
(:class:`hub_ext.docker.line.PoolLine`), the hub's server limits
(:class:`hub_ext.docker.server_limits.ServerLimits`), and the container built as a value
(:func:`hub_ext.docker.container.make_container`, handed to Docker by DockerSpawner's
``create_object`` hook, as dockerspawner's ``SwarmSpawner`` changes behaviour by its object
hooks).  The allocation lives in spawner state and in container labels, so a hub restart
rebuilds it (:mod:`hub_ext.docker.reconcile`).

Its own settings are ``c.GPUDockerSpawner.<trait>`` (the container's:
:class:`hub_ext.docker.container.ContainerSettings`); what both backends read is set on
``c.SpawnerCore`` (:mod:`hub_ext.docker.hubconfig`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import UTC, datetime, timedelta

from docker.errors import APIError, ImageNotFound, NotFound
from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port
from tornado import web
from traitlets import default

from ..common.notices import notices
from ..culling.rules import duration
from ..reservations.enforce import Reservations
from ..reservations.policy import starts_text
from ..spawn.backend import Ended
from ..spawn.choice import wants_wait
from ..spawn.core import SpawnerCore
from ..spawn.profiles import LABEL_PREFIX, gpu_request
from ..spawn.stopping import exit_words
from . import availability
from .container import (
    make_container,
    member_ids,
    member_workspace,
    prepare_workspace,
    workspace_folder,
)
from .inventory import InventoryError
from .line import TOPIC as LINE_TOPIC
from .line import GPUAsk, PoolLine, the_line
from .pool import GPUPool
from .readiness import ServerExited, wait_until_ready
from .reconcile import ensure_reconciler
from .server_limits import ServerLimits
from .settings import DockerSettings


class GPUDockerSpawner(SpawnerCore, DockerSettings, DockerSpawner):
    """A DockerSpawner that gives each server exclusive GPUs and a chosen profile."""

    #: Seconds between asking Docker whether a starting server's container still runs.
    _exit_check_interval = 0.5

    #: notebook jobs and GPU kernels run here, each in a container of its own (a GPU
    #: kernel's connection files in the member's workspace)
    runs_workloads = frozenset({"job", "kernel"})

    #: ``(count, unit kind)`` this start was admitted with by the spawn gate
    #: (:meth:`check_spawn`), until its reservation is made or refused (None: no claim)
    gpu_claim = None
    #: True while the spawn gate hands this admitted start to JupyterHub, which may yield
    #: (``refresh_pre_spawn``) before it marks the spawn pending (hub_ext.spawn.gate)
    handing_over = False

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
        self._start_timeout = self.start_timeout  # configured; a wait in line adds to it
        self._container_may_live = False  # a failed stop left the container behind
        self._labels_read = False  # poll() looked at the container's labels
        self._job_end_seen = False  # a job's end was seen by poll (why_ended)
        self._launched = False  # this start made a container (abandon removes it)
        self._container: dict = {}  # what check_start found: ids, datasets, workspace
        ensure_reconciler(self.pool, lambda: self.client, self.hub_id)
        if self.db_session() is not None:
            self.line()  # the places kept from before a restart count from the start

    def line(self):
        """The hub's line, attached to the hub database and the pool
        (:func:`hub_ext.docker.line.the_line`)."""
        api_url = self.hub.api_url if self.hub is not None else ""
        users = (getattr(self.user, "settings", None) or {}).get("users")
        return the_line(self.pool, self.db_session(), api_url, users)

    def pool_line(self) -> PoolLine:
        return PoolLine(self.pool, self.line(), self.log)

    def gpu_ask(self) -> GPUAsk:
        """This start's GPU request, from its profile (``gpus``) and choice."""
        count, mig = gpu_request(self.gpus)
        return GPUAsk(
            key=self.server_key,
            count=count,
            mig=mig,
            profile=self.profile_slug,
            profile_name=self.profile_name,
            user_options=dict(self.user_options or {}),
            wait=self.wait_requested,
            who=self._log_name,
        )

    # -- the spawn gate ----------------------------------------------------------------

    def run_pre_spawn_hook(self):
        """Give a start that may wait in line the time to wait.

        JupyterHub wraps ``Spawner.start()`` in ``asyncio.wait_for(..., start_timeout)``,
        reading ``start_timeout`` before ``start()`` runs (JupyterHub ``User.spawn``):
        this is the last step before.  A start that may wait gets the line's ``max_wait``
        added; the line ends the wait at ``max_wait`` itself, and the rest of the start
        runs under the configured ``start_timeout``, counted from the grant
        (:meth:`rest_of_start`).  The readiness wait (``http_timeout``) starts after
        ``start()`` returns, so the wait in line never counts against it."""
        self.start_timeout = self._start_timeout
        options = self.user_options if isinstance(self.user_options, dict) else {}
        if (
            wants_wait(options.get("wait"))
            or self.workload_asked(options)  # a notebook job waits in line
            or self.server_key in self.line().places
        ):
            self.start_timeout = int(self._start_timeout + self.line().max_wait + 60)
        return super().run_pre_spawn_hook()

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
        again and the pool's reservation stays the authority.  An admitted start's units
        count as claimed (``gpu_claim``, ``pool.claims``) until its reservation is made
        or refused, so a rush of starts is refused here once the free units are spoken
        for.  Raises ``tornado.web.HTTPError`` with the same words and status as
        :meth:`start`.
        """
        self.gpu_claim = None
        if options is None:
            options = getattr(self.orm_spawner, "user_options", None) or {}
        self.user_options = options
        try:
            await self.load_profile()
            await self.check_hooks()
            ask = self.gpu_ask()
            devices = None
            if ask.count:
                try:
                    devices = await self.pool.devices()
                except InventoryError:
                    pass  # start() refuses with the pool's words
            # from here on nothing yields: the claim below counts before the next check
            self.check_start_limits()
            if devices is not None:
                line = self.pool_line()
                if line.refusal_now(ask, devices, self._claimed_units(ask.units)):
                    self.gpu_claim = (ask.count, ask.units)
                    self.pool.claims[self.server_key] = self
        except web.HTTPError as e:
            self.tell_member(e)
            raise

    def _claimed_units(self, units: str) -> int:
        """Units of kind ``units`` claimed by other starts the gate admitted that are still
        being handed to JupyterHub or pending, and hold no GPU and no place in line;
        claims that are spent (the start reserved, waits in line or ended) are dropped."""
        places = self.line().places
        claimed = 0
        for key, spawner in list(self.pool.claims.items()):
            claim = spawner.gpu_claim
            starting = spawner.handing_over or spawner.pending == "spawn"
            if not claim or not starting or spawner.allocation is not None or key in places:
                del self.pool.claims[key]
            elif key != self.server_key and claim[1] == units:
                claimed += claim[0]
        return claimed

    def check_start_limits(self) -> None:
        """The hub's server limits (:class:`hub_ext.docker.server_limits.ServerLimits`),
        places in line left out of the count; a place started again after a hub restart
        was admitted before."""
        places = self.line().places
        if self.server_key not in places:
            limits = ServerLimits(self.concurrent_spawn_limit, self.active_server_limit)
            limits.check(self, list(places))

    # -- a start (hub_ext.spawn.backend.SpawnBackend) ---------------------------------

    def new_start(self) -> None:
        self._job_end_seen = False
        self._labels_read = True  # this start writes state and labels alike
        self._launched = False
        self.allocation = None
        self._container = {}

    async def check_start(self) -> None:
        """What the container will mount and run as (a missing dataset, a uid mapping, a
        workspace outside its root), then the hub's server limits (HTTP 429)."""
        self._container = {
            "datasets": self.checked_datasets(),
            "ids": await self.member_ids(),
            "workspace": self.member_workspace(),
        }
        self.check_start_limits()

    async def reserve(self) -> None:
        """The profile's GPUs from the pool, at once or after a wait in line
        (:meth:`hub_ext.docker.line.PoolLine.take`); nothing for a CPU profile."""
        ask = self.gpu_ask()
        if not ask.count:
            return
        self.allocation, self.line_wait = await self.pool_line().take(
            ask, self.emit, self._share_hours()
        )
        waited = self.line_wait is not None
        self.log.info(
            "%s holds GPU(s) %s%s",
            self._log_name,
            ",".join(self.allocation.uuids),
            " after a wait in line" * waited,
        )
        if not waited:
            self.emit(20, f"Reserved {ask.what} for you alone: {', '.join(self.allocation.uuids)}")
        self.tell_next_window(ask.mig)

    def rest_of_start(self):
        """The configured ``start_timeout`` for the rest of a start that waited in line
        (see :meth:`run_pre_spawn_hook`)."""
        if self.line_wait is None:
            return contextlib.nullcontext()
        return asyncio.timeout(self._start_timeout)

    async def launch(self) -> tuple[str, int]:
        """The workspace, then the container (DockerSpawner's ``start``, which creates it
        through :meth:`create_object`)."""
        await prepare_workspace(
            self.docker,
            self.client,
            image=self.image,
            workspace=self._container["workspace"],
            workspace_mount=self.workspace_mount,
            ids=self._container["ids"],
            username=self.user.name,
            log=self.log,
            who=self._log_name,
        )
        if self.host_network:
            self.port = random_port()
        self.emit(50, f"Starting container {self.object_name} from {self.image}")
        self._launched = True
        try:
            return await DockerSpawner.start(self)
        except ImageNotFound as e:
            raise web.HTTPError(
                500,
                f"The image {self.image} of this profile is not on this node. "
                "Ask an admin to build it.",
            ) from e

    async def create_object(self):
        """DockerSpawner's object hook: the container of this start, built as a value
        (:func:`hub_ext.docker.container.make_container`) from the profile, the member and
        the allocation."""
        if self.workload.command:  # a notebook job's runner in place of the server
            command = [*self.workload.command, *self.get_args()]
        else:
            command = await self.get_command()
        extra_create, extra_host = self.extra_create_kwargs, self.extra_host_config
        spec = make_container(
            name=self.container_name,
            image=self.image,
            command=command,
            environment={**self.get_env(), **self.core_environment()},
            binds=self.volume_binds,
            port=self.port,
            labels=self.container_labels(),
            workspace=self._container["workspace"],
            workspace_mount=self.workspace_mount,
            ids=self._container["ids"],
            datasets=self._container["datasets"],
            devices=self.allocation.uuids if self.allocation else (),
            mem_limit=self.mem_limit,
            cpu_limit=self.cpu_limit,
            shm_size=self.shm_size,
            pids_limit=self.pids_limit,
            log_max_size=self.log_max_size,
            umask=self.umask,
            network_name=self.network_name,
            use_internal_ip=self.use_internal_ip,
            host_ip=self.host_ip,
            links=self.links,
            extra_create_kwargs=(
                self._render_templates(extra_create) if isinstance(extra_create, dict) else {}
            ),
            extra_host_config=(
                self._render_templates(extra_host) if isinstance(extra_host, dict) else {}
            ),
        )
        create = dict(spec.create)
        create["host_config"] = {
            **create.get("host_config", {}),
            **self.client.create_host_config(**spec.host),
        }
        return await self.docker("create_container", **create)

    def container_labels(self) -> dict:
        """The hub's labels on this start's container: who, which server and profile, its
        devices since when, where it serves, what the workload and the hooks recorded."""
        labels = {
            "hub": self.hub_id,
            "user": self.user.name,
            "server": self.name or "",
            "profile": self.profile_slug,
            "devices": ",".join(self.allocation.uuids) if self.allocation else "",
            "since": str(self.allocation.since if self.allocation else time.time()),
            # where the server listens (on the host with host networking): a hub that
            # restarts during the start finds it there (get_url)
            "port": str(self.port),
            **self.workload.labels(),  # a notebook job's id (hub_ext.jobs)
        }
        if self.hook_state:
            # what the hooks recorded (the credits paid), for a hub killed before it saved
            # spawner state (see poll_server)
            labels["hook-state"] = json.dumps(self.hook_state, sort_keys=True)
        return {LABEL_PREFIX + k: v for k, v in labels.items()}

    async def wait_ready(self, ip: str, port: int) -> tuple[str, int]:
        """Until JupyterLab answers HTTP at all, polling briskly
        (:func:`hub_ext.docker.readiness.wait_until_ready`) so that the hub's own
        exponential back-off (JupyterHub ``wait_for_http_server``) finds it up at its first
        try; fails fast with HTTP 500 and the container's last log lines when it exits.
        The GPUs are then no longer a start's."""
        self.emit(80, "Waiting for JupyterLab to answer")
        url = f"http://{ip}:{port}{self.server.base_url if self.server else '/'}api"
        try:
            ready = await wait_until_ready(
                ip,
                port,
                url,
                self.http_timeout,
                self.ready_poll_interval,
                self.poll,
                self._exit_check_interval,
            )
        except ServerExited as e:
            logs = await self._container_logs()
            self.log.error(
                "Container of %s exited during start (%s): %s", self._log_name, e.status, logs
            )
            raise web.HTTPError(
                500,
                "The server's container stopped while starting. "
                "Ask an admin to look at the hub log.",
            ) from None
        if ready:
            self.emit(95, "Server is up")
        else:  # the hub's own wait reports the time-out as usual
            self.emit(90, "JupyterLab is slow to answer; still waiting")
        if self.allocation is not None:
            self.allocation.starting = False
        return ip, port

    def start_ended(self) -> None:
        if gpu_request(self.gpus)[0]:
            self.line().forget(self.server_key)  # only a granted place; idempotent
        # the gate's claim is spent: the GPUs are held (or the place in line taken), or
        # the start failed and holds nothing
        self.gpu_claim = None

    async def abandon(self) -> None:
        """Remove the container of a failed start (its last log lines logged first).
        Never raises."""
        if not self._launched:
            return
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

    async def _container_logs(self) -> str:
        try:
            out = await self.docker("logs", self.object_name, tail=20)
            return out.decode("utf-8", "replace")
        except Exception:
            return "(no logs)"

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

    # -- the member's uid and workspace --------------------------------------------------

    async def member_ids(self) -> tuple[int, int] | None:
        """(uid, gid) the member's server runs as, or None for the image's jovyan
        (:func:`hub_ext.docker.container.member_ids`)."""
        return await member_ids(
            self.user, self.uid_map_file, self.require_uid_mapping, self.log, self._log_name
        )

    def member_workspace(self) -> str:
        """The member's workspace: a volume name, or a host path under
        ``workspace_root`` (:func:`hub_ext.docker.container.member_workspace`)."""
        return member_workspace(
            self._render_templates(self.workspace), self.workspace_root, self.log, self._log_name
        )

    async def job_workspace(self) -> tuple[str, int, int]:
        """The member's workspace on this machine, and its owner (uid, gid), for a notebook
        job: a host path as it is, a named volume by its mount point.  Raises
        ``HTTPError(404)`` when the member has no workspace yet."""
        ids = await self.member_ids() or (1000, 100)
        folder = await workspace_folder(self.docker, self.member_workspace())
        if not folder:
            raise web.HTTPError(
                404, "You have no workspace yet: start a server once and save your notebook."
            )
        return folder, *ids

    # -- a running server --------------------------------------------------------------

    async def poll_server(self):
        """DockerSpawner's poll, and re-adoption of a running container's devices and
        hook state (the credits meter).

        A hub killed between creating the container and saving state comes back with the
        container running and nothing of ours in state: the container's labels say which
        devices it holds and what the hooks had recorded (the paid interval), so this
        server owns its devices again and stays metered.
        """
        status = await DockerSpawner.poll(self)
        if (
            status is None
            and not self._labels_read
            and (self.allocation is None or not self.hook_state or self.start_unfinished())
        ):
            self._labels_read = True  # once per container, not at every poll
            await self._adopt_labels()
        return status

    async def _adopt_labels(self) -> None:
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

    async def why_ended(self, status) -> Ended | None:
        """A container that ended without the hub: past its ``mem_limit``, killed by the
        kernel's OOM killer (Docker ``State.OOMKilled``; a running server's, stop reason
        ``out_of_memory``), or a notebook job's, whose runner exited or was killed (once,
        ``job_ended`` with its exit code in words; its container removed: nobody restarts
        it, its log is in the workspace).  A dead container ended otherwise is left to the
        hooks' own passes (``gone``).  Never raises."""
        oom = await self._out_of_memory() if self.hook_state else None
        if not self.workload.ends_by_itself or self._job_end_seen:
            return oom
        try:
            obj = await self.get_object()
        except Exception as e:  # noqa: BLE001 - unknown: JupyterHub's poll asks again
            self.log.warning("%s: cannot read its container: %s", self._log_name, e)
            return oom
        if obj is None:  # never made (a start the hub forgot in a restart), or removed
            return oom
        self._job_end_seen = True
        code = (obj.get("State") or {}).get("ExitCode")
        try:
            await self.docker("remove_container", self.object_name, force=True)
        except Exception as e:  # noqa: BLE001 - reconciliation meets it again
            self.log.info("Container of %s not removed: %s", self._log_name, e)
        return oom or Ended(self.workload.ended_reason, exit_words(code))

    async def _out_of_memory(self) -> Ended | None:
        """``out_of_memory`` when the container was OOM-killed, else None."""
        try:
            obj = await self.get_object()
        except Exception as e:  # noqa: BLE001 - unknown: the hooks' passes settle it
            self.log.warning("%s: cannot read why its container ended: %s", self._log_name, e)
            return None
        state = (obj or {}).get("State") or {}
        if not state.get("OOMKilled"):
            return None
        limit = f"{self.mem_limit // 2**20}M" if self.mem_limit else "memory limit"
        self.log.warning(
            "%s stopped: its container %s was killed out of memory",
            self._log_name,
            self.object_name,
        )
        return Ended(
            "out_of_memory",
            f"out of memory: the server used more than its {limit} "
            f"(Docker: OOMKilled, exit code {state.get('ExitCode')})",
        )

    async def end(self, now: bool = False) -> None:
        """Stop and remove the container (DockerSpawner's ``stop``; one already gone is
        stopped).  When Docker fails otherwise, the error is raised and the GPUs are *not*
        freed while the container may still run (:meth:`stop_failed`)."""
        notices().withdraw(self.user.name, self.name or "", LINE_TOPIC)
        try:
            await DockerSpawner.stop(self, now=now)
        except (NotFound, APIError) as e:
            if getattr(e, "status_code", None) not in (404, 409):
                raise
            self.log.info("Container of %s already gone: %s", self._log_name, e)

    async def stop_object(self):
        """DockerSpawner's ``docker stop``.  The container no longer runs, so its GPUs go
        back to the pool now: the line's head gets them while the container is removed
        and the stop hooks settle (a GPU kernel's hand-off), not after.  A stopped
        container holds no device; reconciliation ignores it."""
        await super().stop_object()
        self.release("stopped")

    async def stop_failed(self) -> bool:
        """The pool keeps the GPUs of a container that may still run as held by one the
        hub no longer runs; reconciliation frees them once Docker says it is gone."""
        self._container_may_live = await self._container_exists()
        return False

    async def _container_exists(self) -> bool:
        """Whether Docker still has this server's container (True when it cannot tell)."""
        try:
            return await self.get_object() is not None
        except Exception:  # noqa: BLE001 - unsure: keep the devices busy
            return True

    def release(self, why: str) -> None:
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

    # -- a hub restart -----------------------------------------------------------------

    def saved_state(self) -> dict:
        """The allocation (its devices, since when, the profile)."""
        return self.allocation.to_state() if self.allocation is not None else {}

    def adopt(self, saved: dict) -> None:
        """The devices of the allocation kept in spawner state, held again."""
        if saved.get("uuids"):
            self.allocation = self.pool.restore(
                self.server_key,
                saved["uuids"],
                saved.get("since", time.time()),
                profile=self.profile_slug,
            )

    def clear_state(self):
        super().clear_state()  # the hooks' state too (SpawnerCore)
        self.release("state cleared")

    # -- what is free now (the spawn page, the board) ------------------------------------

    async def gpu_snapshot(self):
        return await availability.pool_snapshot(self.pool, self.log)

    def gpus_now(self, snapshot, overrides: dict):
        gpus = overrides.get("gpus", self._configured["gpus"])
        return availability.pool_gpus_now(self.pool, self.line(), self.user.name, snapshot, gpus)

    def limits_of(self, overrides: dict) -> tuple:
        """The profile's JupyterHub ``mem_limit`` and ``cpu_limit``, which the container
        gets."""
        return overrides.get("mem_limit"), overrides.get("cpu_limit")

    async def image_facts(self, image: str) -> dict:
        return await availability.image_facts(self.docker, image)

    @classmethod
    async def availability(cls, config, log) -> dict:
        return await availability.pool_availability(config, log)

    @classmethod
    async def gpu_board(cls, handler) -> dict:
        """The GPU board's rows for this node (:mod:`hub_ext.docker.board`)."""
        from .board import board_model

        return await board_model(handler)

    @classmethod
    async def held_gpus(cls, handler, user, servers: list[str]) -> list[dict]:
        """The pool's units of ``user``'s ``servers``
        (:func:`hub_ext.docker.availability.pool_held_gpus`)."""
        return await availability.pool_held_gpus(
            handler.settings["config"], handler.log, user, servers
        )

    def goes_first(self, gpus) -> bool:
        """A member of an open window's group passes the line
        (:meth:`Reservations.member_first`), so the card is not held back by it."""
        return Reservations.initialized() and Reservations.instance().member_first(
            self.user.name, gpus.kind if gpus.mig else "gpu"
        )

    def runs_until(self, gpus) -> str:
        """How long a start may run before another group's window
        (:meth:`Reservations.next_stop`), or ``""``."""
        if not Reservations.initialized():
            return ""
        rules = Reservations.instance()
        window = rules.next_stop(self.user.name, gpus.kind if gpus.mig else "gpu")
        if window is None:
            return ""
        left = (window.start - rules.now()).total_seconds()
        return (
            f"{starts_text(window)}: a server started now may run until then (about "
            f"{duration(left)})."
        )

    def tell_next_window(self, mig: str | None) -> None:
        """Tell the member, on the progress page, how long the server may run before a
        reservation of a group they are not in may stop it (within 12 h)."""
        if not Reservations.initialized():
            return
        rules = Reservations.instance()
        window = rules.next_stop(self.user.name, mig or "gpu")
        if window is not None:
            self.emit(25, rules.start_notice(window))

    def _share_hours(self) -> float:
        """GPU-hours of this member in the last ``c.Line.fair_share_days`` (0 when off)."""
        line = self.line()
        if not line.fair_share_days or self.db_session() is None:
            return 0.0
        from ..common import runs
        from ..ops.usage import gpu_seconds

        now = datetime.now(UTC)
        since = now - timedelta(days=line.fair_share_days)
        return (
            sum(
                gpu_seconds(r, since, now)
                for r in runs.runs_overlapping(self.db_session(), since)
                if r.username == self.user.name
            )
            / 3600
        )
