"""The line's part of the hub configuration: its settings, its service and endpoints."""

from __future__ import annotations

from pathlib import Path

from ..common.services import add_service, token_file

__all__ = ["LINE_SERVICE", "apply_line_config", "line_token"]

LINE_SERVICE = "gpuhub-line"
ROLE_NAME = "gpuhub-line"
#: what the line's service may do: start the waiting servers again after a restart
SCOPES = ("servers", "read:users:name")


def line_token(state_dir: Path) -> str:
    """The line service's API token, kept in ``<state dir>/gpuhub-line-token`` so that it
    is the same across restarts (:func:`hub_ext.common.services.token_file`: made mode 0600,
    a looser mode narrowed, an empty file refused with ValueError)."""
    return token_file(Path(state_dir) / "gpuhub-line-token")


def apply_line_config(c, settings) -> None:
    """``c.Line.*`` from the GPUHUB_LINE_* settings, the ``gpuhub-line`` service (its
    token, and a role to start servers), and the line's endpoints."""
    c.Line.max_wait = float(settings.line_max_wait)
    c.Line.fair_share_days = float(settings.line_fair_share_days)
    c.Line.backfill_age = float(settings.line_backfill_age)
    token = line_token(settings.state_dir)
    c.Line.api_token = token
    add_service(
        c,
        {"name": LINE_SERVICE, "api_token": token},
        {
            "name": ROLE_NAME,
            "description": "The line of GPU Cluster Hub: start waiting servers after a restart",
            "scopes": list(SCOPES),
        },
    )
