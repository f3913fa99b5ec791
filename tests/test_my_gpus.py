"""Which servers' GPUs a request may read (:func:`hub_ext.ops.my_gpus.held_servers`): a
server's token reads its own and its GPU kernels', a member's token all of hers, nobody
another member's.  The hub itself: ``tests/test_my_gpus_hub.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from jupyterhub.scopes import Scope

from hub_ext.ops.my_gpus import held_servers, kernel_parent


def member(name: str, servers: dict) -> SimpleNamespace:
    """JupyterHub's ``User`` as :func:`held_servers` reads it: ``servers`` maps a server
    name to its ``user_options``."""
    spawners = {s: SimpleNamespace(user_options=o) for s, o in servers.items()}
    return SimpleNamespace(name=name, orm_spawners=spawners)


ALICE = member(
    "alice",
    {
        "": {"profile": "cpu"},
        "kernel-aaaaaaaaaaaa": {"profile": "gpu", "kernel": {"id": "a" * 12, "parent": ""}},
        "kernel-bbbbbbbbbbbb": {"profile": "gpu", "kernel": {"id": "b" * 12, "parent": "lab2"}},
        "lab2": {"profile": "cpu"},
        "job-cccccccccccc": {"profile": "gpu"},
        # not a kernel's name: its options do not make it one
        "sneaky": {"profile": "gpu", "kernel": {"parent": ""}},
    },
)


@pytest.mark.parametrize(
    "filters, expected",
    [
        pytest.param(
            {"server": {"alice/"}}, ["", "kernel-aaaaaaaaaaaa"], id="default-server-token"
        ),
        pytest.param(
            {"server": {"alice/lab2"}}, ["lab2", "kernel-bbbbbbbbbbbb"], id="named-server-token"
        ),
        pytest.param(
            {"server": {"alice/kernel-aaaaaaaaaaaa"}},
            ["kernel-aaaaaaaaaaaa"],
            id="the-kernels-own-token",
        ),
        pytest.param({"user": {"alice"}}, sorted(ALICE.orm_spawners), id="her-own-token"),
        pytest.param(Scope.ALL, sorted(ALICE.orm_spawners), id="unfiltered-still-hers"),
        pytest.param({"server": {"bob/"}}, [], id="another-members-server-token"),
        pytest.param({"user": {"bob"}}, [], id="another-members-token"),
        pytest.param({"server": {"alice/gone"}}, [], id="a-server-she-no-longer-has"),
        pytest.param({"group": {"ml101"}}, [], id="a-group-filter"),
    ],
)
def test_held_servers(filters, expected):
    assert held_servers(ALICE, filters) == expected


def test_a_service_holds_no_servers():
    assert held_servers(SimpleNamespace(name="svc", kind="service"), Scope.ALL) == []


@pytest.mark.parametrize(
    "options",
    [None, {}, {"kernel": "x"}, {"kernel": {"parent": 3}}, {"kernel": {}}, "text"],
)
def test_options_that_name_no_parent_make_no_kernel(options):
    assert kernel_parent("kernel-aaaaaaaaaaaa", options) is None
