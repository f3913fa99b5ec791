"""What a running server owes, as pure functions: interval amounts, indexes, keys, refunds.

A server is metered in fixed intervals (``c.CreditsHook.interval`` seconds, 15 minutes by
default) counted from its start: interval ``n`` covers ``[started_at + n*interval,
started_at + (n+1)*interval)`` and is paid in advance, at its start.  Interval 0 is the debit
made while the server spawns.  When the server stops, the unused part of the interval it
stopped in is refunded pro rata.

Every write carries an Idempotency-Key derived only from the server (user, server name,
start time) and the interval number, so that whoever makes the write again (a retry, the
meter after a hub restart) gets the original transaction back instead of a second charge.

Amounts are :class:`decimal.Decimal` credits with two places, as the Credits API wants them
(``hub_ext/credits/amounts.py``).  Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

__all__ = [
    "CENT",
    "MeterRecord",
    "as_decimal",
    "debit_key",
    "interval_amount",
    "interval_index",
    "refund_amount",
    "refund_key",
    "server_id",
]

CENT = Decimal("0.01")
RECORD_VERSION = 1


def as_decimal(value: float | int | str | Decimal) -> Decimal:
    """A number of credits (a profile's ``credits_per_hour`` is a float trait) as a Decimal.

    ``repr`` of a float is its shortest exact spelling, so ``2.1`` becomes ``Decimal("2.1")``,
    not ``2.100000000000000088817841970012523233890533447265625``.
    """
    if isinstance(value, Decimal):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"credits must be a finite number, got {value!r}")
        return Decimal(repr(value))
    return Decimal(value)


def interval_amount(credits_per_hour: Decimal, interval: float) -> Decimal:
    """Credits for one interval of ``interval`` seconds at ``credits_per_hour``.

    ``credits_per_hour * interval / 3600`` rounded half up to cents, and at least 0.01 when
    the profile costs anything (so that no priced profile ends up free by rounding).
    Returns ``Decimal("0.00")`` for a free profile.  Raises ValueError for a negative price
    or a non-positive interval.
    """
    if credits_per_hour < 0:
        raise ValueError(f"credits_per_hour must not be negative, got {credits_per_hour}")
    if not interval > 0:
        raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
    if credits_per_hour == 0:
        return Decimal("0.00")
    amount = (credits_per_hour * as_decimal(float(interval)) / 3600).quantize(
        CENT, rounding=ROUND_HALF_UP
    )
    return max(amount, CENT)


def interval_index(started_at: datetime, now: datetime, interval: float) -> int:
    """The interval ``now`` falls in (0 for the first), never negative.

    A clock that reads earlier than the start (moved back, or a skewed restart) is in
    interval 0.
    """
    elapsed = (now - started_at).total_seconds()
    if elapsed <= 0:
        return 0
    return int(elapsed // interval)


def refund_amount(
    amount: Decimal, started_at: datetime, interval: float, index: int, stopped_at: datetime
) -> Decimal:
    """The unused part of interval ``index`` (paid ``amount``) when the server stopped then.

    Pro rata by seconds, rounded *down* to cents so a refund never exceeds what is left of
    the debit.  A stop before the interval began refunds all of it; a stop at or after its
    end refunds nothing.
    """
    begin = started_at + timedelta(seconds=interval * index)
    used = (stopped_at - begin).total_seconds()
    used = min(max(used, 0.0), interval)
    unused = as_decimal(float(interval - used)) / as_decimal(float(interval))
    return (amount * unused).quantize(CENT, rounding=ROUND_DOWN)


def server_id(username: str, server_name: str, started_at: datetime) -> str:
    """A short stable id of one run of one server: the same inputs give the same id.

    A hash rather than the names themselves keeps every key within the contract's 255
    characters whatever the username; the names go into the transaction's metadata.
    """
    text = "\x00".join([username, server_name, started_at.isoformat()])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def debit_key(sid: str, index: int) -> str:
    """Idempotency-Key of the debit of interval ``index`` of server run ``sid``."""
    return f"gpuhub-debit-{sid}-{index}"


def refund_key(sid: str, index: int) -> str:
    """Idempotency-Key of the (one) refund of interval ``index`` of server run ``sid``."""
    return f"gpuhub-refund-{sid}-{index}"


@dataclass
class MeterRecord:
    """The metering of one run of one server, as kept in ``spawner.hook_state["credits"]``.

    Everything a debit or refund body is made of is here, so a replay after a hub restart
    sends byte-for-byte the same request.  ``debits`` maps an interval index to the
    ``transaction_id`` of its debit; ``refunds`` maps an index to the amount refunded.
    ``refused_at``/``refused_balance`` say when a metering debit was refused for lack of
    credits (the grace period runs from then).
    """

    username: str
    server_name: str
    profile: str
    started_at: datetime
    credits_per_hour: Decimal
    interval: float
    amount: Decimal
    debits: dict[int, str] = field(default_factory=dict)
    refunds: dict[int, Decimal] = field(default_factory=dict)
    refused_at: datetime | None = None
    refused_balance: Decimal | None = None
    #: the course that pays (issue 24's course budget): its slug, its Credits API account,
    #: and the window's end; intervals beginning before ``paid_until`` are the course's
    course: str | None = None
    course_account: str | None = None
    paid_until: datetime | None = None
    #: a GPU kernel's (hub_ext.kernels): its id and the notebook it runs for
    #: (workspace-relative), named in the ledger's reasons and metadata; None for a server
    kernel: str | None = None
    notebook: str | None = None
    #: a GPU notebook job's (hub_ext.jobs): its name as JupyterHub lists its server,
    #: "Notebook job: train", named in the ledger's reasons; None for a server
    job: str | None = None

    @classmethod
    def new(
        cls,
        username: str,
        server_name: str,
        profile: str,
        started_at: datetime,
        credits_per_hour: Decimal,
        interval: float,
    ) -> MeterRecord:
        return cls(
            username=username,
            server_name=server_name,
            profile=profile,
            started_at=started_at,
            credits_per_hour=credits_per_hour,
            interval=float(interval),
            amount=interval_amount(credits_per_hour, interval),
        )

    @property
    def server_id(self) -> str:
        return server_id(self.username, self.server_name, self.started_at)

    @property
    def label(self) -> str:
        """``user`` or ``user/server``, for logs and reasons."""
        return f"{self.username}/{self.server_name}" if self.server_name else self.username

    @property
    def title(self) -> str:
        """What the ledger's reasons call the run: "Server alice/dev", for a GPU kernel
        "GPU kernel alice/kernel-0a1b2c3d4e5f for work/train.ipynb", for a notebook job
        "Notebook job: train, alice/job-a7d70db30f9c"."""
        if self.kernel is not None:
            return f"GPU kernel {self.label} for {self.notebook or 'a notebook'}"
        if self.job:
            return f"{self.job}, {self.label}"
        return f"Server {self.label}"

    @property
    def refunded(self) -> str:
        """What a refund's reason names: ``user/server``, or a GPU kernel's or a notebook
        job's :attr:`title`."""
        return self.label if self.kernel is None and not self.job else self.title

    def course_pays(self, index: int) -> bool:
        """Whether interval ``index`` is the course's (it begins before the window's end)."""
        return bool(
            self.course_account
            and self.paid_until is not None
            and self.interval_start(index) < self.paid_until
        )

    def account(self, index: int) -> str:
        """The Credits API account that pays interval ``index`` (and gets its refund)."""
        return self.course_account if self.course_pays(index) else self.username

    def interval_start(self, index: int) -> datetime:
        return self.started_at + timedelta(seconds=self.interval * index)

    def reason(self, index: int) -> str:
        """The debit's ``reason``: deterministic, so a replay has the same body.  An
        interval a course pays begins "Course ml101: Server alice ..." (the ledger's
        history shows both)."""
        minutes = self.interval / 60
        span = f"{minutes:g} min" if minutes >= 1 else f"{self.interval:g} s"
        paid = f"Course {self.course}: " if self.course_pays(index) else ""
        return (
            f"{paid}{self.title} ({self.profile or 'default profile'}) at "
            f"{self.credits_per_hour.normalize():f} credits/hour: {span} from "
            f"{self.interval_start(index).isoformat(timespec='seconds')}"
        )

    def metadata(self, index: int) -> dict[str, str]:
        """The debit's metadata; an interval the course pays names the member and the
        course (``{"member": "alice", "course": "ml101"}``) so the ledger shows both."""
        data = {
            "hub_user": self.username,
            "hub_server": self.server_name,
            "profile": self.profile,
            "server_id": self.server_id,
            "interval": str(index),
        }
        if self.course_pays(index):
            data.update(member=self.username, course=self.course or "")
        if self.kernel is not None:
            data.update(kernel=self.kernel, notebook=self.notebook or "")
        return data

    def to_state(self) -> dict:
        """JSON-able form for spawner state; a new dict each call (never mutated later)."""
        return {
            "version": RECORD_VERSION,
            "username": self.username,
            "server_name": self.server_name,
            "profile": self.profile,
            "started_at": self.started_at.isoformat(),
            "credits_per_hour": str(self.credits_per_hour),
            "interval": self.interval,
            "amount": str(self.amount),
            "debits": {str(k): v for k, v in sorted(self.debits.items())},
            "refunds": {str(k): str(v) for k, v in sorted(self.refunds.items())},
            "refused_at": self.refused_at.isoformat() if self.refused_at else None,
            "refused_balance": (
                None if self.refused_balance is None else str(self.refused_balance)
            ),
            "course": self.course,
            "course_account": self.course_account,
            "paid_until": self.paid_until.isoformat() if self.paid_until else None,
            "kernel": self.kernel,
            "notebook": self.notebook,
            "job": self.job,
        }

    @classmethod
    def from_state(cls, state: dict) -> MeterRecord:
        """Read :meth:`to_state`'s form; raises ValueError for another version or bad data."""
        if not isinstance(state, dict) or state.get("version") != RECORD_VERSION:
            raise ValueError(f"not a version {RECORD_VERSION} credits record: {state!r}")
        try:
            refused_at = state.get("refused_at")
            refused_balance = state.get("refused_balance")
            paid_until = state.get("paid_until")
            return cls(
                username=state["username"],
                server_name=state["server_name"],
                profile=state.get("profile", ""),
                started_at=datetime.fromisoformat(state["started_at"]),
                credits_per_hour=Decimal(state["credits_per_hour"]),
                interval=float(state["interval"]),
                amount=Decimal(state["amount"]),
                debits={int(k): v for k, v in (state.get("debits") or {}).items()},
                refunds={int(k): Decimal(v) for k, v in (state.get("refunds") or {}).items()},
                refused_at=datetime.fromisoformat(refused_at) if refused_at else None,
                refused_balance=None if refused_balance is None else Decimal(refused_balance),
                course=state.get("course"),
                course_account=state.get("course_account"),
                paid_until=datetime.fromisoformat(paid_until) if paid_until else None,
                kernel=state.get("kernel"),
                notebook=state.get("notebook"),
                job=state.get("job"),
            )
        except (KeyError, TypeError, ArithmeticError) as e:
            raise ValueError(f"malformed credits record: {e!r}") from e
