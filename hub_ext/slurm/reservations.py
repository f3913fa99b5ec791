"""The hub's reservations as Slurm's own (``scontrol create reservation``), so that the
cluster enforces them; docs/howto/reservations.md ("On Slurm") tells the story.

Each hub reservation ``<id>`` (:mod:`hub_ext.reservations`) is one Slurm reservation named
``gpuhub-<id>`` (``gpuhub-<hub>-<id>`` for a hub whose ``GPUHUB_HUB_ID`` is not the default
``gpuhub``: :attr:`SlurmReservations.hub`, so that hubs sharing a cluster keep apart)
covering its current or next occurrence; the hub's periodic pass
(:func:`reconcile`) moves it to the next occurrence once one ended, makes the missing ones,
corrects those that differ and deletes the ``gpuhub-<id>`` reservations the hub no longer
has.  Slurm reservations with other names (another hub's too) are never touched.

What Slurm 22.05 can hold (checked on the test cluster): ``TRES=gres/gpu=N`` is refused
("TRES type 'gres/gpu' not supported with reservations"), and cores carry no GPUs, so
GPUs are reserved as whole nodes: ``PartitionName=<the hub's partition>
NodeCnt=<nodes enough for N GPUs> Flags=FLEX,IGNORE_JOBS``.  A reservation of 1 GPU on
nodes of 2 GPUs holds the node's 2; the cards and the board show what Slurm holds.
``FLEX`` lets a job that names the reservation also run outside it, so the group's
members draw from the reserved nodes first and from the shared pool after, in one job;
``IGNORE_JOBS`` lets a reservation be made while jobs without a time limit run (Slurm
leaves them running in the window: the hub stops its own non-members' servers there,
:mod:`.enforce`).  The
recurrence is the hub's (RFC 5545 with exceptions and a time zone), not Slurm's
``Flags=WEEKLY``, which has no end, no exceptions, and keeps the cluster's local clock.

``Users=`` are the group's members who are Unix accounts on the hub's host (Slurm refuses
unknown users), or :attr:`SlurmReservations.placeholder_user` when none is, so the GPUs
are held before the first member logs in.  Commands run through the hub's one
:class:`~hub_ext.slurm.cluster.SlurmCluster` (here or on the submit host) as the hub's
own account, which must be a Slurm operator or admin; with ``TZ=UTC``, so times need no
conversion.
"""

from __future__ import annotations

import pwd
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from traitlets import Float, Unicode
from traitlets.config import LoggingConfigurable

from ..reservations.backend import BackendRefused, BackendUnavailable
from ..reservations.policy import until_text as policy_until
from ..reservations.rules import Spec, occurrences
from .cluster import Node, SlurmCluster, SlurmUnavailable
from .submit import CommandFailed

__all__ = [
    "PREFIX",
    "SlurmReservation",
    "SlurmReservations",
    "Wanted",
    "closed_gpus",
    "parse_reservations",
    "slurm_name",
    "unix_accounts",
    "until_text",
    "wanted",
]

PREFIX = "gpuhub-"
#: the hub id (``GPUHUB_HUB_ID``) whose reservations are named ``gpuhub-<id>``
DEFAULT_HUB = "gpuhub"
#: Slurm's words when it was not reached (the command ran, the controller did not answer);
#: 22.05's ``scontrol create reservation`` says "Unexpected message received" then
_UNREACHED = re.compile(
    r"Unable to contact slurm controller|Socket timed out|"
    r"Unexpected message received|"
    r"Connection refused|Zero Bytes were transmitted|"
    r"Communication connection failure|Unable to process configuration|"
    r"Munge|authentication error",
    re.I,
)
#: Slurm's time format, read and written with ``TZ=UTC``
_TIME = "%Y-%m-%dT%H:%M:%S"


def _prefix(hub: str) -> str:
    return PREFIX if hub in ("", DEFAULT_HUB) else f"{PREFIX}{hub}-"


def slurm_name(reservation_id: int, hub: str = DEFAULT_HUB) -> str:
    """The Slurm reservation of hub reservation ``reservation_id`` of the hub ``hub``
    (``GPUHUB_HUB_ID``): ``gpuhub-<id>``, or ``gpuhub-<hub>-<id>`` for another hub id."""
    return f"{_prefix(hub)}{reservation_id}"


