"""The hub's one clock: every part reads the time here, so that a test moves it in one
place (the pattern of jupyterhub-idle-culler's ``utcnow``).

The culler and the credits hook take their clock as a trait (``c.Culler.utcnow``,
``c.CreditsHook.utcnow``) whose default is :func:`utcnow`; the line and the GPU pool count
in seconds since the epoch (:func:`now`).
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["now", "utcnow"]


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


def now() -> float:
    """:func:`utcnow` as seconds since the epoch: the unit of the line's and the pool's
    times."""
    return utcnow().timestamp()
