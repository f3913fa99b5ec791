"""A skeleton backend: the shortest spawner the hub's lifecycle runs.

docs/howto/write-a-backend.md shows this file; tests/test_skeleton_backend.py runs it, so
the how-to cannot drift from the code.  Its servers are local processes and its "GPUs" a
count of units it hands out; a real backend asks its cluster instead.
"""

from __future__ import annotations

import asyncio
import sys

from jupyterhub.utils import random_port
from tornado import web
from traitlets import Int

from hub_ext.spawn.backend import Ended
from hub_ext.spawn.core import SpawnerCore
from hub_ext.spawn.page import GPUsNow

#: The units every skeleton server of this process shares: server key -> units held.
HELD: dict = {}


class SkeletonSpawner(SpawnerCore):
    """Answers the questions of hub_ext.spawn.backend.SpawnBackend."""

    units = Int(2, config=True, help="Units to hand out.")
    gpus = Int(0, config=True, help="Units per server; usually set per profile.")
    command = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1"]

    proc = None

    # what is free now: the spawn page, the gate
    async def gpu_snapshot(self):
        return sum(HELD.values())

    def gpus_now(self, snapshot, overrides) -> GPUsNow:
        count, free = overrides.get("gpus", self.gpus), self.units - snapshot
        why = "" if free >= count else f"No GPU free: all {self.units} GPUs are in use."
        return GPUsNow(count=count, free=free, total=self.units, refusal=why)

    def limits_of(self, overrides):
        return None, None

    async def image_facts(self, image):
        return {}

    @classmethod
    async def availability(cls, config, log):
        total = cls.units.default_value
        free = total - sum(HELD.values())
        return dict(
            inventory="skeleton",
            total=total,
            free=free,
            allocated=total - free,
            outside=0,
            unhealthy=0,
            error="",
        )

    @classmethod
    async def gpu_board(cls, handler):
        return {"inventory": "skeleton", "error": "", "devices": []}

    @classmethod
    async def held_gpus(cls, handler, user, servers):
        return []  # a real backend names each GPU the servers hold

    # a start
    async def check_start(self):
        """Everything refused before anything is taken."""
        refusal = self.gpus_now(await self.gpu_snapshot(), {}).refusal
        if refusal:
            raise web.HTTPError(409, refusal)

    async def reserve(self):
        HELD[self.server_key] = self.gpus

    async def launch(self):
        self.port = random_port()
        self.proc = await asyncio.create_subprocess_exec(*self.command, str(self.port))
        return "127.0.0.1", self.port

    async def abandon(self):
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    def release(self, why):
        HELD.pop(self.server_key, None)

    # a running server
    async def poll_server(self):
        if self.proc is None:
            return 0
        return self.proc.returncode

    async def why_ended(self, status):
        return Ended("gone", f"its process exited with code {status}")

    async def end(self, now=False):
        await self.abandon()
