"""What a member's server mounts besides its image, on either backend: where the workspace
appears (``c.SpawnerCore.workspace_mount``), and the shared datasets, read-only at
``/datasets/<name>``, chosen by the member's JupyterHub groups
(``c.SpawnerCore.datasets``, read by :class:`Datasets`).

Each backend mounts what :func:`member_datasets` returns its own way (Docker bind mounts:
:func:`hub_ext.docker.container.make_container`; bubblewrap binds in the Slurm batch job:
:func:`hub_ext.slurm.batch.make_batch_job`).
"""

from __future__ import annotations

import os

from tornado import web
from traitlets import Dict, TraitError

__all__ = ["Datasets", "checked_datasets", "member_datasets"]


class Datasets(Dict):
    """A trait of datasets: name -> {"path": host path, "groups": [JupyterHub groups]}, or
    name -> host path (everyone); each entry normalised to the first form.  Refuses a name
    that is not one folder name, or a path that is not absolute."""

    def validate(self, obj, value):
        value = super().validate(obj, value)
        datasets = {}
        for name, given in value.items():
            spec = {"path": given} if isinstance(given, str) else given
            if (
                not isinstance(spec, dict)
                or not isinstance(spec.get("path"), str)
                or not os.path.isabs(spec["path"])
            ):
                raise TraitError(
                    f"dataset {name!r}: want an absolute host path or "
                    f"{{'path': ..., 'groups': [...]}}, got {given!r}"
                )
            if not name or "/" in name or name in (".", ".."):
                raise TraitError(
                    f"dataset name {name!r}: want one folder name, mounted at /datasets/<name>"
                )
            datasets[name] = {"path": spec["path"], "groups": list(spec.get("groups") or [])}
        return datasets


def member_datasets(datasets: dict, user) -> dict[str, str]:
    """Dataset name -> host path, of ``datasets`` (as :class:`Datasets` keeps them) for
    ``user``'s groups (admins: all)."""
    groups = {g.name for g in getattr(user, "groups", [])}
    admin = bool(getattr(user, "admin", False))
    return {
        name: spec["path"]
        for name, spec in datasets.items()
        if not spec["groups"] or admin or groups & set(spec["groups"])
    }


def checked_datasets(datasets: dict, user, log, who: str = "") -> dict[str, str]:
    """:func:`member_datasets`, each path checked to exist on this host.  Raises
    ``HTTPError(500)`` with a sentence for the member when one is missing."""
    mine = member_datasets(datasets, user)
    for name, path in mine.items():
        if not os.path.isdir(path):
            log.error("Dataset %s of %s: host path %s does not exist", name, who, path)
            raise web.HTTPError(
                500,
                f"The dataset {name!r} is not available on this node right now. "
                "Ask an admin to check the datasets configuration.",
            )
    return mine