def hub_id(name: str, hub: str = DEFAULT_HUB) -> int | None:
    """``gpuhub-7`` -> 7 (``hub`` ``t1``: ``gpuhub-t1-7`` -> 7); None for a name this hub
    did not make."""
    match = re.fullmatch(re.escape(_prefix(hub)) + r"(\d+)", name)
    return int(match[1]) if match else None


@dataclass(frozen=True)
class SlurmReservation:
    """A reservation as ``scontrol -o show reservation`` prints it (``TZ=UTC``)."""

    name: str
    start: datetime  # aware UTC
    end: datetime
    nodes: tuple[str, ...]
    users: tuple[str, ...]
    partition: str
    state: str  # ACTIVE or INACTIVE
    #: the hub reservation it is, for one this hub made (:meth:`SlurmReservations.read`)
    reservation_id: int | None = None

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


def _utc(text: str) -> datetime:
    return datetime.strptime(text, _TIME).replace(tzinfo=UTC)


def parse_reservations(out: str) -> dict[str, SlurmReservation]:
    """``scontrol -o show reservation`` (one line each, times UTC) -> name -> reservation;
    "No reservations in the system" and lines it cannot read are left out."""
    from .cluster import expand_hostlist

    found = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "ReservationName" not in fields:
            continue
        try:
            start, end = _utc(fields["StartTime"]), _utc(fields["EndTime"])
        except (KeyError, ValueError):
            continue
        nodes = fields.get("Nodes", "")
        users = fields.get("Users", "")
        found[fields["ReservationName"]] = SlurmReservation(
            fields["ReservationName"],
            start,
            end,
            tuple(expand_hostlist(nodes)) if nodes not in ("", "(null)") else (),
            tuple(users.split(",")) if users not in ("", "(null)") else (),
            fields.get("PartitionName", ""),
            fields.get("State", ""),
        )
    return found


@dataclass(frozen=True)
class Wanted:
    """What Slurm's reservation of one hub reservation should be now."""

    name: str
    start: datetime
    end: datetime
    users: tuple[str, ...]
    partition: str
    node_count: int
    gpus: int  # what the hub reservation asks for (Slurm's nodes may hold more)


def nodes_needed(gpus: int, node_gpus: list[int]) -> int:
    """How many nodes make sure of ``gpus`` GPUs whichever of the partition's nodes
    (``node_gpus``: their GPU counts) Slurm picks: the smallest first.  0 when the
    partition's nodes cannot hold them all."""
    total = 0
    for n, count in enumerate(sorted(c for c in node_gpus if c > 0), start=1):
        total += count
        if total >= gpus:
            return n
    return 0


def wanted(
    spec: Spec,
    now: datetime,
    users: list[str],
    node_gpus: list[int],
    partition: str,
    hub: str = DEFAULT_HUB,
) -> Wanted | None:
    """Slurm's reservation for ``spec`` (stored: ``spec.id`` set) of hub ``hub`` at ``now``:
    its current or next occurrence, for ``users`` (sorted), on ``partition``; None when no
    occurrence is left.  Raises :class:`BackendRefused` when the partition cannot hold its
    GPUs."""
    left = occurrences(spec, since=now)
    if not left:
        return None
    count = nodes_needed(spec.gpus, node_gpus)
    if not count:
        raise BackendRefused(
            f"Slurm's partition {partition} has {sum(node_gpus)} GPUs on "
            f"its nodes; it cannot hold {spec.gpus}."
        )
    return Wanted(
        slurm_name(spec.id, hub),
        left[0].start,
        left[0].end,
        tuple(sorted(users)),
        partition,
        count,
        spec.gpus,
    )


def _fields(w: Wanted, start: bool = True) -> list[str]:
    return [
        *([f"StartTime={w.start.astimezone(UTC).strftime(_TIME)}"] if start else []),
        f"EndTime={w.end.astimezone(UTC).strftime(_TIME)}",
        f"Users={','.join(w.users)}",
    ]


def create_args(w: Wanted) -> list[str]:
    """``scontrol create reservation ...`` for ``w``."""
    return [
        "scontrol",
        "create",
        "reservation",
        f"ReservationName={w.name}",
        *_fields(w),
        f"PartitionName={w.partition}",
        f"NodeCnt={w.node_count}",
        "Flags=FLEX,IGNORE_JOBS",
    ]


