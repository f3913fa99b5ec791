"""What the hub reads from Slurm: nodes and their GPUs, free GPUs per partition and GRES
type, and the place of a pending job in line.

Every call runs a Slurm command (``sinfo``, ``squeue``) as a subprocess, so the hub's event
loop never waits on Slurm; :class:`SlurmCluster` caches the node list for
``cache_seconds``.  The commands run on the hub's host or on the submit host over ssh
(:mod:`.submit`) and find the cluster as they would for a person there: ``SLURM_CONF`` in
their environment, or that host's own ``/etc/slurm/slurm.conf``.

Parsing follows Slurm 22.05's output formats (``sinfo -O``, ``squeue -o``; Slurm man
pages).  GRES strings look like ``gpu:2``, ``gpu:a100:2(S:0-1)``; used ones like
``gpu:a100:1(IDX:0)``.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field

from ..common.limits import CPU_SERVERS, MIB, Capacity
from ..common.limits import Node as LimitsNode
from .submit import CommandFailed, SubmitHost, SubmitHostUnavailable

#: Node states in which a node takes no new jobs (sinfo's long state names, lower case,
#: with their flag suffixes such as ``*`` or ``~`` stripped).
UNAVAILABLE = (
    "down",
    "drained",
    "draining",
    "fail",
    "failing",
    "future",
    "maint",
    "not_responding",
    "power_down",
    "powered_down",
    "reboot",
    "unknown",
)


#: How the hub runs a command as a member on the submit host when it runs there as root
#: (``c.GPUSlurmSpawner.exec_prefix``; a service account with sudo rights uses
#: ``sudo -n -E -u {username} --``, docs/howto/slurm.md "A submit host").
MEMBER_PREFIX = "runuser -u {username} --"

UNREACHABLE_MESSAGE = (
    "The cluster's scheduler is not answering, so no server can start "
    "right now. Servers already running are not affected; try again in a "
    "few minutes."
)

SUBMIT_HOST_MESSAGE = (
    "The cluster's submit host is not answering, so no server can start "
    "right now. Servers already running are not affected; try again in a "
    "few minutes."
)


class SlurmUnavailable(RuntimeError):
    """slurmctld did not answer (or the Slurm commands are missing, or the submit host
    did not answer).  The message is for the hub's log; ``member_message`` is the sentence
    for the member and ``what`` the admins' heading ("Slurm does not answer")."""

    member_message = UNREACHABLE_MESSAGE
    what = "Slurm does not answer"


class SubmitHostDown(SlurmUnavailable):
    """The submit host did not answer ssh: Slurm may be fine, the hub cannot reach it."""

    member_message = SUBMIT_HOST_MESSAGE
    what = "The submit host does not answer"


@dataclass
class Node:
    """One compute node as sinfo reports it."""

    name: str
    partitions: list[str]
    state: str  # idle, mixed, allocated, drained, down, ...
    gpus: dict[str, int]  # GRES type ("" for untyped) -> count configured
    gpus_used: dict[str, int]
    reason: str = ""
    address: str = ""  # NodeAddr: where the hub reaches the node's servers
    memory_mb: int = 0  # RealMemory, MB (what jobs' --mem is allocated from)
    cpus: int = 0
    jobs_per_core: int = 1  # its partition's OverSubscribe=FORCE:N or YES:N

    def capacity(self) -> Capacity:
        """What this node offers a single job (:func:`hub_ext.common.limits.misfit`)."""
        return Capacity(self.name, self.memory_mb * MIB, float(self.cpus), dict(self.gpus))

    def shape(self) -> LimitsNode:
        """The node as the built-in profiles' limits divide it: Slurm allocates memory
        and CPUs, so room for CPU servers is set aside (:data:`CPU_SERVERS`), on the CPUs
        its partition lets jobs share."""
        return LimitsNode(
            self.memory_mb * MIB,
            float(self.cpus * self.jobs_per_core),
            sum(self.gpus.values()),
            cpu_servers=CPU_SERVERS,
        )

    @property
    def available(self) -> bool:
        """Whether Slurm would start new jobs on this node."""
        return not any(self.state.startswith(s) for s in UNAVAILABLE)

    def free(self, gpu_type: str = "") -> int:
        """GPUs of ``gpu_type`` ("" for any type) not allocated to a job; 0 when the node
        takes no new jobs."""
        if not self.available:
            return 0
        if gpu_type:
            return self.gpus.get(gpu_type, 0) - self.gpus_used.get(gpu_type, 0)
        return sum(self.gpus.values()) - sum(self.gpus_used.values())


_GRES = re.compile(r"gpu(?::(?P<type>[^:(,]+))?:(?P<count>\d+)")


