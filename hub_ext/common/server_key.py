"""The key every part of the hub files a member's server under (pool, culler, line)."""

from __future__ import annotations

from typing import NamedTuple


class ServerKey(NamedTuple):
    """One server of one user (``""`` is the default server, as in JupyterHub)."""

    user: str
    server: str = ""

    def __str__(self) -> str:
        return f"{self.user}/{self.server}" if self.server else self.user