def update_args(w: Wanted, have: SlurmReservation) -> list[str] | None:
    """``scontrol update ...`` turning ``have`` into ``w``; None when they agree.  The
    start of a running reservation is not moved (Slurm refuses that), nor compared: Slurm
    starts one asked to begin in the past (a window open when it was made) now."""
    same_start = have.active or have.start == w.start
    if same_start and (have.end, tuple(sorted(have.users))) == (w.end, w.users):
        return None
    return ["scontrol", "update", f"ReservationName={w.name}", *_fields(w, start=not have.active)]


def closed_gpus(
    nodes: list[Node], reservations, is_open, kind: str = ""
) -> tuple[list[Node], SlurmReservation | None]:
    """``nodes`` as a member sees them: the nodes of active hub reservations (read by
    :meth:`SlurmReservations.read`) not open to them (``is_open(reservation)`` false) with
    every GPU taken; and the first such reservation that held a free GPU of ``kind`` (""
    any) there (None if none)."""
    closed, first = set(), None
    by_name = {n.name: n for n in nodes}
    for r in reservations:
        if not r.active or r.reservation_id is None or is_open(r):
            continue
        closed.update(r.nodes)
        if first is None and any(by_name[n].free(kind) for n in r.nodes if n in by_name):
            first = r
    seen = [replace(n, gpus_used=dict(n.gpus)) if n.name in closed else n for n in nodes]
    return seen, first


def unix_accounts(names) -> list[str]:
    """The names in ``names`` that are Unix accounts here (Slurm knows users by uid)."""
    found = []
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        found.append(name)
    return sorted(found)