def parse_gres(text: str) -> dict[str, int]:
    """``gpu:2`` -> ``{"": 2}``; ``gpu:a100:1(IDX:0),gpu:t4:2(S:0)`` -> ``{"a100": 1,
    "t4": 2}``; anything that is not a GPU is left out."""
    counts: dict[str, int] = {}
    for part in re.split(r",(?![^(]*\))", text or ""):
        match = _GRES.match(part.strip())
        if match:
            kind = match["type"] or ""
            counts[kind] = counts.get(kind, 0) + int(match["count"])
    return counts


def parse_gres_request(gres: str) -> tuple[str, int]:
    """A profile's GRES request (``gpu:1``, ``gpu:a100:2``) -> (type or "", count)."""
    counts = parse_gres(gres)
    if not counts:
        return "", 0
    ((kind, count),) = counts.items()
    return kind, count


@dataclass
class QueuedJob:
    """A job in Slurm's queue (``squeue``)."""

    job_id: str
    state: str
    user: str
    name: str
    partition: str
    priority: int
    reason: str
    node: str = ""
    start: str = ""  # Slurm's expected start time (squeue --start), or ""


@dataclass
class JobGPUs:
    """A job and the GPUs it holds (``scontrol -d show job``): ``gpus`` maps each node to
    the GPU indexes Slurm gave the job there (the ``IDX`` of its GRES)."""

    job_id: str
    name: str
    user: str
    state: str
    partition: str
    start: str  # StartTime, Slurm's local ISO time ("" when unknown)
    reason: str = ""
    gpus: dict[str, list[int]] = field(default_factory=dict)


#: the highest GPU index on a node that the hub reads (gres.conf: far fewer per node)
MAX_GPU_INDEX = 1023
_INDEX_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def parse_indexes(text: str) -> list[int]:
    """``0-1,3`` -> ``[0, 1, 3]`` (Slurm's index lists).  A part that is not an index or
    a range (``1-2-3``) is passed over, and indexes beyond :data:`MAX_GPU_INDEX` are
    dropped: the text may come from a job name (see :func:`parse_job_details`)."""
    out: list[int] = []
    for part in text.split(","):
        match = _INDEX_RANGE.fullmatch(part)
        if match:
            low, high = int(match[1]), int(match[2] or match[1])
            out.extend(range(low, min(high, MAX_GPU_INDEX) + 1))
    return out


#: the most node names one hostlist may expand to (more is no cluster's: passed over)
MAX_HOSTS = 4096
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(text: str, limit: int = MAX_HOSTS) -> list[str]:
    """Slurm's hostlist -> node names, as ``scontrol show hostnames`` prints them:
    ``node[1-3,5]``, ``gpu[09-11]`` (zero-padded as written), ``a,b[1-2]``,
    ``r[1-2]n[1-2]``.  ``[]`` for text that is not a hostlist or names over ``limit``
    nodes (the text may come from a job name, see :func:`parse_job_details`)."""
    names: list[str] = []
    for item in re.split(r",(?![^\[]*\])", text):
        expanded, pos = [""], 0
        for group in _BRACKETS.finditer(item):
            values = []
            for part in group[1].split(","):
                match = _INDEX_RANGE.fullmatch(part)
                if match is None:
                    return []
                low, high = int(match[1]), int(match[2] or match[1])
                if high - low + len(values) >= limit:
                    return []
                values += [str(i).zfill(len(match[1])) for i in range(low, high + 1)]
            if len(expanded) * len(values) > limit:
                return []
            prefix = item[pos : group.start()]
            if "[" in prefix or "]" in prefix:
                return []
            expanded = [e + prefix + v for e in expanded for v in values]
            pos = group.end()
        tail = item[pos:]
        if not item or "[" in tail or "]" in tail:
            return []
        names += [e + tail for e in expanded]
        if len(names) > limit:
            return []
    return names


_FIELD = re.compile(r"(\w[\w/:]*)=(\S*)")
#: a line's first field, written by Slurm before any text a submitter chose
_JOB_ID = re.compile(r"JobId=(\S+)")
_NODE_GRES = re.compile(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)")
_IDX = re.compile(r"gpu(?::[^:(,]+)?(?::\d+)?\(IDX:([\d,-]+)\)")


