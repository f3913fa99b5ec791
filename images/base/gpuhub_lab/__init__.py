"""GPU Cluster Hub in JupyterLab: the server half of the ``gpuhub-lab`` extension.

``GET <base url>gpuhub-lab/status`` answers what JupyterLab's status bar shows (the
frontend half, prebuilt in ``labextension/``, installed in the image as
``share/jupyter/labextensions/gpuhub-lab``): ``{"gpus": [...], "kernels": [...],
"error": ""}``, read from the hub with this server's own token (``JUPYTERHUB_API_TOKEN``),
so the browser never holds hub credentials:

- ``gpus``: the hub's ``GET /hub/api/gpuhub/gpus/mine``: the GPUs this server and its GPU
  kernels hold, with utilisation and memory (docs: reference/rest-api);
- ``kernels``: the hub's ``GET /hub/api/gpuhub/kernels``: this server's GPU kernels, each
  with its ``state``, its ``place`` in line while it waits and, once ended, why
  (``ended.message``); ``[]`` from a hub without GPU kernels;
- ``error``: why the hub could not be read, in words ("" when it was).

The hub is asked at most once per :data:`CACHE_SECONDS`, however many tabs poll.  Enabled
by ``/opt/venv/etc/jupyter/jupyter_server_config.d/gpuhub_lab.json`` (images/README.md,
"JupyterLab").
"""

from __future__ import annotations

from .status import HubStatus, StatusHandler

__all__ = ["HubStatus", "StatusHandler"]


def _jupyter_server_extension_points():
    return [{"module": "gpuhub_lab"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from jupyter_server.utils import url_path_join

    web_app = serverapp.web_app
    web_app.settings["gpuhub_lab_status"] = HubStatus.from_environment()
    route = url_path_join(web_app.settings["base_url"], "gpuhub-lab", "status")
    web_app.add_handlers(".*$", [(route, StatusHandler)])
