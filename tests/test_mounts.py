"""The datasets setting both backends read (hub_ext.spawn.mounts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from traitlets import TraitError

from hub_ext.spawn.mounts import Datasets, member_datasets


def member(groups=(), admin=False):
    return SimpleNamespace(groups=[SimpleNamespace(name=g) for g in groups], admin=admin)


def test_a_plain_path_is_a_dataset_for_everyone():
    datasets = Datasets().validate(
        None, {"mnist": "/data/mnist", "imagenet": {"path": "/data/in", "groups": ["vision"]}}
    )
    assert member_datasets(datasets, member()) == {"mnist": "/data/mnist"}
    assert member_datasets(datasets, member(groups=["vision"])) == {
        "mnist": "/data/mnist",
        "imagenet": "/data/in",
    }
    assert member_datasets(datasets, member(admin=True)) == {
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
        Datasets().validate(None, datasets)
