"""``gpuhub gpus`` asks the running hub for its board and answers like a tool: the devices
when a hub answers, one line and a non-zero exit when none does (hub_ext/cli.py)."""

from __future__ import annotations

import json
import re
import signal
import stat
import subprocess
import sys

import pytest

from hub_ext.ops.board import CLI_TOKEN_FILE


def gpuhub(hub, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", *args],
        capture_output=True,
        text=True,
        env=hub.env,
        timeout=60,
    )


@pytest.mark.docker
@pytest.mark.hub
async def test_gpuhub_gpus_prints_the_running_hubs_board_and_says_when_none_answers(hub_factory):
    hub = await hub_factory(GPUHUB_CREDITS="off")
    assert stat.S_IMODE((hub.state_dir / CLI_TOKEN_FILE).stat().st_mode) == 0o600
    await hub.create_user("alice")
    r = await hub.spawn("alice", {"profile": "pytorch"})
    assert r.status_code in (201, 202), r.text
    await hub.wait_ready("alice")

    table = gpuhub(hub, "gpus")
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("SIMULATED GPUs (no driver)")
    rows = [line for line in table.stdout.splitlines() if "GPU-" in line]
    assert len(rows) == 2
    assert sum(bool(re.search(r"\sheld\s.*alice \(pytorch, 0m\)$", row)) for row in rows) == 1
    assert sum(bool(re.search(r"\sfree\s.*-$", row)) for row in rows) == 1
    board = json.loads(gpuhub(hub, "gpus", "--json").stdout)
    assert board["summary"] == {"total": 2, "free": 1, "allocated": 1, "outside": 0, "unhealthy": 0}

    hub.kill(signal.SIGTERM)
    none = gpuhub(hub, "gpus")
    assert none.returncode == 1
    assert none.stdout == ""
    assert len(none.stderr.splitlines()) == 1, none.stderr
    assert none.stderr.startswith(
        f"gpuhub gpus: no hub answers at http://{hub.env['GPUHUB_HUB_IP']}:{hub.hub_port}"
        "/hub/api/gpuhub/gpus"
    )
    assert "Traceback" not in none.stderr


def test_gpuhub_gpus_without_any_hub_state_says_so(tmp_path):
    env = {"GPUHUB_STATE_DIR": str(tmp_path / "nowhere"), "PATH": "/usr/bin:/bin"}
    r = subprocess.run(
        [sys.executable, "-m", "hub_ext.cli", "gpus"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.startswith("gpuhub gpus: no hub token in ")
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
