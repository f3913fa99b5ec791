"""The network of a Slurm job's sandbox, as the batch script sets it up.

Each server or notebook job runs in a network namespace of its own (bubblewrap
``--unshare-net``): nobody else on the node reaches its loopback (a kernel's ports, a
TensorBoard), and its only ways in and out are the server's port, which the hub and the
proxy reach on the node, and the hub's API.  Both go through forwarders of
:mod:`hub_ext.slurm.sandbox_net`, which runs on the node around the sandbox and again in it
(a Unix socket in a folder of the member's, bound into the sandbox, carries each side).
Outbound traffic, where the site allows it, goes through slirp4netns or pasta
(:attr:`SandboxNetwork.outbound`), never to the node's loopback.  The same runner keeps the
job's log to :attr:`SandboxNetwork.log_max_size`.

:func:`network_script` builds the batch script's part of it from the settings, a pure
function; :class:`SandboxNetwork` holds the settings (``c.SandboxNetwork.<trait>``).
docs/howto/slurm.md ("The job's network") has the story and what a node needs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from jupyterhub.traitlets import ByteSpecification
from traitlets import Bool, Enum, Unicode
from traitlets.config import Configurable

from . import sandbox_net

#: The node-side runner, this package's ``sandbox_net.py`` (the nodes see the hub's
#: installation, as they see batchspawner's: the sandbox binds both).
RUNNER = str(Path(sandbox_net.__file__))

OUTBOUND = ("none", "slirp4netns", "pasta")


@dataclass(frozen=True)
class NetworkScript:
    """The batch script's part of the job's network (bash text; "" where there is none).

    ``prologue``: lines before the ``exec`` (the member's folder for the sockets);
    ``runner``: the words before the container command (the node's side);
    ``binds``: bubblewrap's arguments (the ``{network}`` field of ``container_command``);
    ``wrapper``: the command in the sandbox in place of batchspawner's wrapper."""

    prologue: str = ""
    runner: str = ""
    binds: str = ""
    wrapper: str = ""


def network_script(
    isolated: bool, outbound: str, log_max_bytes: int, python: str, runner: str = RUNNER
) -> NetworkScript:
    """The batch script's part of the job's network for these settings (a pure function):
    an empty :class:`NetworkScript` when the sandbox is not isolated.  Raises ValueError for
    an ``outbound`` other than :data:`OUTBOUND`."""
    if outbound not in OUTBOUND:
        raise ValueError(f"outbound must be one of {', '.join(OUTBOUND)}, not {outbound!r}")
    if not isolated:
        return NetworkScript()
    inside = sandbox_net.INSIDE_DIR
    return NetworkScript(
        prologue=(
            "# the sandbox's own network: its port and the hub's API through sockets in a\n"
            "# folder of the member's (hub_ext/slurm/sandbox_net.py)\n"
            'gpuhub_net=$(mktemp -d "${TMPDIR:-/tmp}/gpuhub-net.XXXXXXXX")\n'
        ),
        runner=(
            f'{shlex.quote(python)} {shlex.quote(runner)} node --dir "$gpuhub_net"'
            f" --outbound {outbound} --log-max-bytes {int(log_max_bytes)} -- "
        ),
        binds=(
            f'--unshare-net --bind "$gpuhub_net" {inside}'
            f" --ro-bind {shlex.quote(runner)} {sandbox_net.INSIDE_SCRIPT}"
        ),
        wrapper=f"python3 {sandbox_net.INSIDE_SCRIPT} inside --",
    )


class SandboxNetwork(Configurable):
    """The settings of the job's network (module doc); ``c.SandboxNetwork.<trait>``."""

    isolated = Bool(
        True,
        config=True,
        help="""Run each job's sandbox in a network namespace of its own, reached through
        the node's forwarders (docs/howto/slurm.md, "The job's network").  Needs the
        ``{network}`` field in ``c.GPUSlurmSpawner.container_command`` (the default
        bubblewrap command has it).  Off: the sandbox shares the node's network, and every
        job on the node reaches its loopback.

            c.SandboxNetwork.isolated = True
        """,
    )

    outbound = Enum(
        list(OUTBOUND),
        default_value="none",
        config=True,
        help="""Outbound traffic of an isolated sandbox: "none" (only the hub's API), or
        through a user-mode network stack on the node, "slirp4netns" or "pasta" (Debian
        packages; never to the node's loopback).  GPUHUB_SLURM_OUTBOUND.

            c.SandboxNetwork.outbound = "slirp4netns"
        """,
    )

    log_max_size = ByteSpecification(
        50 * 2**20,
        config=True,
        help="""The most a job's log (``<workspace>/.gpuhub/slurm-<job>.log``) holds; past
        it the log becomes ``slurm-<job>.log.1`` (the previous one dropped) and a new one
        begins.  0: unbounded.

            c.SandboxNetwork.log_max_size = "50M"
        """,
    )

    node_python = Unicode(
        "python3",
        config=True,
        help="""The nodes' Python (3.9 or newer) that runs the node's side of the sandbox's
        network, as a command of the batch script.

            c.SandboxNetwork.node_python = "/usr/bin/python3"
        """,
    )

    def script(self) -> NetworkScript:
        """:func:`network_script` for these settings."""
        return network_script(self.isolated, self.outbound, self.log_max_size, self.node_python)
