"""The reservations' part of the hub's configuration: their custom scope, given to the
admin groups' role (``gpuhub-gpu-admins``) and to the ``gpuhub-cli`` token.

Called by :func:`hub_ext.config.apply_config` after :func:`hub_ext.ops.board.apply_admin_config`
(which makes those two roles).  A course's instructors get the same scope filtered to their
group in a role of their own, e.g. ``{"name": "ml101-instructors", "groups":
["ml101-instructors"], "scopes": ["custom:gpuhub:reservations:admin!group=ml101"]}``
(JupyterHub RBAC); the endpoints honour the filter (:mod:`.handlers`).
"""

from __future__ import annotations

from ..common.services import CLI_SERVICE, ROLE_NAME, define_scope, grant_scope
from .handlers import RESERVATIONS_SCOPE

__all__ = ["apply_reservations_config"]

CLI_DESCRIPTION = (
    "gpuhub gpus and gpuhub reservations on the hub's machine: read the GPU "
    "board, manage reservations"
)


def apply_reservations_config(c, settings) -> None:
    """Define ``custom:gpuhub:reservations:admin`` and add it to the roles
    ``gpuhub-gpu-admins`` and ``gpuhub-cli``; set ``c.Reservations.warning`` from
    ``GPUHUB_RESERVATION_WARNING``.  Raises ValueError when
    :func:`hub_ext.ops.board.apply_admin_config` has not made the roles yet, or for a negative
    warning."""
    define_scope(
        c,
        RESERVATIONS_SCOPE,
        "Manage GPU reservations: list, create, edit and delete a group's "
        "reserved GPUs (filter with !group=<name> for one course).",
    )
    needed = {ROLE_NAME, CLI_SERVICE}
    grant_scope(c, dict.fromkeys(needed, RESERVATIONS_SCOPE), needed, "apply_reservations_config")
    c.JupyterHub.load_roles = [
        {**r, "description": CLI_DESCRIPTION} if r.get("name") == CLI_SERVICE else r
        for r in c.JupyterHub.load_roles
    ]
    if settings.reservation_warning < 0:
        raise ValueError(
            f"GPUHUB_RESERVATION_WARNING={settings.reservation_warning}: give "
            "the seconds before a reservation to warn members (0 or more)"
        )
    c.Reservations.warning = float(settings.reservation_warning)
