"""What a server runs: a :class:`Workload`, one small description per kind.

An interactive server (:class:`Server`, the default), a notebook job
(:class:`hub_ext.jobs.workload.NotebookJob`, ``user_options["job"]``) and a GPU kernel
(:class:`hub_ext.kernels.workload.GPUKernel`, ``user_options["kernel"]``) go through the
same lifecycle (docs/explanation/spawn.md); what differs between them is
described here: the command in place of ``jupyterhub-singleuser``, its environment and
labels, whether it waits in line without being asked, what it sets over its profile (the
cullers' time-outs), how its end reads and what the ledger names.  The kinds other than
the server are registered by import string (``c.SpawnerCore.workloads``), as hooks are, so
the core names no package above it.
"""

from __future__ import annotations

from traitlets.utils.importstring import import_item

__all__ = ["Server", "Workload", "workload_classes"]


class Workload:
    """One kind of server.  A subclass sets the class attributes and may override the
    methods; an instance holds one start's ``value`` (its ``user_options[option]``)."""

    #: the ``user_options`` key that asks for this kind (None: the interactive server)
    option: str | None = None
    #: a word in the names the backends give it (a Slurm job's name: ``gpuhub-<kind>-...``);
    #: "" for the interactive server
    kind = ""
    #: what members call several of them ("notebook jobs"), in refusals
    noun = "servers"
    #: the command in place of the server's own (on the image's PATH); None: the server's
    command: tuple[str, ...] | None = None
    #: it waits in the line for its GPUs without ``user_options["wait"]``
    waits = False
    #: its process ends by itself when its work is done (a notebook job's runner), so a
    #: server found ended is its normal end, recorded as ``ended_reason``
    ends_by_itself = False
    #: how a run that ended without the hub is recorded (``gone``: lost without a stop;
    #: ``job_ended``: its process ended)
    ended_reason = "gone"

    def __init__(self, value=None):
        self.value = value

    @classmethod
    def parse(cls, value) -> Workload:
        """This kind for ``user_options[option]`` (untrusted).  Raises ValueError with a
        sentence for the member (the start is refused with HTTP 400) when it is not one."""
        return cls(value)

    def environment(self, workspace_mount: str, exits_after_report: bool) -> dict:
        """Variables of its own in the server's environment."""
        return {}

    def labels(self) -> dict:
        """Labels of its own on the server's container (without the ``io.gpuhub.``
        prefix)."""
        return {}

    def max_seconds(self) -> int:
        """Its longest run in seconds (0: none of its own), for a scheduler's time limit."""
        return 0

    def overrides(self) -> dict:
        """Spawner traits it sets over its profile's (a notebook job turns the cullers'
        time-outs off: nobody browses it)."""
        return {}

    def ledger(self, display_name: str | None) -> dict:
        """What the credits ledger's record of its run names besides the server (a GPU
        kernel: its id and notebook; a notebook job: its name), ``display_name`` being the
        server's as JupyterHub lists it (None: none)."""
        return {}

    @classmethod
    def not_run(cls) -> str:
        """The member's words when the hub's backend does not run this kind
        (:meth:`hub_ext.spawn.backend.SpawnBackend.runs`; refused with 501)."""
        return f"This hub's backend runs no {cls.noun}."

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"


class Server(Workload):
    """The interactive server: JupyterLab, as long as its member uses it."""


def workload_classes(names) -> dict[str, type[Workload]]:
    """``c.SpawnerCore.workloads`` (import strings of :class:`Workload` subclasses) as
    ``{option: class}``."""
    classes = [import_item(name) if isinstance(name, str) else name for name in names]
    return {cls.option: cls for cls in classes}
