"""The backends a hub runs on (``GPUHUB_BACKEND``), and what the core asks of one outside
its spawner.

The core names a backend only by an import string, as JupyterHub names its spawner
(``c.JupyterHub.spawner_class``): no core module imports ``hub_ext.docker`` or
``hub_ext.slurm`` (``tests/test_layout.py``).  The spawner's own seams are
:class:`hub_ext.spawn.core.SpawnerCore`, :class:`hub_ext.spawn.page.SpawnPage` and
:class:`hub_ext.line.LineBackend`.
"""

from __future__ import annotations

#: ``GPUHUB_BACKEND`` -> its :class:`Backend`.
BACKENDS = {
    "docker": "hub_ext.docker.hubconfig.DockerBackend",
    "slurm": "hub_ext.slurm.config.SlurmBackend",
}


class Backend:
    """One backend's part of the hub's configuration and of ``gpuhub usage``.

    :meth:`apply_config` and :meth:`profile_node` are required; :meth:`check_files`,
    :meth:`reach`, :meth:`check_profiles` and :meth:`read_accounting` are optional.
    """

    #: The import string of the backend's spawner class (``c.JupyterHub.spawner_class``).
    spawner_class = ""

    def profile_keys(self) -> tuple[str, ...]:
        """The keys a profile's ``spawner_override`` may set on this backend: its spawner's
        ``_overridable`` (the Slurm spawner's ``req_partition`` is not Docker's)."""
        from traitlets.utils.importstring import import_item

        return import_item(self.spawner_class)._overridable

    def apply_config(self, c, settings) -> None:
        """Set the backend's own settings on the JupyterHub config ``c``: its spawner class
        and the traits only its spawner has (``c.<its spawner class>.*``), after the core
        set the shared ones on ``c.SpawnerCore`` and ``c.Spawner``.  Raises ValueError
        naming the ``GPUHUB_*`` variable of a setting that cannot work."""
        raise NotImplementedError

    def profile_node(self, settings, ask: bool):
        """The node the built-in profiles' memory and CPU limits are derived from
        (:class:`hub_ext.common.limits.Node`, :func:`~hub_ext.common.limits.limited_profiles`),
        so that they fit what this backend runs them on; None leaves them without limits
        (the backend's own defaults apply).  ``ask``: whether the backend may be asked
        (the hub loading its configuration, ``gpuhub config check --reach``; not a plain
        ``check``)."""
        raise NotImplementedError

    def check_profiles(self, settings, profiles: list[dict], timeout: float) -> list[str]:
        """Optional: for ``gpuhub config check --reach``, one sentence per profile (or
        choice of its options) that can never start on what this backend has (its memory,
        CPUs and GPUs: :func:`hub_ext.common.limits.misfit`), naming the profile and why;
        ``[]`` (the default) when all can, or when there is nothing to ask."""
        return []

    def check_files(self, settings) -> list[str]:
        """Optional: for ``gpuhub config check``, what is wrong with the files only this
        backend reads, one sentence each naming the ``GPUHUB_*`` variable; ``[]`` (the
        default) when it reads none or all are good."""
        return []

    def reach(self, settings, timeout: float) -> list[str]:
        """Optional: for ``gpuhub config check --reach``, whether what this backend drives
        answers within ``timeout`` seconds (the Docker engine, Slurm's controller): one
        sentence per part that does not, and an ``ok:`` line printed for each that does;
        ``[]`` (the default) when there is nothing to ask."""
        return []

    def read_accounting(self, settings, runs: list):
        """Optional: the backend's own record of ``runs`` (:class:`hub_ext.common.runs.Run`) for
        ``gpuhub usage``, an object with ``jobs`` ({run id: job}), ``note`` (a sentence or
        ``""``) and ``failed`` (bool); None (the default) when it keeps none."""
        return None


def backend(name: str) -> Backend:
    """The backend called ``name`` (``docker``, ``slurm``); raises ValueError naming
    ``GPUHUB_BACKEND`` for another."""
    from traitlets.utils.importstring import import_item

    if name not in BACKENDS:
        raise ValueError(f"GPUHUB_BACKEND={name!r}: use " + " or ".join(repr(n) for n in BACKENDS))
    return import_item(BACKENDS[name])()


def reason(e: BaseException, limit: int = 300) -> str:
    """An exception in at most ``limit`` characters, for a one-line report."""
    text = str(e) or type(e).__name__
    return text if len(text) < limit else text[:limit] + "..."