def parse_job_details(out: str) -> list[JobGPUs]:
    """``scontrol -d -o show job`` (one line per job) -> :class:`JobGPUs`; a line that does
    not start with a job id ("No jobs in the system") is skipped.

    ``scontrol`` prints a job's name, comment and paths raw, so a submitter can write
    ``JobId=7`` or ``GRES=gpu(IDX:0)`` into them (``-o`` has no quoting).  The job id is
    therefore taken from the start of its line only, and a job id found at the start of
    two lines (a name with a line break can print a whole line) gets no GPUs: the board
    never pairs a GPU with a job, and a Stop button with a member's server, on the word
    of such text.  The other fields are the line's last of each name (display only).
    """
    jobs = []
    starts: dict[str, int] = {}
    for line in out.splitlines():
        first = _JOB_ID.match(line)
        if first is None:
            continue
        fields = dict(_FIELD.findall(line))
        fields["JobId"] = first.group(1)
        starts[first.group(1)] = starts.get(first.group(1), 0) + 1
        gpus = {}
        for nodes, gres in _NODE_GRES.findall(line):
            indexes = [i for m in _IDX.findall(gres) for i in parse_indexes(m)]
            for node in expand_hostlist(nodes) if indexes else []:
                gpus[node] = indexes  # nodes with the same GPUs share one entry
        start = fields.get("StartTime", "")
        jobs.append(
            JobGPUs(
                fields["JobId"],
                fields.get("JobName", ""),
                fields.get("UserId", "").split("(", 1)[0],
                fields.get("JobState", ""),
                fields.get("Partition", ""),
                "" if start in ("Unknown", "None") else start,
                fields.get("Reason", ""),
                gpus,
            )
        )
    for job in jobs:
        if starts[job.job_id] > 1:
            job.gpus = {}
    return [
        job for i, job in enumerate(jobs) if all(other.job_id != job.job_id for other in jobs[:i])
    ]


#: ``squeue -o``: the job name (``%j``, the submitter's text, which may hold ``|``) last
QUEUE_FORMAT = "%i|%T|%u|%P|%Q|%r|%N|%j"


def parse_queue(out: str) -> list[QueuedJob]:
    """``squeue -h -o QUEUE_FORMAT`` -> the jobs, pending ones in Slurm's priority order
    (highest first, then by job id, as the scheduler takes them), then the others.  The
    name is split off last, so a ``|`` in it cannot move the job to another partition or
    priority."""
    jobs = []
    for line in out.splitlines():
        cols = line.split("|", 7)
        if len(cols) < 8:
            continue
        job_id, state, user, partition, prio, reason, node, name = cols
        jobs.append(
            QueuedJob(
                job_id,
                state,
                user,
                name,
                partition,
                int(prio) if prio.isdigit() else 0,
                reason,
                node,
            )
        )
    pending = [j for j in jobs if j.state == "PENDING"]
    pending.sort(key=lambda j: (-j.priority, int(j.job_id.split("_")[0])))
    return pending + [j for j in jobs if j.state != "PENDING"]


#: Shared clusters per environment (the spawn page, its endpoint and the board read one
#: cached node list, not one per spawner).
_shared: dict[tuple, SlurmCluster] = {}


#: ``sinfo``'s line per node and partition, read by :func:`parse_nodes`
SINFO_NODES = (
    "sinfo",
    "-h",
    "-N",
    "-O",
    "NodeList:|,Partition:|,StateLong:|,Gres:|,GresUsed:|,NodeAddr:|,Memory:|,CPUs:|,"
    "OverSubscribe:|,Reason:",
)


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def jobs_per_core(oversubscribe: str) -> int:
    """A partition's ``OverSubscribe`` (``NO``, ``EXCLUSIVE``, ``YES:4``, ``FORCE:2``) as
    the jobs that may share one of its cores (Slurm: slurm.conf ``OverSubscribe``)."""
    kind, _, count = oversubscribe.upper().partition(":")
    if kind not in ("YES", "FORCE"):
        return 1
    return max(1, _int(count))


def parse_nodes(out: str) -> tuple[list[Node], str]:
    """``sinfo`` (:data:`SINFO_NODES`) -> the nodes, each once with all its partitions,
    and the default partition (marked ``*``; ``""`` when none is)."""
    by_name: dict[str, Node] = {}
    default = ""
    for line in out.splitlines():
        cols = [c.strip() for c in line.split("|", 9)]  # the reason may hold a "|"
        if len(cols) < 10:
            continue
        name, partition, state, gres, used, address, memory, cpus, over, reason = cols
        if partition.endswith("*"):
            partition = default = partition.rstrip("*")
        if name in by_name:
            by_name[name].partitions.append(partition)
            continue
        by_name[name] = Node(
            name,
            [partition],
            state.rstrip("*~#!%$@^-").lower(),
            parse_gres(gres),
            parse_gres(used),
            "" if reason in ("none", "(null)") else reason,
            address,
            memory_mb=_int(memory),
            cpus=_int(cpus),
            jobs_per_core=jobs_per_core(over),
        )
    return list(by_name.values()), default


