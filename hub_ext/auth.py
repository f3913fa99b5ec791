"""Authenticators.

:class:`DemoAuthenticator` is for the README demo and the tests only: it accepts any
username with any password.  It refuses to load unless ``GPUHUB_DEMO_LOGIN=1`` is set in
the hub's environment and the hub listens on loopback, so a production config that names
it by mistake fails at start-up instead of opening the hub.
"""

from __future__ import annotations

import os

from jupyterhub.auth import DummyAuthenticator
from traitlets import default


class DemoAuthenticator(DummyAuthenticator):
    """Any username, any password: demo and tests only (see the module docstring)."""

    login_service = "demo login (not for production)"

    @default("allow_all")
    def _default_allow_all(self):
        return True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if os.environ.get("GPUHUB_DEMO_LOGIN") != "1":
            raise RuntimeError(
                "DemoAuthenticator accepts any password and is for demos only; "
                "it runs only with GPUHUB_DEMO_LOGIN=1 on a loopback address"
            )
        self.log.warning("DEMO LOGIN: any username and password is accepted")
