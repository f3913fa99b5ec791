"""Per-profile idle timeouts for jupyterhub-idle-culler, through its ``cull_arbiter_hook``.

jupyterhub-idle-culler has one idle timeout (``--timeout``) for every server.  Its documented
extension point, ``c.IdleCuller.cull_arbiter_hook`` (called with ``inactive``,
``inactive_limit`` and the server's REST model; see the culler's ``--help-all``), lets each
server have its own: :class:`ProfileIdleLimits` reads the profile a server was started with
from the model's ``user_options`` (in the model with the culler's ``read:servers`` scope; its
spawner state, which would need ``admin:server_state``, is not needed) and applies that
profile's ``cull_idle_timeout``, resolved by the same steps the spawner uses
(:mod:`hub_ext.spawn.profiles`).  A profile without one uses ``--timeout``; 0 means never.
A notebook job's server (``user_options["job"]``) is never culled for inactivity: nobody
browses it, and its maximum run time ends it (:mod:`hub_ext.jobs.lifecycle`); nor is a
GPU kernel's (``user_options["kernel"]``), which the hub ends after the GPU kernels' own idle
time-out (:mod:`hub_ext.kernels.lifecycle`).

This module runs inside the culler service's process (``--config`` loads
:data:`CONFIG_TEXT`, which calls :func:`configure`); it imports nothing from JupyterHub.
The profile list comes from the ``GPUHUB_CULL_PROFILES`` environment variable (JSON), set
by :mod:`hub_ext.culling.hubconfig`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import timedelta

from ..spawn.profiles import ProfileError, init_profiles, profile_overrides, select_profile

__all__ = ["CONFIG_TEXT", "ENV", "ProfileIdleLimits", "configure"]

ENV = "GPUHUB_CULL_PROFILES"

#: The culler's configuration file, written into the hub's state directory.
CONFIG_TEXT = """\
# jupyterhub-idle-culler's configuration (--config), written by the hub
# (hub_ext.culling.hubconfig): per-profile idle timeouts through cull_arbiter_hook.
from hub_ext.culling.arbiter import configure

configure(c)  # noqa: F821 (c is the culler's config object)
"""


class ProfileIdleLimits:
    """The culler's arbiter: is a server idle past its profile's ``cull_idle_timeout``?

    Raises :class:`hub_ext.spawn.profiles.ProfileError` at construction for a malformed list.
    """

    def __init__(self, profile_list: list[dict]):
        self.profiles = init_profiles(profile_list, overridable=None)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ProfileIdleLimits:
        """From ``GPUHUB_CULL_PROFILES``; an unset variable means no profiles (``--timeout``
        for every server).  Raises ValueError for JSON that is not a list."""
        from ..settings import value

        raw = value(ENV, environ)  # declared in hub_ext.settings.rows: JSON
        profile_list = json.loads(raw) if raw else []
        if not isinstance(profile_list, list):
            raise ValueError(f"{ENV} must be a JSON list of profiles")
        return cls(profile_list)

    def limit(self, user_options, default: float) -> float:
        """Seconds of inactivity allowed for a server started with ``user_options``.

        ``default`` (the culler's ``--timeout``) when there are no profiles, the options do
        not select one (they were valid when the server started; the list may have changed
        since), or the profile sets no ``cull_idle_timeout``.
        """
        if isinstance(user_options, dict) and "job" in user_options:
            return 0.0  # a notebook job is never idle; its maximum run time ends it
        if isinstance(user_options, dict) and "kernel" in user_options:
            return 0.0  # a GPU kernel's own idle time-out is the hub's (hub_ext.kernels)
        if not self.profiles:
            return float(default)
        try:
            selection = select_profile(self.profiles, user_options or {})
        except ProfileError:
            return float(default)
        value = profile_overrides(selection).get("cull_idle_timeout")
        return float(default) if value is None else float(value)

    def limits(self) -> set[float]:
        """Every ``cull_idle_timeout`` the profiles and their choices set (for --cull-every)."""
        found = set()
        for profile in self.profiles:
            entries = [profile, profile["spawner_override"]]
            for option in (profile.get("profile_options") or {}).values():
                entries += [c["spawner_override"] for c in option["choices"].values()]
            found |= {
                float(e["cull_idle_timeout"])
                for e in entries
                if e.get("cull_idle_timeout") is not None
            }
        return found

    def __call__(
        self, *, inactive: timedelta, inactive_limit: float, server: dict, **kwargs
    ) -> bool:
        limit = self.limit(server.get("user_options"), inactive_limit)
        return bool(limit) and inactive.total_seconds() >= limit


def configure(c) -> None:
    """Set ``c.IdleCuller.cull_arbiter_hook`` (called by the culler's config file)."""
    c.IdleCuller.cull_arbiter_hook = ProfileIdleLimits.from_env()
