"""JupyterLab's assets reach the browser compressed, through the hub's proxy.

A real hub and configurable-http-proxy, alice's server in the notebook image
(``GPUHUB_TEST_IMAGE``, default ``gpuhub/base:latest``), whose
``/etc/jupyter/jupyter_server_config.json`` turns on tornado's ``compress_response``
(images/README.md, "Start-up").  The click-to-lab time this saves on a slow link is
measured by ``benchmarks/lab_load.py`` (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import re

import pytest

from tests.fixtures.hub import NOTEBOOK_IMAGE

pytestmark = [pytest.mark.docker, pytest.mark.hub]


async def test_jupyterlabs_javascript_comes_gzipped_through_the_proxy(hub_factory, tmp_path):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(
        json.dumps(
            [{"display_name": "CPU", "slug": "cpu", "spawner_override": {"image": NOTEBOOK_IMAGE}}]
        )
    )
    hub = await hub_factory(GPUHUB_PROFILES=str(profiles))
    token = await hub.create_user("alice")
    r = await hub.spawn("alice")
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")
    browser = {"Authorization": f"token {token}", "Accept-Encoding": "gzip, deflate, br"}
    page = await hub.client.get("/user/alice/lab", headers=browser)
    assert page.status_code == 200, page.text[:500]
    [bundle] = re.findall(r'src="(/user/alice/static/lab/main\.[0-9a-f]+\.js)', page.text)
    async with hub.client.stream("GET", bundle, headers=browser) as answer:
        assert answer.status_code == 200
        body = await answer.aread()  # decoded
        sent = answer.num_bytes_downloaded  # as it came over the wire
    assert answer.headers.get("content-encoding") == "gzip", dict(answer.headers)
    assert "Accept-Encoding" in answer.headers.get("vary", "")
    assert len(body) > 100_000 and sent < 0.4 * len(body), (sent, len(body))
    # a client that takes no compression gets the file as it is
    plain = await hub.client.get(bundle, headers={**browser, "Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.content == body
