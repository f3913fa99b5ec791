"""The spawn page: profile cards that say what each image holds, costs and whether it can
start now (the fields they post become ``user_options`` in :mod:`hub_ext.spawn.choice`).

:class:`SpawnPage` is a part of each backend's spawner (a mixin, the base class of the
backend's availability).  The cards come from the
same functions a spawn uses (:mod:`hub_ext.spawn.profiles`, the backend's free GPUs, the hooks'
``why_not``), so a profile the page offers is one the spawn accepts;
``GET /hub/api/gpuhub/availability`` (:mod:`hub_ext.ops.handlers`) serves them as JSON for the
page's live refresh.  HTML comes from ``share/gpuhub/templates/options_form.html``.

What the page needs of a backend is the methods of :class:`SpawnPage` that raise
NotImplementedError (the seam): the Docker backend answers from its GPU pool
(:class:`hub_ext.docker.availability.PoolAvailability`), the Slurm backend from ``sinfo``
(:class:`hub_ext.slurm.availability.SlurmAvailability`).
"""

from __future__ import annotations

from dataclasses import dataclass

from traitlets import default
from traitlets.config import LoggingConfigurable

from ..common.limits import limits_text
from ..common.templates import render
from .profiles import LABEL_PREFIX, profile_overrides, select_profile


@dataclass(frozen=True)
class GPUsNow:
    """A profile's GPUs as a backend sees them now: ``count`` per server (0: no GPU), of
    ``kind`` (a MIG slice profile such as "1g.5gb", a Slurm GRES type such as "a100", or
    "" for whole GPUs of any type); ``free`` and ``total`` of that kind; ``refusal``: the
    sentence a member reads when ``count`` cannot be had now, or ``""``; ``can_wait``: a
    member refused may wait for them (the backend has such GPUs; False when its inventory
    cannot be read); ``waiting``: members already waiting in the hub's line for that
    kind."""

    count: int
    kind: str = ""
    mig: bool = False
    free: int = 0
    total: int = 0
    simulated: bool = False
    refusal: str = ""
    can_wait: bool = False
    waiting: int = 0


def facts_from_labels(labels: dict) -> dict:
    """An image's labels (the project's ``LABEL_PREFIX`` ones, OCI's description) -> what
    a card shows: {"python", "framework", "framework_version", "cuda", "description"}."""
    return {
        "python": labels.get(LABEL_PREFIX + "python.version", ""),
        "framework": labels.get(LABEL_PREFIX + "framework", ""),
        "framework_version": labels.get(LABEL_PREFIX + "framework.version", ""),
        "cuda": labels.get(LABEL_PREFIX + "cuda.version", ""),
        "description": labels.get("org.opencontainers.image.description", ""),
    }


