"""The hub's own services (``c.JupyterHub.services``) and the roles that give them scopes."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = [
    "CLI_SERVICE",
    "CLI_TOKEN_FILE",
    "ROLE_NAME",
    "add_service",
    "grant_member_scope",
    "token_file",
]

#: The role of the hub's GPU admins (:mod:`hub_ext.ops.board`), which other parts add scopes to.
ROLE_NAME = "gpuhub-gpu-admins"
#: The service (no process, a token only) that ``gpuhub gpus`` and ``gpuhub reservations``
#: act as.
CLI_SERVICE = "gpuhub-cli"
#: Its token, in the state dir (mode 0600), made at the hub's first start.
CLI_TOKEN_FILE = "gpuhub-cli-token"


def add_service(c, service: dict, role: dict) -> None:
    """Add ``service`` (replacing one of the same name) and ``role`` (likewise), the role
    given to that service (JupyterHub docs, "Services" and "JupyterHub RBAC")."""
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    c.JupyterHub.services = [s for s in services if s.get("name") != service["name"]] + [service]
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    c.JupyterHub.load_roles = [r for r in roles if r.get("name") != role["name"]] + [
        {**role, "services": [service["name"]]}
    ]


def define_scope(c, name: str, description: str) -> None:
    """Declare the custom scope ``name`` (``c.JupyterHub.custom_scopes``, JupyterHub RBAC),
    keeping those declared before."""
    custom = dict(c.JupyterHub.custom_scopes) if "custom_scopes" in c.JupyterHub else {}
    custom[name] = {"description": description}
    c.JupyterHub.custom_scopes = custom


def grant_scope(c, scopes: dict[str, str], needed: set[str], caller: str) -> set[str]:
    """Add to each role named in ``scopes`` ({role name: scope}) its scope, once, in
    ``c.JupyterHub.load_roles``; returns the names of the roles found.  Raises ValueError
    naming the roles of ``needed`` that are not there yet and ``caller`` (the function
    to call after ``hub_ext.ops.board.apply_admin_config``, which makes the admins' and
    the CLI's)."""
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    found = set()
    for i, role in enumerate(roles):
        scope = scopes.get(role.get("name"))
        if scope is not None:
            have = list(role.get("scopes", []))
            roles[i] = {**role, "scopes": have if scope in have else [*have, scope]}
            found.add(role["name"])
    missing = needed - found
    if missing:
        raise ValueError(
            f"roles {', '.join(sorted(missing))} missing: call apply_admin_config before {caller}"
        )
    c.JupyterHub.load_roles = roles
    return found


def grant_member_scope(c, scope: str, description: str, caller: str) -> str:
    """Declare the custom scope ``scope`` of the members' own things (notebook jobs, GPU
    kernels) and give it filtered ``!user`` to JupyterHub's default ``user`` role (made
    when the configuration has none), unfiltered to ``gpuhub-gpu-admins`` and
    ``gpuhub-cli``; returns the filtered scope (what the servers' tokens get too).
    Raises ValueError naming ``caller`` when the admin roles are not made yet."""
    define_scope(c, scope, description)
    member = f"{scope}!user"
    found = grant_scope(
        c, {ROLE_NAME: scope, CLI_SERVICE: scope, "user": member}, {ROLE_NAME, CLI_SERVICE}, caller
    )
    if "user" not in found:  # JupyterHub's default user role: every member, her own things
        c.JupyterHub.load_roles = [
            *c.JupyterHub.load_roles,
            {"name": "user", "scopes": ["self", member]},
        ]
    return member


def token_file(path: Path) -> str:
    """The token kept in ``path``, made (64 hex characters, mode 0600) when missing.

    An existing file with looser permissions is narrowed to 0600.  Raises ValueError for an
    empty file.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"{path} is empty; delete it to make a new token") from None
        return token
    token = secrets.token_hex(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token
