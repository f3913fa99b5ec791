"""The hub's periodic passes stop at the start of its shutdown (hub_ext/common/periodic.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hub_ext.common import periodic

log = logging.getLogger("test")


@pytest.fixture(autouse=True)
def fresh_passes(monkeypatch):
    """Each test gets its own registry of passes (the module keeps one per hub process)."""
    monkeypatch.setattr(periodic, "_tasks", set())
    monkeypatch.setattr(periodic, "_in_pass", set())
    monkeypatch.setattr(periodic, "_stopping", False)


def started(step, seconds: float = 0.01, **kw) -> asyncio.Task:
    return periodic.ensure_task(
        None, lambda: periodic.every(lambda: seconds, step, log, "test pass", **kw)
    )


async def test_a_waiting_pass_is_cancelled_and_a_pass_under_way_ends(caplog):
    passes, ended = [], []

    async def idle():
        passes.append("idle")

    async def busy():
        await asyncio.sleep(0.2)
        ended.append("busy")

    waiting = started(idle, seconds=3600)  # first pass done, now waiting an hour
    under_way = started(busy, first_now=True)
    await asyncio.sleep(0.05)
    caplog.set_level(logging.INFO)
    await periodic.stop_passes(log, grace=30)
    assert waiting.cancelled()
    assert ended == ["busy"] and under_way.done() and not under_way.cancelled()
    assert "Stopping the hub's 2 periodic passes (1 under way" in caplog.text


async def test_a_pass_longer_than_the_grace_is_cancelled():
    async def hangs():
        await asyncio.sleep(3600)

    task = started(hangs, first_now=True)
    await asyncio.sleep(0.01)
    await periodic.stop_passes(log, grace=0.05)
    assert task.cancelled()


async def test_no_pass_starts_once_the_hub_shuts_down():
    async def step():
        pass

    await periodic.stop_passes(log)
    assert started(step) is None


async def test_the_hubs_cleanup_begins_with_stopping_the_passes():
    order = []

    class App:
        log = logging.getLogger("app")

        async def cleanup(self):
            order.append(("cleanup", periodic._stopping))

    app = App()
    periodic.stop_passes_first(app)
    periodic.stop_passes_first(app)  # a second wrap is a no-op
    await app.cleanup()
    assert order == [("cleanup", True)]
