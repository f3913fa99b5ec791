"""The GPU board's rows, without a hub: devices and allocations in, JSON-ready rows out."""

from __future__ import annotations

from datetime import UTC, datetime

from hub_ext.docker.board import board
from hub_ext.docker.inventory import devices_from_json
from hub_ext.docker.pool import Allocation, ServerKey

SINCE = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
NODE = {
    "devices": [
        {
            "uuid": "GPU-held",
            "utilization_gpu": 37,
            "memory_used_mib": 900,
            "memory_total_mib": 16384,
        },
        {"uuid": "GPU-orphan"},
        {"uuid": "GPU-outside", "processes": [{"pid": 4242, "used_memory_mib": 100}]},
        {"uuid": "GPU-lost", "lost": True},
        {
            "uuid": "GPU-mig",
            "mig_mode": True,
            "mig_devices": [{"uuid": "MIG-a", "profile": "1g.5gb"}],
        },
    ]
}
HELD = {
    "GPU-held": Allocation(
        ServerKey("ada lovelace", "big/run"), ("GPU-held",), SINCE.timestamp(), "pytorch"
    ),
    "GPU-orphan": Allocation(
        ServerKey("bob"), ("GPU-orphan",), SINCE.timestamp(), "gpu", known=False
    ),
}


def rows() -> dict[str, dict]:
    view = {
        ServerKey("ada lovelace", "big/run"): {
            "limits": {"gpu_idle_timeout": 2700},
            "gpu_idle_for": 60.0,
        }
    }
    found = board(devices_from_json(NODE), HELD.get, {"GPU-held": SINCE}, view.get, "/hub/")
    return {row["uuid"]: row for row in found}


def test_held_device_names_its_server_profile_and_stop_url():
    held = rows()["GPU-held"]
    assert (held["state"], held["utilization_pct"], held["memory_used_mib"]) == ("held", 37, 900)
    assert held["last_busy"] == "2026-01-05T09:00:00+00:00"
    assert held["owner"] == {
        "user": "ada lovelace",
        "server": "big/run",
        "profile": "pytorch",
        "since": "2026-01-05T09:00:00+00:00",
        "known": True,
        "stop_url": "/hub/api/users/ada%20lovelace/servers/big%2Frun",
        "limits": {"gpu_idle_timeout": 2700},
        "gpu_idle_for": 60.0,
    }


def test_every_other_state_has_its_row():
    found = rows()
    assert found["GPU-orphan"]["owner"]["stop_url"] is None  # no server the hub could stop
    assert found["GPU-orphan"]["owner"]["known"] is False
    assert found["GPU-outside"]["state"] == "outside"
    assert found["GPU-outside"]["processes"] == [{"pid": 4242, "used_memory_mib": 100}]
    assert (found["GPU-lost"]["state"], found["GPU-lost"]["utilization_pct"]) == ("unhealthy", None)
    assert "GPU-lost" in found and "GPU-mig" not in found  # MIG GPUs show their slices
    assert found["MIG-a"]["mig_profile"] == "1g.5gb"
    assert found["MIG-a"]["last_busy"] is None