def member_prefix(template: str, username: str) -> list[str]:
    """``exec_prefix`` (``runuser -u {username} --``) as argv for ``username``: the
    template is split into words first, so the name is one word whatever it holds."""
    return [word.format(username=username) for word in shlex.split(template)]


@dataclass
class SlurmCluster:
    """The Slurm commands, run off the event loop.  ``env`` is added to the commands'
    environment (e.g. ``{"SLURM_CONF": ...}``); ``submit`` runs them on the submit host
    (:mod:`.submit`)."""

    env: dict[str, str] = field(default_factory=dict)
    submit: SubmitHost = field(default_factory=SubmitHost)
    #: how a command runs as a member (``{username}``): the spawner's ``exec_prefix``
    user_prefix: str = MEMBER_PREFIX
    timeout: float = 10.0
    cache_seconds: float = 5.0
    #: the partition jobs go to when they name none (marked ``*`` by sinfo)
    default_partition: str = ""
    _nodes: tuple[float, list[Node]] | None = None

    async def run(
        self,
        *argv: str,
        user: str | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Run one Slurm command (here or on the submit host: ``submit``); returns its
        stdout.  ``user`` runs it as that Unix account (``user_prefix``).  Raises
        :class:`SlurmUnavailable` when slurmctld does not answer or the command fails
        with a message, or takes over ``timeout`` seconds (default ``self.timeout``), and
        :class:`SubmitHostDown` when the submit host does not answer."""
        prefix = member_prefix(self.user_prefix, user) if user else []
        limit = timeout or self.timeout
        try:
            return await self.submit.run(
                [*prefix, *argv],
                env=self.env,
                timeout=limit,
                input=input.encode() if input is not None else None,
            )
        except SubmitHostUnavailable as e:
            raise SubmitHostDown(str(e)) from e
        except OSError as e:
            raise SlurmUnavailable(f"{argv[0]}: {e}") from e
        except TimeoutError as e:
            raise SlurmUnavailable(f"{' '.join(argv)} took over {limit} s") from e
        except CommandFailed as e:
            raise SlurmUnavailable(f"{' '.join(argv)}: {e.stderr}") from e

    async def nodes(self, fresh: bool = False, timeout: float | None = None) -> list[Node]:
        """Every node (cached ``cache_seconds``); ``timeout`` as in :meth:`run`."""
        if not fresh and self._nodes and time.monotonic() - self._nodes[0] < self.cache_seconds:
            return self._nodes[1]
        nodes, default = parse_nodes(await self.run(*SINFO_NODES, timeout=timeout))
        self.default_partition = default or self.default_partition
        self._nodes = (time.monotonic(), nodes)
        return nodes

    @classmethod
    def shared(
        cls, env: dict[str, str], submit: SubmitHost | None = None, user_prefix: str = MEMBER_PREFIX
    ) -> SlurmCluster:
        """The one cluster object of this hub process for ``env``, ``submit`` and
        ``user_prefix`` (its node cache shared)."""
        submit = submit or SubmitHost()
        key = (tuple(sorted(env.items())), submit, user_prefix)
        if key not in _shared:
            _shared[key] = cls(env=dict(env), submit=submit, user_prefix=user_prefix)
        return _shared[key]

    async def job_gpus(self, job_id: str = "") -> list[JobGPUs]:
        """Every job Slurm knows (or the one ``job_id``), with the GPU indexes each
        running one holds (``scontrol -d -o show job``, read by
        :func:`parse_job_details`).  Raises :class:`SlurmUnavailable` as :meth:`run`
        does, also for a ``job_id`` Slurm no longer knows."""
        return parse_job_details(
            await self.run("scontrol", "-d", "-o", "show", "job", *([job_id] if job_id else []))
        )

    async def queue(self) -> list[QueuedJob]:
        """Every job Slurm knows, pending ones in Slurm's priority order (highest first,
        then by job id, as the scheduler takes them), then the others."""
        return parse_queue(await self.run("squeue", "-h", "-o", QUEUE_FORMAT))

    async def start_times(self) -> dict[str, str]:
        """Job id -> Slurm's expected start time (``squeue --start``), ISO text, for the
        pending jobs Slurm has an estimate for."""
        out = await self.run("squeue", "--start", "-h", "-t", "PD", "-o", "%i|%S")
        times = {}
        for line in out.splitlines():
            job_id, _, start = line.partition("|")
            if start and start not in ("N/A", "Unknown"):
                times[job_id] = start
        return times
