"""The line's rules as pure functions: order, who gets freed units, the wait estimate.

No hub, no database, no clock: the callers pass what they know, the tests check the rules.

Policy when units free up (per kind of unit: whole GPUs, or one MIG slice profile, each
kind has a line of its own): walk the line in order and grant every request that fits in
what is free.  A request that does not fit (2 GPUs asked, 1 free) lets the ones behind it
start in the meantime ("backfill", as Slurm's backfill scheduler does), until it has
waited ``backfill_age`` seconds: from then on nobody behind it is granted, so the units
free up for it.  ``backfill_age = 0`` is strict order.  A place whose server is not
waiting right now (the hub restarted and has not started it again yet) blocks the ones
behind it, so a restart never changes the order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Waiting",
    "estimate_wait",
    "expected_left",
    "grants",
    "ordinal",
    "place_sentence",
    "sort_key",
]


@dataclass
class Waiting:
    """What the rules need of one place: ``count`` units, waiting ``age`` seconds,
    ``ready`` when its server is waiting in this hub process now."""

    key: object
    count: int
    age: float
    ready: bool = True


def sort_key(front: bool, share_hours: float, rank: float, fair_share: bool) -> tuple:
    """Order of the line: admins' "move to front" first, then (fair share on) fewer
    GPU-hours first, then first come, first served."""
    return (0 if front else 1, share_hours if fair_share else 0.0, rank)


def grants(
    line: Sequence[Waiting],
    free: int,
    backfill_age: float,
    fits: Callable[[Waiting], bool] | None = None,
) -> list[object]:
    """Keys of the places to grant now, in order, with ``free`` units free.

    ``line`` is one kind of unit's line, in order.  ``fits(place)``, when given, is asked
    before a grant (e.g. the per-member limit); a place that does not fit counts as one
    that cannot start yet.
    """
    granted = []
    for place in line:
        if not place.ready:
            break
        if place.count <= free and (fits is None or fits(place)):
            granted.append(place.key)
            free -= place.count
            continue
        if backfill_age <= 0 or place.age >= backfill_age:
            break
    return granted


def expected_left(
    age: float, max_age: float, idle_timeout: float, gpu_idle_timeout: float, typical_run: float
) -> float:
    """Seconds until a running server is expected to free its units: what is left of its
    maximum age when it has one; else the shortest culler timeout (a member who walks away
    is stopped after it); else ``typical_run`` less its age.  Never below 0."""
    if max_age:
        return max(0.0, max_age - age)
    timeouts = [t for t in (idle_timeout, gpu_idle_timeout) if t]
    if timeouts:
        return float(min(timeouts))
    return max(0.0, typical_run - age)


def estimate_wait(
    units_needed: int, frees: Iterable[tuple[float, int]], typical_run: float
) -> float | None:
    """Seconds until ``units_needed`` units (those of the places ahead, and one's own)
    have freed, from ``frees``: (seconds until it frees, units) per running server.

    Past the running servers, each further round of them takes ``typical_run``.  None when
    nothing of this kind runs (no basis for a guess).
    """
    order = sorted(frees)
    total = sum(n for _, n in order)
    if not order or total <= 0:
        return None
    rounds, rest = divmod(max(units_needed, 1) - 1, total)
    seen = 0
    for left, n in order:
        seen += n
        if seen > rest:
            return left + rounds * typical_run
    return order[-1][0] + rounds * typical_run  # pragma: no cover - seen reaches total


def ordinal(n: int) -> str:
    """1 -> "1st", 2 -> "2nd", 3 -> "3rd", 11 -> "11th", 22 -> "22nd"."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def minutes(seconds: float) -> str:
    """A wait for people: "about 20 min", "about 2 h 10 min", "less than a minute"."""
    if seconds < 60:
        return "less than a minute"
    total = round(seconds / 60)
    if total < 60:
        return f"about {total} min"
    hours, mins = divmod(total, 60)
    return f"about {hours} h" + (f" {mins} min" if mins else "")


#: what the sentence says when the line has no estimate (nothing of the kind runs)
NO_ESTIMATE = "unknown (nothing of this kind runs)"


def place_sentence(
    position: int,
    count: int,
    unit: str,
    profile_name: str,
    estimate: float | None,
    left: float,
    unknown: str = NO_ESTIMATE,
) -> str:
    """ "You are 3rd in line for 1 GPU (PyTorch). Estimated wait: about 20 min. Your place
    is kept for about 58 min more." ``unit`` is "GPU" or "1g.5gb GPU slice"; ``estimate``
    and ``left`` in seconds; ``unknown`` is said when ``estimate`` is None (Slurm's
    backend: "unknown", ``squeue --start`` has no estimate)."""
    what = f"{count} {unit}{'' if count == 1 else 's'}"
    guess = minutes(estimate) if estimate is not None else unknown
    return (
        f"You are {ordinal(position)} in line for {what} ({profile_name}). "
        f"Estimated wait: {guess}. Your place is kept for {minutes(left)} more."
    )
