"""GPUDockerSpawner: DockerSpawner with profiles and exclusive GPUs from the pool.

A start runs in this order (each step yields a ``progress()`` event):

1. load the profile from ``user_options`` (untrusted: a bad one is HTTP 400 naming the
   valid choices) and apply its overrides;
2. reserve the profile's GPUs from :class:`hub_ext.pool.GPUPool` (refused at once with
   HTTP 409 and a sentence a member understands when none is free);
3. run the pre-start hooks (:attr:`GPUDockerSpawner.before_container_hooks`, e.g. the
   credits debit), each with an undo for a failed start;
4. create and start the container with a Docker ``DeviceRequest`` for exactly the
   reserved device UUIDs and labels that name the owner and the devices;
5. wait for the server to answer, polling briskly so that the hub's own exponential
   back-off (JupyterHub ``wait_for_http_server``) finds it up at its first try.

If any step after 2 fails or the start is cancelled, everything taken is given back:
the container is removed, the undo hooks run, the GPUs return to the pool.  ``stop()``
and ``clear_state()`` release too, idempotently: JupyterHub calls ``stop()`` after a
failed start and may call it twice (JupyterHub docs, "Spawners").

The allocation lives in spawner state (versioned) and in container labels, so a hub
restart rebuilds it (:mod:`hub_ext.reconcile`).
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import time

from docker.errors import APIError, ImageNotFound, NotFound
from dockerspawner import DockerSpawner
from jupyterhub.utils import random_port
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Any, Bool, Callable, Float, Int, List, Unicode, Union, default

from . import metrics
from .pool import AllocationRefused, GPUPool, ServerKey
from .profiles import (
    ProfileError,
    apply_overrides,
    gpu_request,
    init_profiles,
    profile_overrides,
    select_profile,
    visible_profiles,
)
from .templates import render

LABEL_PREFIX = "io.gpuhub."
STATE_VERSION = 1


class GPUDockerSpawner(DockerSpawner):
    """A DockerSpawner that gives each server exclusive GPUs and a chosen profile."""

    profile_list = Union(
        [List(), Callable()],
        default_value=[],
        config=True,
        help="""Profiles in KubeSpawner's schema (see hub_ext.profiles), or a callable,
        sync or async, taking the spawner and returning that list.

            c.GPUDockerSpawner.profile_list = [{"display_name": "CPU only", "default": True}]
        """,
    )

    gpus = Union(
        [Int(), Unicode()],
        default_value=0,
        config=True,
        help="""GPUs per server: a count of whole GPUs, or a MIG slice profile such as
        "1g.5gb" for one MIG device.  Usually set per profile.

            c.GPUDockerSpawner.gpus = 1
        """,
    )

    credits_per_hour = Float(
        0.0,
        config=True,
        help="""Credits charged per hour of a running server; 0 makes a profile free.
        Usually set per profile.

            c.GPUDockerSpawner.credits_per_hour = 2.0
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
        0.05,
        config=True,
        help="""Seconds between readiness checks of a starting server.

            c.GPUDockerSpawner.ready_poll_interval = 0.05
        """,
    )

    before_container_hooks = List(
        Any(),
        config=True,
        help="""Objects with ``async before_container(spawner)`` and
        ``async undo(spawner)``, run after the GPUs are reserved and before the
        container is created (the credits debit is one).  A hook raises
        ``tornado.web.HTTPError`` to refuse the spawn; ``undo`` runs when a later step
        fails and must be idempotent.

            c.GPUDockerSpawner.before_container_hooks = [CreditsHook()]
        """,
    )

    # Traits a profile may override; restored to their configured values at each start,
    # so one start's profile never leaks into the next.
    _overridable = (
        "image", "mem_limit", "cpu_limit", "environment", "volumes", "extra_host_config",
        "extra_create_kwargs", "gpus", "credits_per_hour", "cmd", "default_url",
    )

    @default("name_template")
    def _default_name_template(self):
        return "{prefix}-{username}--{servername}" if self.name else "{prefix}-{username}"

    @default("remove")
    def _default_remove(self):
        return True

    @default("options_form")
    def _default_options_form(self):
        return self._render_options_form

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # one pool per hub process, configured by c.GPUPool.*
        self.pool = GPUPool.instance(config=self.config)
        self.allocation = None
        self.profile_slug = ""
        self._configured = {name: copy.deepcopy(getattr(self, name))
                            for name in self._overridable}
        self._events: list[dict] = []
        self._events_changed = asyncio.Event()
        self.pool.ensure_reconciler(lambda: self.client, self.hub_id)

    @property
    def server_key(self) -> ServerKey:
        return ServerKey(self.user.name, self.name or "")

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
        """Step 1: validate ``user_options`` and apply the chosen profile's overrides.

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
        self.log.info("%s uses profile %s %s", self._log_name, selection.slug,
                      selection.choices or "")

    def options_from_form(self, formdata):
        """Form fields -> ``user_options``: ``profile`` and ``<profile>--<option>`` fields."""
        options = {}
        profile = formdata.get("profile", [None])[0]
        if profile is not None:
            options["profile"] = profile
            prefix = f"{profile}--"
            for key, values in formdata.items():
                if key.startswith(prefix) and values:
                    options[key[len(prefix):]] = values[0]
        return options

    async def _render_options_form(self, spawner):
        visible, _ = await self.get_profiles()
        if not visible:
            return ""
        try:
            await self.pool.devices()
        except Exception as e:  # the page still renders; spawns are refused with a reason
            self.log.warning("GPU inventory unavailable for the spawn page: %s", e)
        return render("options_form.html", profiles=self.profile_cards(visible))

    def profile_cards(self, profiles: list[dict]) -> list[dict]:
        """What the spawn page shows per profile: GPUs asked, free now, and whether it fits."""
        cards = []
        for profile in profiles:
            overrides = profile_overrides(select_profile([profile], {"profile": profile["slug"]}))
            count, mig = gpu_request(overrides.get("gpus", self._configured["gpus"]))
            summary = self.pool.summary(mig_profile=mig)
            available = count == 0 or summary.free >= count
            cards.append({
                "profile": profile,
                "gpus": count,
                "mig_profile": mig,
                "free": summary.free,
                "total": summary.total,
                "simulated": summary.kind == "simulated",
                "available": available,
                "why_not": "" if available else self.pool.refusal_message(
                    self.pool._devices, count, mig),
                "credits_per_hour": overrides.get("credits_per_hour", 0),
            })
        return cards

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
            if self._spawn_done():
                return
            self._events_changed.clear()
            try:
                await asyncio.wait_for(self._events_changed.wait(), timeout=1)
            except TimeoutError:
                pass

    def _spawn_done(self) -> bool:
        return not self._spawn_pending

    # -- start / stop ------------------------------------------------------------------

    async def start(self):
        self._events = []
        await self.load_profile()
        count, mig = gpu_request(self.gpus)
        self.allocation = None
        if count:
            self.emit(10, f"Reserving {mig + ' slice' if mig else str(count) + ' GPU(s)'}")
            try:
                self.allocation = await self.pool.allocate(
                    self.server_key, count, mig_profile=mig, profile=self.profile_slug
                )
            except AllocationRefused as e:
                metrics.SPAWNS_REFUSED.labels(reason=e.reason).inc()
                self.log.warning("Refusing spawn of %s (%s): %s", self._log_name, e.reason,
                                 e.message)
                raise web.HTTPError(409, e.message) from e
            self.log.info("%s holds GPU(s) %s", self._log_name,
                          ",".join(self.allocation.uuids))
        done_hooks = []
        try:
            for hook in self.before_container_hooks:
                await hook.before_container(self)
                done_hooks.append(hook)
            self._prepare_container()
            self.emit(50, f"Starting container {self.object_name} from {self.image}")
            try:
                ip, port = await super().start()
            except ImageNotFound as e:
                raise web.HTTPError(
                    500, f"The image {self.image} of this profile is not on this node. "
                    "Ask an admin to build it."
                ) from e
            self.emit(80, "Waiting for JupyterLab to answer")
            await self._wait_until_ready(ip, port)
            self.emit(95, "Server is up")
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
                await self.docker("remove_container", obj["Id"], force=True)
            self.object_id = ""
        except Exception:
            self.log.exception("Could not remove the container of failed %s", self._log_name)
        for hook in reversed(done_hooks):
            try:
                await hook.undo(self)
            except Exception:
                self.log.exception("Undo of %r failed for %s", hook, self._log_name)
        self.release_gpus("start failed")

    def _prepare_container(self) -> None:
        """Device request, labels and (host network) port for this start."""
        labels = {
            LABEL_PREFIX + "hub": self.hub_id,
            LABEL_PREFIX + "user": self.user.name,
            LABEL_PREFIX + "server": self.name or "",
            LABEL_PREFIX + "profile": self.profile_slug,
            LABEL_PREFIX + "devices": ",".join(self.allocation.uuids) if self.allocation else "",
            LABEL_PREFIX + "since": str(self.allocation.since if self.allocation else time.time()),
        }
        create = copy.deepcopy(self.extra_create_kwargs) if isinstance(
            self.extra_create_kwargs, dict) else {}
        create.setdefault("labels", {}).update(labels)
        self.extra_create_kwargs = create
        host = copy.deepcopy(self.extra_host_config) if isinstance(
            self.extra_host_config, dict) else {}
        if self.allocation:
            # Docker's GPU request (docker run --gpus): the engine hands these exact
            # UUIDs to the NVIDIA hook, which sets NVIDIA_VISIBLE_DEVICES.
            host["device_requests"] = [{
                "Driver": "nvidia",
                "DeviceIDs": list(self.allocation.uuids),
                "Capabilities": [["gpu"]],
            }]
        else:
            host.pop("device_requests", None)
        self.extra_host_config = host
        if self.host_network:
            self.port = random_port()

    async def get_ip_and_port(self):
        if self.host_network:
            return self.ip, self.port
        return await super().get_ip_and_port()

    async def _wait_until_ready(self, ip, port) -> None:
        """Poll the server until it answers (any status below 500) or its container dies.

        Fails fast with HTTP 500 and the container's last log lines when it exits.
        """
        url = f"http://{ip}:{port}{self.server.base_url if self.server else '/'}api"
        client = AsyncHTTPClient()
        deadline = time.monotonic() + self.http_timeout
        checks = 0
        while time.monotonic() < deadline:
            try:
                await client.fetch(url, request_timeout=2, follow_redirects=False,
                                   raise_error=False)
                return
            except (ConnectionError, OSError, HTTPClientError):
                pass
            checks += 1
            if checks % 10 == 0:
                status = await self.poll()
                if status is not None:
                    logs = await self._container_logs()
                    self.log.error("Container of %s exited during start (%s): %s",
                                   self._log_name, status, logs)
                    raise web.HTTPError(
                        500, f"The server's container stopped while starting ({status}). "
                        "Ask an admin to look at the hub log."
                    )
            await asyncio.sleep(self.ready_poll_interval)
        # let the hub's own wait report the time-out as usual

    async def _container_logs(self) -> str:
        try:
            out = await self.docker("logs", self.object_name, tail=20)
            return out.decode("utf-8", "replace")
        except Exception:
            return "(no logs)"

    async def poll(self):
        """DockerSpawner's poll, and re-adoption of a running container's devices.

        A hub killed between creating the container and saving state comes back with the
        container running and no allocation in state: the labels say which devices it
        holds, and this server owns them again.
        """
        status = await super().poll()
        if status is None and self.allocation is None:
            obj = await self.get_object()
            labels = (obj or {}).get("Config", {}).get("Labels") or {}
            uuids = [u for u in labels.get(LABEL_PREFIX + "devices", "").split(",") if u]
            if uuids:
                self.profile_slug = labels.get(LABEL_PREFIX + "profile", "")
                self.allocation = self.pool.restore(
                    self.server_key, uuids,
                    float(labels.get(LABEL_PREFIX + "since") or time.time()),
                    profile=self.profile_slug,
                )
                self.log.info("%s re-adopted GPU(s) %s from its container's labels",
                              self._log_name, ",".join(uuids))
        return status

    async def stop(self, now=False):
        try:
            try:
                await super().stop(now=now)
            except (NotFound, APIError) as e:
                if getattr(e, "status_code", None) not in (404, 409):
                    raise
                self.log.info("Container of %s already gone: %s", self._log_name, e)
            for hook in reversed(self.before_container_hooks):
                stopped = getattr(hook, "after_stop", None)
                if stopped is not None:
                    await stopped(self)
        finally:
            self.release_gpus("stopped")

    def release_gpus(self, why: str) -> None:
        """Give this server's GPUs back to the pool.  Idempotent."""
        released = self.pool.release(self.server_key)
        if released is not None:
            self.log.info("%s released GPU(s) %s (%s)", self._log_name,
                          ",".join(released.uuids), why)
        self.allocation = None

    # -- state -------------------------------------------------------------------------

    def get_state(self):
        state = super().get_state()
        if self.allocation is not None:
            state["gpuhub"] = {**self.allocation.to_state(), "version": STATE_VERSION}
        return state

    def load_state(self, state):
        super().load_state(state)
        saved = state.get("gpuhub") if state else None
        if saved and saved.get("version") == STATE_VERSION and saved.get("uuids"):
            self.profile_slug = saved.get("profile", "")
            self.allocation = self.pool.restore(
                self.server_key, saved["uuids"], saved.get("since", time.time()),
                profile=self.profile_slug,
            )

    def clear_state(self):
        super().clear_state()
        self.release_gpus("state cleared")