class SlurmReservations(LoggingConfigurable):
    """Makes, corrects and deletes ``gpuhub-<id>`` reservations in Slurm."""

    interval = Float(
        60.0,
        config=True,
        help="""Seconds between two passes that make Slurm's reservations match the
        hub's (and move each to its next occurrence).

            c.SlurmReservations.interval = 60
        """,
    )

    placeholder_user = Unicode(
        "root",
        config=True,
        help="""The Slurm user a reservation is made for while none of its group's members
        is a Unix account (Slurm needs one): the hub's Slurm operator, who runs no jobs.

            c.SlurmReservations.placeholder_user = "gpuhub"
        """,
    )

    hub = Unicode(
        DEFAULT_HUB,
        config=True,
        help="""This hub's id (``GPUHUB_HUB_ID``) in its Slurm reservations' names:
        ``gpuhub-<id>`` for the default ``gpuhub``, else ``gpuhub-<hub>-<id>``, so hubs
        sharing a cluster never touch each other's.

            c.SlurmReservations.hub = "gpuhub"
        """,
    )

    def __init__(self, cluster: SlurmCluster, **kwargs):
        super().__init__(**kwargs)
        # the hub's runner, with Slurm's times in UTC
        self.cluster = replace(cluster, env={**cluster.env, "TZ": "UTC"}, _nodes=None)

    async def run(self, *argv: str) -> str:
        """One scontrol command; raises :class:`BackendRefused` with Slurm's words when
        Slurm answered no, :class:`BackendUnavailable` when it was not reached."""
        try:
            return await self.cluster.run(*argv)
        except SlurmUnavailable as e:
            cause = e.__cause__
            if isinstance(cause, CommandFailed) and not _UNREACHED.search(cause.stderr):
                raise BackendRefused(f"Slurm refused: {cause.stderr}") from None
            raise BackendUnavailable(f"{e.what}: {e}") from None

    def name(self, reservation_id: int) -> str:
        """The Slurm reservation of this hub's reservation ``reservation_id``."""
        return slurm_name(reservation_id, self.hub)

    async def read(self) -> dict[str, SlurmReservation]:
        """Slurm's reservations this hub made (``gpuhub-<id>``), each with its
        ``reservation_id``."""
        out = await self.run("scontrol", "-o", "show", "reservation")
        found = {}
        for name, r in parse_reservations(out).items():
            rid = hub_id(name, self.hub)
            if rid is not None:
                found[name] = replace(r, reservation_id=rid)
        return found

    async def partition_gpus(self, partition: str) -> tuple[str, list[int]]:
        """(the partition, or Slurm's default when ``partition`` is "", its nodes' GPU
        counts)."""
        try:
            nodes = await self.cluster.nodes(fresh=True)
        except SlurmUnavailable as e:
            raise BackendUnavailable(f"{e.what}: {e}") from None
        partition = partition or self.cluster.default_partition
        return partition, [sum(n.gpus.values()) for n in nodes if partition in n.partitions]

    def users_of(self, members) -> list[str]:
        return unix_accounts(members) or [self.placeholder_user]

    async def apply(
        self,
        spec: Spec | None,
        reservation_id: int,
        members,
        partition: str,
        now: datetime,
        have: SlurmReservation | None = None,
        known: bool = False,
    ) -> None:
        """Make Slurm's ``gpuhub-<id>`` what ``spec`` (None: deleted) wants at ``now``.
        ``have``/``known``: Slurm's reservation as just read (else it is read here).
        Raises :class:`BackendRefused` or :class:`BackendUnavailable`; a refused creation
        leaves nothing in Slurm."""
        name = self.name(reservation_id)
        if not known:
            have = (await self.read()).get(name)
        want = None
        if spec is not None:
            partition, node_gpus = await self.partition_gpus(partition)
            want = wanted(
                replace(spec, id=reservation_id),
                now,
                self.users_of(members),
                node_gpus,
                partition,
                self.hub,
            )
        if want is None:
            if have is not None:
                await self.delete(name)
            return
        if have is None:
            await self.run(*create_args(want))
            await self._check_gpus(want)
            self.log.info(
                "Slurm reservation %s made: %s to %s, %d node(s), users %s",
                name,
                want.start,
                want.end,
                want.node_count,
                ",".join(want.users),
            )
            return
        argv = update_args(want, have)
        if argv is not None:
            await self.run(*argv)
            self.log.info(
                "Slurm reservation %s now %s to %s, users %s",
                name,
                want.start,
                want.end,
                ",".join(want.users),
            )

    async def _check_gpus(self, want: Wanted) -> None:
        """Slurm (22.05) makes a reservation on fewer nodes than asked when the others are
        reserved then, and says nothing: it is deleted again and refused, naming what Slurm
        gave."""
        made = (await self.read()).get(want.name)
        nodes = {n.name: n for n in await self.cluster.nodes(fresh=True)}
        gpus = sum(sum(nodes[n].gpus.values()) for n in (made.nodes if made else ()) if n in nodes)
        if gpus < want.gpus:
            await self.delete(want.name)
            raise BackendRefused(
                f"Slurm can hold only {gpus} GPUs "
                f"({', '.join(made.nodes) if made else 'no node'}) of "
                f"partition {want.partition} then, not {want.gpus}: the "
                "others are reserved."
            )

    async def delete(self, name: str) -> None:
        """Delete ``name``; one still in use by jobs is ended now instead (Slurm refuses
        to delete it; it drops it when those jobs end, and the next pass deletes it)."""
        try:
            await self.run("scontrol", "delete", f"ReservationName={name}")
        except BackendRefused as e:
            if "in use" not in str(e):
                raise
            await self.run("scontrol", "update", f"ReservationName={name}", "EndTime=now")
        self.log.info("Slurm reservation %s deleted", name)

    async def reconcile(
        self, specs: list[tuple[Spec, list[str]]], partition: str, now: datetime
    ) -> None:
        """Make Slurm's ``gpuhub-<id>`` reservations match ``specs`` (each with its
        group's members): one that fails is logged and the others go on.  Raises
        :class:`BackendUnavailable` when Slurm cannot be read at all."""
        have = await self.read()
        ids = set()
        for spec, members in specs:
            ids.add(spec.id)
            try:
                await self.apply(
                    spec,
                    spec.id,
                    members,
                    partition,
                    now,
                    have.get(self.name(spec.id)),
                    known=True,
                )
            except (BackendRefused, BackendUnavailable) as e:
                self.log.error("Reservation %s (%s) not in Slurm: %s", spec.id, spec.group, e)
        for name, r in have.items():
            if r.reservation_id not in ids and r.end > now:
                try:
                    await self.delete(name)
                except (BackendRefused, BackendUnavailable) as e:
                    self.log.error("Could not delete Slurm reservation %s: %s", name, e)


def until_text(r: SlurmReservation, group: str, nodes: list[Node]) -> str:
    """``2 GPUs reserved for ml101 until 16:00 UTC`` (the cards' and the board's words):
    the GPUs of the reservation's ``nodes``; the end's date too when it is not on the day
    the reservation began (:func:`hub_ext.reservations.policy.until_text`)."""
    gpus = sum(sum(n.gpus.values()) for n in nodes if n.name in r.nodes)
    return (
        f"{gpus} GPU{'s' if gpus != 1 else ''} reserved for {group} until "
        f"{policy_until(r.start, r.end)}"
    )
