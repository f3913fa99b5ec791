"""The hub's own services (``c.JupyterHub.services``) and the roles that give them scopes."""

from __future__ import annotations

__all__ = ["add_service"]


def add_service(c, service: dict, role: dict) -> None:
    """Add ``service`` (replacing one of the same name) and ``role`` (likewise), the role
    given to that service (JupyterHub docs, "Services" and "JupyterHub RBAC")."""
    services = list(c.JupyterHub.services) if "services" in c.JupyterHub else []
    c.JupyterHub.services = [s for s in services if s.get("name") != service["name"]] + [
        service]
    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    c.JupyterHub.load_roles = [r for r in roles if r.get("name") != role["name"]] + [
        {**role, "services": [service["name"]]}]
