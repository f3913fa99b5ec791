"""The datasets setting both backends read (hub_ext.spawn.mounts.MemberMounts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets import TraitError

from hub_ext.spawn.mounts import MemberMounts


def mounts(datasets: dict, groups=(), admin=False) -> MemberMounts:
    m = MemberMounts(datasets=datasets)
    m.user = SimpleNamespace(groups=[SimpleNamespace(name=g) for g in groups], admin=admin)
    return m


def test_a_plain_path_is_a_dataset_for_everyone():
    m = mounts({"mnist": "/data/mnist", "imagenet": {"path": "/data/in", "groups": ["vision"]}})
    assert m.member_datasets() == {"mnist": "/data/mnist"}
    assert mounts(m.datasets, groups=["vision"]).member_datasets() == {
        "mnist": "/data/mnist",
        "imagenet": "/data/in",
    }
    assert mounts(m.datasets, admin=True).member_datasets() == {
        "mnist": "/data/mnist",
        "imagenet": "/data/in",
    }


@pytest.mark.parametrize(
    "datasets",
    [
        {"mnist": "data/mnist"},  # relative: relative to what, on a node?
        {"mnist": {"groups": ["vision"]}},  # no path
        {"../etc": "/data/x"},  # would land outside /datasets
        {"a/b": "/data/x"},
        {"mnist": 3},
    ],
)
def test_a_dataset_that_cannot_be_mounted_is_a_configuration_error(datasets):
    with pytest.raises(TraitError, match="dataset"):
        MemberMounts(datasets=datasets)
