"""Reading Slurm's own words: GRES strings (sinfo) and start-time estimates (squeue)."""

from __future__ import annotations

from datetime import datetime

import pytest

from hub_ext.slurm.cluster import Node, parse_gres, parse_gres_request
from hub_ext.slurm.line import seconds_until


@pytest.mark.parametrize("text, counts", [
    pytest.param("gpu:2", {"": 2}, id="untyped"),
    pytest.param("gpu:a100:2(S:0-1)", {"a100": 2}, id="typed-with-sockets"),
    pytest.param("gpu:a100:1(IDX:0),gpu:t4:2(IDX:0-1)", {"a100": 1, "t4": 2}, id="two-types"),
    pytest.param("gpu:1g.5gb:3", {"1g.5gb": 3}, id="mig-type"),
    pytest.param("(null)", {}, id="none"),
    pytest.param("gpu:0", {"": 0}, id="none-used"),
    pytest.param("mps:100,gpu:1", {"": 1}, id="not-a-gpu-left-out"),
])
def test_gres_strings_read_as_counts_per_type(text, counts):
    assert parse_gres(text) == counts


def test_a_profiles_gres_request_is_a_type_and_a_count():
    assert parse_gres_request("gpu:a100:2") == ("a100", 2)
    assert parse_gres_request("gpu:1") == ("", 1)
    assert parse_gres_request("") == ("", 0)


def test_a_drained_node_has_no_free_gpus():
    node = Node("node1", ["gpu"], "drained", {"": 2}, {"": 0})
    assert node.free() == 0
    assert Node("node2", ["gpu"], "mixed", {"a100": 2}, {"a100": 1}).free("a100") == 1


def test_slurms_start_time_becomes_seconds_from_now():
    now = datetime(2026, 11, 23, 12, 0, 0)
    assert seconds_until("2026-11-23T12:09:01", now) == 541
    assert seconds_until("2026-11-23T11:59:00", now) == 0
    assert seconds_until("N/A", now) is None
    # what Slurm's backfill says of a job it cannot place: a year ahead
    assert seconds_until("2027-11-23T12:00:00", now) is None
