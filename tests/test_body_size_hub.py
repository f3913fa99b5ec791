"""The hub does not buffer huge request bodies from anyone (security review of issue 21).

JupyterHub serves its routes with tornado's default ``max_body_size`` (100 MiB) and tornado
reads a whole body into memory before the handler authenticates: a client with no token,
through the public proxy, makes the hub hold every body it sends at once.  The hub's API
bodies are small (``user_options`` over 8 KiB are refused anyway; the port report is
``{"port": n}``), so the hub reads at most 1 MiB (``hub_ext.ops.serving.limit_request_bodies``).
Here four concurrent 32 MiB posts without a token to the port-report route are sent, and
the hub's peak memory (``VmHWM``) must not grow by what they carry.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

BODY_MIB, POSTS = 32, 4


def peak_kib(pid: int) -> int:
    """The process's peak resident memory (``VmHWM``), KiB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.mark.docker
@pytest.mark.hub
async def test_the_hub_does_not_buffer_huge_bodies_without_a_token(hub_factory, tmp_path):
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps([{"display_name": "CPU", "slug": "cpu", "default": True}]))
    hub = await hub_factory(GPUHUB_CREDITS="off", GPUHUB_PROFILES=str(profiles))
    before = peak_kib(hub.proc.pid)
    body = b"x" * (BODY_MIB * 2**20)
    async with httpx.AsyncClient(base_url=hub.url, timeout=120) as client:
        answers = await asyncio.gather(
            *[client.post("/hub/api/batchspawner", content=body) for _ in range(POSTS)],
            return_exceptions=True,
        )
    # refused (413, or the connection closed) rather than read
    grown_mib = (peak_kib(hub.proc.pid) - before) / 1024
    assert (await hub.client.get("/hub/api/")).status_code == 200  # the hub still answers
    assert grown_mib < BODY_MIB, (
        f"the hub's peak memory grew {grown_mib:.0f} MiB for {POSTS} posts of {BODY_MIB} MiB "
        f"without a token; answers: {[getattr(a, 'status_code', a) for a in answers]}"
    )
