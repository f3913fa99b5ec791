"""The spawn lifecycle written once (hub_ext.spawn.core.SpawnerCore) on the how-to's skeleton
backend (tests/skeleton_backend.py, docs/howto/write-a-backend.md): the steps in their
order, a refusal that takes nothing, a stop that settles once, a server that ends by itself,
a failed launch given back.  No Docker, no Slurm: local processes and a count of units."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from tornado import web
from traitlets.config import SingletonConfigurable

from hub_ext.spawn.hooks import Hook
from tests import skeleton_backend
from tests.fixtures.members import fake_user
from tests.skeleton_backend import SkeletonSpawner


class Recorder(Hook, SingletonConfigurable):
    """A hook that writes down what the lifecycle asks of it, and why a server stopped."""

    name = "record"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls: list[str] = []

    async def before_reserve(self, spawner):
        self.calls.append("before_reserve")

    async def before_container(self, spawner):
        self.calls.append(f"debit {sorted(skeleton_backend.HELD.items())}")

    async def undo(self, spawner):
        self.calls.append("undo")

    async def after_stop(self, spawner):
        self.calls.append(f"after_stop {spawner.stop_reason} {spawner.stop_detail}")


@pytest.fixture
def recorder():
    skeleton_backend.HELD.clear()
    hook = Recorder()
    yield hook
    skeleton_backend.HELD.clear()


def spawner(recorder, name="ann", **traits) -> SkeletonSpawner:
    return SkeletonSpawner(
        user=fake_user(name),
        before_container_hooks=[recorder],
        workloads=[],
        units=1,
        gpus=1,
        **traits,
    )


async def answers(port: int) -> bool:
    for _ in range(100):
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"http://127.0.0.1:{port}/")).status_code == 200
        except httpx.HTTPError:
            await asyncio.sleep(0.05)
    return False


async def test_a_start_runs_the_steps_in_order_and_a_stop_settles_once(recorder):
    ann = spawner(recorder)
    ip, port = await ann.start()
    assert await answers(port)
    assert recorder.calls == ["before_reserve", "debit [(ServerKey(user='ann', server=''), 1)]"]
    await ann.stop()
    await ann.stop()  # JupyterHub may stop twice: the hooks are idempotent, released once
    assert recorder.calls[2:] == ["after_stop None None", "after_stop None None"]
    assert skeleton_backend.HELD == {}
    assert await ann.poll() is not None


async def test_a_start_refused_for_capacity_takes_nothing(recorder):
    ann, bob = spawner(recorder), spawner(recorder, "bob")
    await ann.start()
    with pytest.raises(web.HTTPError) as refused:
        await bob.start()
    assert (refused.value.status_code, refused.value.jupyterhub_message) == (
        409,
        "No GPU free: all 1 GPUs are in use.",
    )
    assert recorder.calls == ["before_reserve", recorder.calls[1], "before_reserve"]
    assert list(skeleton_backend.HELD) == [ann.server_key]
    await ann.stop()


async def test_a_server_that_ends_by_itself_is_settled_from_poll(recorder):
    ann = spawner(recorder)
    await ann.start()
    ann.proc.kill()
    await ann.proc.wait()
    assert await ann.poll() == -9
    assert recorder.calls[-1] == "after_stop gone its process exited with code -9"
    assert skeleton_backend.HELD == {}
    assert (ann.stop_reason, ann.hook_state) == (None, {})


async def test_a_launch_that_fails_gives_back_what_the_start_took(recorder):
    ann = spawner(recorder)
    ann.command = ["/nonexistent/server"]
    with pytest.raises(FileNotFoundError):
        await ann.start()
    assert recorder.calls[-1] == "undo"
    assert skeleton_backend.HELD == {}
