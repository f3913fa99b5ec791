"""Limits a fresh install ships with, derived from the node, so one member cannot exhaust it.

- **Each built-in profile** gets a memory and a CPU limit (``mem_limit``, ``cpu_limit`` in
  its ``spawner_override``; DockerSpawner's traits, Docker's ``--memory`` and ``--cpus``):
  a GPU profile one *GPU share* per GPU it asks for, the node's memory (less
  :data:`SYSTEM_RESERVE` for the hub and the system) and CPUs divided by its number of
  GPUs; the CPU profile a quarter of a share, at least 1 CPU and 1 GiB.  Which node: the
  backend says (:meth:`hub_ext.backends.Backend.profile_node`): the hub's own machine on
  Docker, the smallest GPU node of the default partition on Slurm.  Where the backend
  *allocates* memory and CPUs (Slurm's ``CR_Core_Memory``: a node's memory is spoken for
  by the jobs on it) a node first sets aside room for :data:`CPU_SERVERS` CPU-profile
  servers, so that one whose GPUs are all taken still takes CPU servers, and CPUs are
  whole.  Profiles a site writes (``GPUHUB_PROFILES``) keep the limits they set.
- **Whether a server fits** (:func:`misfit`): a profile's memory, CPUs and GPUs against
  what the backend has (this machine; the nodes of a partition), for ``gpuhub config check
  --reach`` and for the words of a refusal by Slurm.
- **The hub** (JupyterHub's own traits, each a GPUHUB_* setting): at most
  ``GPUHUB_NAMED_SERVER_LIMIT`` named servers per member (default 1 besides the default
  server, so at most 2 servers per member: issue 13 found one member running three at once
  on the free profile with the old default of 2), ``GPUHUB_ACTIVE_SERVER_LIMIT`` servers
  running at once (default one per GiB of the node's usable memory, at least 4 per GPU
  share) and
  ``GPUHUB_CONCURRENT_SPAWN_LIMIT`` spawns in progress at once (default 20).

JupyterHub refuses past the named-server limit with its own sentence: 400 "User alice
already has the maximum of 1 named servers.  One must be deleted before a new server can be
created" (``jupyterhub/handlers/base.py``).  On the Docker backend the other two are applied
by the spawner, which leaves places in line out of the count (:mod:`hub_ext.docker.server_limits`,
429 with a sentence); on Slurm by JupyterHub.
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import dataclass, field

GIB = 1024**3
MIB = 1024**2
#: Share of the node's memory left to the hub, Docker and the system.
SYSTEM_RESERVE = 0.10
#: Servers per GPU share that ``GPUHUB_ACTIVE_SERVER_LIMIT`` allows at least, by default.
SERVERS_PER_SHARE = 4
#: Named servers per member besides the default one: at most 2 servers per member.
NAMED_SERVER_LIMIT = 1
CONCURRENT_SPAWN_LIMIT = 20
#: CPU-profile servers a node whose GPUs are all taken still takes, where the backend
#: allocates memory and CPUs (:attr:`Node.cpu_servers`).
CPU_SERVERS = 2


@dataclass(frozen=True)
class Node:
    """What the limits divide: memory in bytes, CPUs (may be fractional) and GPUs.

    ``cpu_servers``: 0 where a limit only caps a server (Docker: the servers' limits may
    add up to more than the node); where the backend allocates memory and CPUs to each
    server (Slurm), the CPU-profile servers set aside on a node before its GPU shares
    (:data:`CPU_SERVERS`), CPU counts then being whole."""

    memory_bytes: int
    cpus: float
    gpus: int
    cpu_servers: int = 0

    @classmethod
    def probe(cls, gpus: int) -> Node:
        """This machine: physical memory (``sysconf``), the CPUs this process may use
        (``sched_getaffinity``) and ``gpus``."""
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return cls(memory_bytes=memory, cpus=float(len(os.sched_getaffinity(0))), gpus=gpus)

    @property
    def shares(self) -> int:
        """GPU shares the node is divided into: one per GPU, one on a node without GPUs."""
        return max(self.gpus, 1)

    @property
    def usable_bytes(self) -> int:
        """The node's memory less :data:`SYSTEM_RESERVE`."""
        return int(self.memory_bytes * (1 - SYSTEM_RESERVE))

    def _whole_share(self) -> tuple[int, float]:
        return self.usable_bytes // self.shares, round(self.cpus / self.shares, 2)

    def gpu_share(self) -> tuple[int, float]:
        """(memory bytes, CPUs) of one GPU share: the usable memory and the CPUs divided
        by the GPUs, less the CPU servers' room (:attr:`cpu_servers`; fewer of them on a
        node too small for so many)."""
        if not self.cpu_servers:
            return self._whole_share()
        cpu_memory, cpu_cpus = self.cpu_profile_share()
        for room in range(self.cpu_servers, -1, -1):
            memory = (self.usable_bytes - room * cpu_memory) // self.shares
            cpus = float(max(1, math.floor((self.cpus - room * cpu_cpus) / self.shares)))
            if memory >= cpu_memory or room == 0:
                return memory, cpus
        raise AssertionError("unreachable")

    def cpu_profile_share(self) -> tuple[int, float]:
        """(memory bytes, CPUs) of the CPU profile: a quarter of a whole share, at least 1
        GiB and 1 CPU, never more than a whole share (whole CPUs where the backend
        allocates them)."""
        memory, cpus = self._whole_share()
        cpu_cpus = min(max(cpus, 1.0), max(1.0, round(cpus / 4, 2)))
        if self.cpu_servers:
            cpu_cpus = float(math.floor(cpu_cpus))
        return min(memory, max(GIB, memory // 4)), cpu_cpus

    def active_server_limit(self) -> int:
        """Servers running at once: one per GiB of usable memory (a server at rest needs
        a few hundred MB), at least :data:`SERVERS_PER_SHARE` per GPU share."""
        return max(SERVERS_PER_SHARE * self.shares, self.usable_bytes // GIB)


def node_gpu_count(gpus_setting: str) -> int:
    """GPUs of the node as ``GPUHUB_GPUS`` names them: ``simulated:N``, a simulated JSON
    file's devices, or NVML's count (0 when NVML cannot be read: the pool says why at start).
    Raises ValueError for a malformed simulated setting."""
    if gpus_setting.startswith("simulated:"):
        spec = gpus_setting.split(":", 1)[1]
        if spec.isdigit():
            return int(spec)
        try:
            with open(spec) as f:
                return len(json.load(f).get("devices", []))
        except (OSError, ValueError, AttributeError) as e:
            raise ValueError(
                f"GPUHUB_GPUS={gpus_setting!r}: cannot read the device list ({e})"
            ) from None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver here; the pool refuses to start with why
        return 0


def memory_limit(nbytes: int) -> str:
    """Bytes as a memory limit in MiB (``"10240M"``), as JupyterHub's ``ByteSpecification``
    (DockerSpawner's ``mem_limit``) reads it: K, M, G, T, upper case."""
    return f"{nbytes // MIB}M"


def limited_profiles(profiles: list[dict], node: Node) -> list[dict]:
    """A deep copy of ``profiles`` with a ``mem_limit`` and ``cpu_limit`` in each one's
    ``spawner_override`` where it sets none (see the module docstring)."""
    limited = copy.deepcopy(profiles)
    for profile in limited:
        gpus = profile.get("gpus", 0)
        if isinstance(gpus, int) and gpus > 0:
            memory, cpus = node.gpu_share()
            memory, cpus = memory * gpus, round(cpus * gpus, 2)
        else:
            memory, cpus = node.cpu_profile_share()
        override = profile.setdefault("spawner_override", {})
        override.setdefault("mem_limit", memory_limit(memory))
        override.setdefault("cpu_limit", cpus)
    return limited


_UNITS = {"b": 1, "k": 1024, "m": MIB, "g": GIB, "t": 1024 * GIB}


def memory_text(limit) -> str:
    """A memory limit (``"10240M"``, ``"16G"``, bytes) as people read it
    (``"10 GB"``, ``"1.5 GB"``, ``"512 MB"``); ``""`` for none or one it cannot read."""
    nbytes = memory_bytes(limit)
    if nbytes is None:
        return ""
    if nbytes >= GIB:
        return f"{nbytes / GIB:.1f}".removesuffix(".0") + " GB"
    return f"{nbytes / MIB:.0f} MB"


def memory_bytes(limit) -> int | None:
    """A memory limit (``"10240M"``, ``"16G"``, bytes) in bytes; None for none or one that
    cannot be read."""
    if limit in (None, "", 0):
        return None
    text = str(limit).strip().lower()
    unit = _UNITS.get(text[-1:], None)
    try:
        return int(float(text[:-1] if unit else text) * (unit or 1))
    except ValueError:
        return None


def limits_text(mem_limit, cpu_limit) -> str:
    """A profile's limits as its card says them: "Up to 1 CPU and 2.6 GB of memory";
    ``""`` when it has none."""
    parts = []
    if isinstance(cpu_limit, int | float) and cpu_limit > 0:
        parts.append(f"{cpu_limit:g} CPU" + ("" if cpu_limit == 1 else "s"))
    memory = memory_text(mem_limit)
    if memory:
        parts.append(f"{memory} of memory")
    return "Up to " + " and ".join(parts) if parts else ""


def apply_limits_config(c, settings, node: Node) -> None:
    """Set JupyterHub's server limits from ``settings`` (``None``: derived from ``node``).
    A backend that applies the active and concurrent limits itself moves them to its
    spawner (the Docker backend: :mod:`hub_ext.docker.hubconfig`).

    Raises ValueError naming the variable for a negative limit.
    """
    limits = {
        "GPUHUB_NAMED_SERVER_LIMIT": settings.named_server_limit,
        "GPUHUB_ACTIVE_SERVER_LIMIT": settings.active_server_limit,
        "GPUHUB_CONCURRENT_SPAWN_LIMIT": settings.concurrent_spawn_limit,
    }
    for name, value in limits.items():
        if value is not None and value < 0:
            raise ValueError(f"{name}={value}: use 0 (no limit) or a number of servers")
    c.JupyterHub.named_server_limit_per_user = settings.named_server_limit
    c.JupyterHub.active_server_limit = (
        node.active_server_limit()
        if settings.active_server_limit is None
        else settings.active_server_limit
    )
    c.JupyterHub.concurrent_spawn_limit = settings.concurrent_spawn_limit


@dataclass(frozen=True)
class Capacity:
    """What one machine or node offers a single server: memory in bytes, CPUs, and GPUs
    per type (``""``: untyped; a Slurm GRES type such as ``"a100"``)."""

    name: str
    memory_bytes: int
    cpus: float
    gpus: dict[str, int] = field(default_factory=dict)

    def gpus_of(self, kind: str) -> int:
        return self.gpus.get(kind, 0) if kind else sum(self.gpus.values())


@dataclass(frozen=True)
class Request:
    """What one server asks: memory in bytes and CPUs (None: no limit), GPUs of a type."""

    memory_bytes: int | None
    cpus: float | None
    gpus: int = 0
    gpu_kind: str = ""

    def fits(self, node: Capacity) -> bool:
        return (
            (not self.memory_bytes or node.memory_bytes >= self.memory_bytes)
            and (not self.cpus or node.cpus >= self.cpus)
            and (not self.gpus or node.gpus_of(self.gpu_kind) >= self.gpus)
        )


def misfit(request: Request, nodes: list[Capacity], where: str) -> str:
    """Why ``request`` can never start on any of ``nodes`` (``where`` names them: "this
    machine", "the nodes of partition gpu"), or ``""`` when one node can hold it.

    ``"10.6 GB of memory (at most 4 GB on the nodes of partition gpu)"``: one clause per
    resource no node has enough of, or, when each fits some node, that no single node has
    them all."""
    if any(request.fits(n) for n in nodes):
        return ""
    if not nodes:
        return f"a node that takes jobs, and there is none on {where}"
    what = f"{request.gpu_kind} GPUs" if request.gpu_kind else "GPUs"
    lacks = []
    if request.gpus and not any(n.gpus_of(request.gpu_kind) >= request.gpus for n in nodes):
        most = max(n.gpus_of(request.gpu_kind) for n in nodes)
        lacks.append(f"{request.gpus} {what} (at most {most} on {where})")
    if request.memory_bytes and not any(n.memory_bytes >= request.memory_bytes for n in nodes):
        most = memory_text(max(n.memory_bytes for n in nodes))
        lacks.append(f"{memory_text(request.memory_bytes)} of memory (at most {most} on {where})")
    if request.cpus and not any(n.cpus >= request.cpus for n in nodes):
        lacks.append(f"{request.cpus:g} CPUs (at most {max(n.cpus for n in nodes):g} on {where})")
    if lacks:
        return " and ".join(lacks)
    parts = [memory_text(request.memory_bytes) + " of memory" if request.memory_bytes else ""]
    parts += [f"{request.cpus:g} CPUs" if request.cpus else ""]
    parts += [f"{request.gpus} {what}" if request.gpus else ""]
    together = ", ".join(p for p in parts if p)
    return f"{together} together (no single one of {where} has them all)"