class SpawnPage(LoggingConfigurable):
    """The spawn page's cards and form (JupyterHub ``Spawner.options_form``), and what a
    backend provides for them: :meth:`gpu_snapshot`, :meth:`gpus_now`,
    :meth:`limits_of`, :meth:`image_facts`, and the class methods :meth:`availability`,
    :meth:`gpu_board` and :meth:`held_gpus` (all required), and
    :meth:`reservation_changed` (optional)."""

    # -- what a backend provides ---------------------------------------------------------

    async def gpu_snapshot(self):
        """What the backend knows of its GPUs now, read once per page; never raises (an
        unreadable inventory is part of the snapshot)."""
        raise NotImplementedError

    def gpus_now(self, snapshot, overrides: dict) -> GPUsNow:
        """A profile's GPUs (``overrides``: the profile's trait values) as ``snapshot``
        has them: free and in all, and why they cannot be had now."""
        raise NotImplementedError

    def limits_of(self, overrides: dict) -> tuple:
        """(memory, CPUs) the backend enforces for a profile, as
        :func:`hub_ext.common.limits.limits_text` reads them (None: no limit)."""
        raise NotImplementedError

    async def image_facts(self, image: str) -> dict:
        """What ``image`` holds ({"python", "framework", "framework_version", "cuda",
        "description"}: :func:`facts_from_labels`); ``{}`` when unknown."""
        raise NotImplementedError

    @classmethod
    async def availability(cls, config, log) -> dict:
        """The counts over every GPU of the backend, for ``GET
        /hub/api/gpuhub/availability`` (:mod:`hub_ext.ops.handlers`; a class method: asked
        with the hub's ``config`` and no spawner)."""
        raise NotImplementedError

    @classmethod
    async def gpu_board(cls, handler) -> dict:
        """The GPU board's model for admins (:mod:`hub_ext.ops.board`; ``handler``: the
        board's request handler)."""
        raise NotImplementedError

    @classmethod
    async def held_gpus(cls, handler, user, servers: list[str]) -> list[dict]:
        """The GPUs ``user``'s servers named in ``servers`` hold now, for ``GET
        /hub/api/gpuhub/gpus/mine`` (:mod:`hub_ext.ops.my_gpus`, which says who may ask):
        one row per GPU, ``{"uuid", "name", "held_by": <server name>,
        "utilization_pct", "memory_used_mib", "memory_total_mib", "simulated"}``
        (percent, MiB; None where the backend cannot say).  Never a GPU another server
        holds; never raises for an unreadable inventory (the rows lose their figures)."""
        raise NotImplementedError

    @classmethod
    async def reservation_changed(cls, handler, spec, reservation_id: int) -> None:
        """Optional: a hub reservation was made or changed (``spec``, a
        :class:`hub_ext.reservations.rules.Spec`) or is being deleted (None), before the
        change is kept.  A backend that holds reservations itself (Slurm) raises
        :class:`hub_ext.reservations.backend.BackendRefused` or ``BackendUnavailable``;
        by default nothing (the hub enforces them)."""

    # -- the page ------------------------------------------------------------------------

    @default("options_form")
    def _default_options_form(self):
        return self._render_options_form

    async def _render_options_form(self, spawner):
        visible, _ = await self.get_profiles()
        if not visible:
            return ""
        cards = await self.profile_cards(visible)
        return render(
            "options_form.html",
            profiles=cards,
            availability_url=self.hub.base_url + "api/gpuhub/availability",
        )

    async def profile_cards(self, profiles: list[dict]) -> list[dict]:
        """What the spawn page shows per profile: the image's contents, GPUs asked, free
        now, its memory and CPU limits, cost, and whether it can start now (with the
        reason when it cannot: too few free GPUs, or a hook's ``why_not``, such as a
        balance that cannot pay).

        Each choice of a ``profile_options`` entry is judged too (the others at their
        defaults): ``choices[option][key]`` is ``""`` or why that choice cannot start, so
        a "2 GPUs" choice is disabled when one GPU is free.  A profile is available when
        its default, or any one of its choices, can start.
        """
        snapshot = await self.gpu_snapshot()
        cards = []
        for profile in profiles:
            slug = profile["slug"]
            card = await self._assess({"profile": slug}, profile, snapshot)
            choices = {
                name: {
                    key: (await self._assess({"profile": slug, name: key}, profile, snapshot))[
                        "why_not"
                    ]
                    for key in option["choices"]
                }
                for name, option in (profile.get("profile_options") or {}).items()
            }
            available = not card["why_not"] or any(
                not why for option in choices.values() for why in option.values()
            )
            # preselected: each option's default, or else its first choice that can start
            chosen = {}
            for name, option in (profile.get("profile_options") or {}).items():
                default = next(k for k, c in option["choices"].items() if c["default"])
                startable = [k for k, why in choices[name].items() if not why]
                chosen[name] = startable[0] if choices[name][default] and startable else default
            image = card["overrides"].get("image", self._configured["image"])
            cards.append(
                {
                    "slug": slug,
                    "profile": profile,
                    "image": image,
                    "facts": await self.image_facts(image),
                    "gpus": card["gpus"],
                    "mig_profile": card["mig_profile"],
                    "gpu_type": card["gpu_type"],
                    "free": card["free"],
                    "total": card["total"],
                    "simulated": card["simulated"],
                    "available": available,
                    "why_not": "" if available else card["why_not"],
                    "can_wait": not available and card["can_wait"],
                    "credits_per_hour": card["credits_per_hour"],
                    "payer": card["payer"],
                    "may_pay_self": card["may_pay_self"],
                    "runs_until": card["runs_until"],
                    "limits": limits_text(*self.limits_of(card["overrides"])),
                    "choices": choices,
                    "chosen": chosen,
                }
            )
        return cards

    async def _assess(self, options: dict, profile: dict, snapshot) -> dict:
        """Can ``options`` (trusted: built by the page itself) start now?  The overrides,
        the GPU request, the free count, ``why_not`` (``""`` when it can) and ``can_wait``
        (no GPU free, or members already waiting, and nothing else in the way: the member
        may wait in line)."""
        overrides = profile_overrides(select_profile([profile], options))
        gpus = self.gpus_now(snapshot, overrides)
        price = float(overrides.get("credits_per_hour", 0) or 0)
        why_not = gpus.refusal
        if not why_not and gpus.count and gpus.waiting and not self.goes_first(gpus):
            why_not = f"No GPU free: {gpus.waiting} member(s) already wait in line for it."
        cannot_pay = await self._hooks_why_not(price)
        payer, may_pay_self = self._hooks_who_pays(price)
        return {
            "payer": payer,
            "may_pay_self": may_pay_self,
            "runs_until": self.runs_until(gpus) if gpus.count and not why_not else "",
            "overrides": overrides,
            "gpus": gpus.count,
            "mig_profile": gpus.kind if gpus.mig else None,
            "gpu_type": "" if gpus.mig else gpus.kind,
            "free": gpus.free,
            "total": gpus.total,
            "simulated": gpus.simulated,
            "credits_per_hour": price,
            "why_not": why_not or cannot_pay,
            "can_wait": bool(why_not and gpus.can_wait and not cannot_pay),
        }

    def _hooks_who_pays(self, credits_per_hour: float) -> tuple[str, bool]:
        """The first hook's word on who pays for a profile of this price (``Hook.who_pays``)."""
        for hook in self.hooks:
            payer, may_pay_self = hook.who_pays(self, credits_per_hour)
            if payer:
                return payer, may_pay_self
        return "", False

    def goes_first(self, gpus) -> bool:
        """Optional seam: whether this member passes those waiting in line for ``gpus``
        (a reservation's window of their group is open), so the card is not disabled
        for the others' places.  Default: False."""
        return False

    def runs_until(self, gpus) -> str:
        """Optional seam: how long a start of ``gpus`` may run before a reservation of a
        group the member is not in may stop it ("1 GPU is reserved for ML101 from 14:00
        UTC to 16:00 UTC: a server started now may run until then (about 40 min)."), or
        ``""``.  Default: ``""``."""
        return ""

    async def _hooks_why_not(self, credits_per_hour: float) -> str:
        """The first hook's reason why a profile of this price cannot start now, or ``""``."""
        for hook in self.hooks:
            why_not = await hook.why_not(self, credits_per_hour)
            if why_not:
                return why_not
        return ""
