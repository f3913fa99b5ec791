"""The line as people and metrics see it: the order, each place's position and estimate.

:class:`LineView` is a part of :class:`hub_ext.line.core.Line` (a mixin; the line holds the
traits, ``places``, ``_joining`` and ``backend``).  The order is the rules' (fair share,
:func:`hub_ext.line.order.sort_key`) under the backend's (a group whose reservation is open
first; the scheduler's own order where it keeps one: Slurm).  A place described is a dict
(position, ``estimate_s`` and ``left_s`` in seconds, the sentence of
:func:`hub_ext.line.order.place_sentence`) for the progress page and the line's endpoints;
the lengths go to ``gpuhub_line_length{profile}`` (``/hub/metrics``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..common import clock, metrics
from .order import NO_ESTIMATE, estimate_wait, expected_left, place_sentence, sort_key
from .place import Place

__all__ = ["LineView"]


class LineView:
    """The order and the descriptions of :class:`hub_ext.line.core.Line`'s places."""

    def ordered(self, units: str | None = None) -> list[Place]:
        """The places (of one kind of unit, or all), in the line's order: the backend's
        scheduler's order where it keeps one (``standing``), places it does not know
        yet after those; within that, the places the backend puts ``first`` (members of
        a group whose reservation is open) ahead."""
        fair = bool(self.fair_share_days)
        places = [p for p in self.places.values() if units is None or p.units == units]
        places.sort(key=lambda p: sort_key(p.front, p.share_hours, p.rank, fair))
        if self.backend is not None:  # stable sorts: unchanged where none is known
            places.sort(key=lambda p: not self.backend.first(p))
            places.sort(key=lambda p: (self.backend.standing(p) or (float("inf"),))[0])
        return places

    def ordered_keys(self) -> list:
        return [p.key for p in self.ordered()]

    def waiting(self, units: str) -> int:
        """How many places wait for this kind of unit (those joining included)."""
        return sum(1 for p in [*self.places.values(), *self._joining.values()] if p.units == units)

    def queued_units(self, user: str) -> int:
        """Units ``user`` waits for in all their places (those joining included)."""
        return sum(
            p.count for p in [*self.places.values(), *self._joining.values()] if p.key[0] == user
        )

    def position(self, key) -> int:
        """1 for the head of its kind's line; 0 when ``key`` has no place."""
        place = self.places.get(key)
        if place is None:
            return 0
        return [p.key for p in self.ordered(place.units)].index(key) + 1

    def _kind(self, units: str) -> tuple[dict, list[int], list]:
        """One kind's line at a glance: position by key, units needed up to each
        position, and the running servers' expected ends."""
        line = self.ordered(units)
        positions = {p.key: i for i, p in enumerate(line)}
        needed, total = [], 0
        for p in line:
            total += p.count
            needed.append(total)
        frees = self.backend.frees(units) if self.backend is not None else []
        return positions, needed, frees

    def describe(self, key, kinds: dict | None = None) -> dict:
        """The place of ``key`` for people: position, estimate (seconds or None), time
        left (seconds) and the sentence.  ``kinds`` caches :meth:`_kind` per unit kind
        when many places are described at once."""
        place = self.places.get(key)
        if place is None:
            return {}
        kinds = {} if kinds is None else kinds
        if place.units not in kinds:
            kinds[place.units] = self._kind(place.units)
        positions, needed, frees = kinds[place.units]
        index = positions[key]
        estimate = estimate_wait(needed[index], frees, self.typical_run)
        unknown = NO_ESTIMATE
        standing = self.backend.standing(place) if self.backend is not None else None
        if standing is not None:  # the scheduler's own line (Slurm)
            index, estimate = standing[0] - 1, standing[1]
            unknown = self.backend.no_estimate
        left = max(0.0, place.queued_at + self.max_wait - clock.now())
        return {
            "user": key[0],
            "server": key[1],
            "profile": place.profile,
            "profile_name": place.profile_name,
            "units": place.units,
            "count": place.count,
            "position": index + 1,
            "estimate_s": estimate,
            "left_s": left,
            "waiting_since": _iso(place.queued_at),
            "front": place.front,
            "waiting": place.waiter is not None,
            "sentence": place_sentence(
                index + 1, place.count, place.unit_word, place.profile_name, estimate, left, unknown
            ),
        }

    def describe_all(self, user: str | None = None) -> list[dict]:
        """Every place (of ``user`` when given), in order, described."""
        kinds: dict = {}
        return [self.describe(p.key, kinds) for p in self.ordered() if user in (None, p.key[0])]

    def expected_left(self, age: float, limits: dict) -> float:
        """:func:`hub_ext.line.order.expected_left` with ``typical_run``."""
        return expected_left(
            age,
            limits.get("max_age", 0),
            limits.get("idle_timeout", 0),
            limits.get("gpu_idle_timeout", 0),
            self.typical_run,
        )

    def _update_metrics(self) -> None:
        counts: dict[str, int] = {}
        for p in self.places.values():
            counts[p.profile] = counts.get(p.profile, 0) + 1
        self._seen |= set(counts)
        for profile in self._seen:  # a line that emptied reads 0, not its last length
            metrics.LINE_LENGTH.labels(profile=profile).set(counts.get(profile, 0))


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")
