"""The reservations' part of the hub's configuration: their custom scope, given to the
admin groups' role (``gpuhub-gpu-admins``) and to the ``gpuhub-cli`` token.

Called by :func:`hub_ext.config.apply_config` after :func:`hub_ext.ops.board.apply_admin_config`
(which makes those two roles).  A course's instructors get the same scope filtered to their
group in a role of their own, e.g. ``{"name": "ml101-instructors", "groups":
["ml101-instructors"], "scopes": ["custom:gpuhub:reservations:admin!group=ml101"]}``
(JupyterHub RBAC); the endpoints honour the filter (:mod:`.handlers`).
"""

from __future__ import annotations

from ..common.services import CLI_SERVICE, ROLE_NAME
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
    custom = dict(c.JupyterHub.custom_scopes) if "custom_scopes" in c.JupyterHub else {}
    custom[RESERVATIONS_SCOPE] = {
        "description": "Manage GPU reservations: list, create, edit and delete a group's "
        "reserved GPUs (filter with !group=<name> for one course).",
    }
    c.JupyterHub.custom_scopes = custom
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    found = set()
    for i, role in enumerate(roles):
        if role.get("name") in (ROLE_NAME, CLI_SERVICE):
            scopes = list(role.get("scopes", []))
            if RESERVATIONS_SCOPE not in scopes:
                scopes.append(RESERVATIONS_SCOPE)
            roles[i] = {**role, "scopes": scopes}
            if role["name"] == CLI_SERVICE:
                roles[i]["description"] = CLI_DESCRIPTION
            found.add(role["name"])
    missing = {ROLE_NAME, CLI_SERVICE} - found
    if missing:
        raise ValueError(
            f"roles {', '.join(sorted(missing))} missing: call "
            "apply_admin_config before apply_reservations_config"
        )
    c.JupyterHub.load_roles = roles
    if settings.reservation_warning < 0:
        raise ValueError(
            f"GPUHUB_RESERVATION_WARNING={settings.reservation_warning}: give "
            "the seconds before a reservation to warn members (0 or more)"
        )
    c.Reservations.warning = float(settings.reservation_warning)
