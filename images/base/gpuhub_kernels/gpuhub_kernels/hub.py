"""The hub's GPU kernels API as a member's server reaches it: one request helper.

``api_url`` and ``token`` default to ``$JUPYTERHUB_API_URL`` and ``$JUPYTERHUB_API_TOKEN``,
which JupyterHub gives every server it starts: the server's own token, whose scope
``custom:gpuhub:kernels!user`` lets it manage the kernels it started and no others (docs:
reference/kernels-api).  Never Docker's socket, never Slurm's credentials.
"""

from __future__ import annotations

import json
import os

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

__all__ = ["HubKernels", "HubRefused", "HubUnreachable"]


class HubRefused(Exception):
    """The hub answered 4xx/5xx: ``status``, and ``str()`` its ``message`` for the member."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class HubUnreachable(Exception):
    """The hub did not answer; ``str()`` says so in words."""


class HubKernels:
    """``/hub/api/gpuhub/kernels`` with this server's token.  Every method is async and
    raises :class:`HubRefused` or :class:`HubUnreachable`; timeouts in seconds."""

    def __init__(self, api_url: str | None = None, token: str | None = None, timeout: float = 20):
        self.api_url = (api_url or os.environ.get("JUPYTERHUB_API_URL", "")).rstrip("/")
        self.token = token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
        self.timeout = timeout

    async def request(self, method: str, path: str, body: dict | None = None):
        """``method`` on ``/gpuhub/kernels<path>``; the decoded JSON answer (None for 204)."""
        if not self.api_url or not self.token:
            raise HubUnreachable("This server was not started by a hub (no JUPYTERHUB_API_URL).")
        request = HTTPRequest(
            f"{self.api_url}/gpuhub/kernels{path}",
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=json.dumps(body) if body is not None else None,
            request_timeout=self.timeout,
            connect_timeout=min(self.timeout, 5),
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as e:
            raise HubUnreachable(f"The hub cannot be reached ({e}).") from None
        if response.code == 599:
            raise HubUnreachable(f"The hub did not answer ({response.error}).")
        if response.code == 204:
            return None
        try:
            answer = json.loads(response.body or b"null")
        except ValueError:
            answer = None
        if response.code >= 400:
            message = answer.get("message") if isinstance(answer, dict) else None
            raise HubRefused(message or f"The hub answered {response.code}.", response.code)
        return answer

    async def specs(self) -> list[dict]:
        return await self.request("GET", "/specs")

    async def create(self, profile: str, notebook: str, cwd: str, connection_dir: str) -> dict:
        body = {"profile": profile, "notebook": notebook, "cwd": cwd}
        return await self.request("POST", "", {**body, "connection_dir": connection_dir})

    async def get(self, kernel_id: str, check: bool = False) -> dict:
        """The kernel's model; ``check``: the hub looks at its container first (the
        server found it gone)."""
        return await self.request("GET", f"/{kernel_id}" + ("?check=1" if check else ""))

    async def delete(self, kernel_id: str) -> None:
        await self.request("DELETE", f"/{kernel_id}")
