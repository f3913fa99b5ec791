"""What the status bar shows, read from the hub with the server's own token (the package
doc)."""

from __future__ import annotations

import asyncio
import json
import os
import time

from jupyter_server.base.handlers import APIHandler
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

#: seconds an answer of the hub is reused (the hub's own NVML read is 2 s old at most)
CACHE_SECONDS = 2.0
#: seconds before a hub that does not answer is given up on, for this read
TIMEOUT_SECONDS = 10.0
NO_HUB = "This server was not started by a hub: there are no GPUs of the hub to show."
HUB_DOWN = "The hub does not answer; your GPU figures come back when it does."


class HubStatus:
    """Reads ``gpus/mine`` and ``kernels`` from the hub at ``api_url`` (``.../hub/api``)
    with ``token``; :meth:`read` never raises."""

    def __init__(self, api_url: str, token: str, client: AsyncHTTPClient | None = None):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.client = client
        self._answer: dict | None = None
        self._at = float("-inf")
        self._reading: asyncio.Future | None = None

    @classmethod
    def from_environment(cls) -> HubStatus:
        """The hub JupyterHub's spawner named (``JUPYTERHUB_API_URL``,
        ``JUPYTERHUB_API_TOKEN``)."""
        return cls(
            os.environ.get("JUPYTERHUB_API_URL", ""), os.environ.get("JUPYTERHUB_API_TOKEN", "")
        )

    async def read(self) -> dict:
        """``{"gpus", "kernels", "error"}``, at most :data:`CACHE_SECONDS` old; concurrent
        readers share one read of the hub."""
        if self._answer is not None and time.monotonic() - self._at < CACHE_SECONDS:
            return self._answer
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
        try:
            return await asyncio.shield(self._reading)
        finally:
            if self._reading is not None and self._reading.done():
                self._reading = None

    async def _read(self) -> dict:
        if not self.api_url or not self.token:
            answer = {"gpus": [], "kernels": [], "error": NO_HUB}
        else:
            (gpus, error), (kernels, _) = await asyncio.gather(
                self._get("/gpuhub/gpus/mine", "gpus"), self._get("/gpuhub/kernels", "kernels")
            )
            answer = {"gpus": gpus, "kernels": kernels, "error": error}
        self._answer, self._at = answer, time.monotonic()
        return answer

    async def _get(self, path: str, key: str) -> tuple[list, str]:
        """The list under ``key`` of the hub's answer at ``path``, and "" or why none."""
        client = self.client or AsyncHTTPClient()
        request = HTTPRequest(
            self.api_url + path,
            headers={"Authorization": f"token {self.token}"},
            request_timeout=TIMEOUT_SECONDS,
        )
        try:
            response = await client.fetch(request)
            found = json.loads(response.body).get(key)
            return (found if isinstance(found, list) else []), ""
        except HTTPClientError as e:
            if e.code in (599,):
                return [], HUB_DOWN
            if e.code == 404:  # a hub without this part (GPU kernels): nothing to show
                return [], ""
            return [], _message(e) or f"The hub answered {e.code}."
        except (OSError, ValueError, AttributeError):
            return [], HUB_DOWN


def _message(error: HTTPClientError) -> str:
    """The hub's sentence (``{"message"}``) of an error answer, or ""."""
    try:
        return str(json.loads(error.response.body)["message"])
    except (AttributeError, TypeError, ValueError, KeyError):
        return ""


class StatusHandler(APIHandler):
    """``GET <base url>gpuhub-lab/status``: :meth:`HubStatus.read`."""

    @web.authenticated
    async def get(self):
        status = await self.settings["gpuhub_lab_status"].read()
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(status))
