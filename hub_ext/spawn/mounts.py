"""What a member's server mounts besides its image, on either backend: where the workspace
appears, and the shared datasets, read-only, chosen by the member's JupyterHub groups.

Both spawners mix :class:`MemberMounts` in through :class:`hub_ext.spawn.core.SpawnerCore`;
each backend mounts what it returns its own way (Docker bind mounts in
:mod:`hub_ext.docker.container`, bubblewrap binds in the Slurm batch script).
"""

from __future__ import annotations

import os

from tornado import web
from traitlets import Dict, TraitError, Unicode, validate
from traitlets.config import LoggingConfigurable


class MemberMounts(LoggingConfigurable):
    """The workspace's mount point and the datasets a member's server gets."""

    workspace_mount = Unicode(
        "/home/jovyan/work",
        config=True,
        help="""Where the workspace appears in the container.

            c.SpawnerCore.workspace_mount = "/home/jovyan/work"  # either backend
        """,
    )

    datasets = Dict(
        config=True,
        help="""Shared datasets, mounted read-only at ``/datasets/<name>``: name ->
        {"path": host path, "groups": [JupyterHub groups; empty or missing = everyone]},
        or name -> host path (everyone).  On Slurm the path is on the nodes' shared
        storage.  A missing host path is a spawn error, never created.  ``GPUHUB_DATASETS``
        (a JSON file of this mapping) sets it for either backend.

            c.SpawnerCore.datasets = {"imagenet": {"path": "/data/imagenet",
                                                   "groups": ["vision"]}}
        """,
    )

    @validate("datasets")
    def _validate_datasets(self, proposal) -> dict:
        """Each entry as ``{"path": ..., "groups": [...]}``.  Raises ``TraitError`` for a
        name that is not one folder name, or a path that is not absolute."""
        datasets = {}
        for name, given in proposal["value"].items():
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

    def member_datasets(self) -> dict[str, str]:
        """Dataset name -> host path, for the member's groups (admins: all)."""
        groups = {g.name for g in getattr(self.user, "groups", [])}
        admin = bool(getattr(self.user, "admin", False))
        return {
            name: spec["path"]
            for name, spec in self.datasets.items()
            if not spec["groups"] or admin or groups & set(spec["groups"])
        }

    def checked_datasets(self) -> dict[str, str]:
        """:meth:`member_datasets`, each path checked to exist on this host.  Raises
        ``HTTPError(500)`` with a sentence for the member when one is missing."""
        datasets = self.member_datasets()
        for name, path in datasets.items():
            if not os.path.isdir(path):
                self.log.error(
                    "Dataset %s of %s: host path %s does not exist", name, self._log_name, path
                )
                raise web.HTTPError(
                    500,
                    f"The dataset {name!r} is not available on this node right now. "
                    "Ask an admin to check the datasets configuration.",
                )
        return datasets
