"""The spawn page: profile cards that say what each image holds, costs and whether it can
start now (the fields they post become ``user_options`` in :mod:`hub_ext.choice`).

:class:`SpawnPage` is a part of :class:`hub_ext.docker.spawner.GPUDockerSpawner` (a mixin).  The
cards come from the same functions a spawn uses (:mod:`hub_ext.profiles`, the pool's
counts, the hooks' ``why_not``), so a profile the page offers is one the spawn accepts;
``GET /hub/api/gpuhub/availability`` (:mod:`hub_ext.handlers`) serves them as JSON for the
page's live refresh.  HTML comes from ``share/gpuhub/templates/options_form.html``.
"""

from __future__ import annotations

import time

from docker.errors import APIError, NotFound
from traitlets.config import LoggingConfigurable

from .limits import limits_text
from .profiles import LABEL_PREFIX, gpu_request, profile_overrides, select_profile
from .templates import render


class SpawnPage(LoggingConfigurable):
    """The spawn page's cards and form (JupyterHub ``Spawner.options_form``)."""

    async def _render_options_form(self, spawner):
        visible, _ = await self.get_profiles()
        if not visible:
            return ""
        cards = await self.profile_cards(visible)
        return render("options_form.html", profiles=cards,
                      availability_url=self.hub.base_url + "api/gpuhub/availability")

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
        try:
            devices = await self.pool.devices()
        except Exception as e:  # noqa: BLE001 - the page still renders; spawns say why
            self.log.warning("GPU inventory unavailable for the spawn page: %s", e)
            devices = []
        cards = []
        for profile in profiles:
            slug = profile["slug"]
            card = await self._assess({"profile": slug}, profile, devices)
            choices = {
                name: {key: (await self._assess({"profile": slug, name: key}, profile,
                                                devices))["why_not"]
                       for key in option["choices"]}
                for name, option in (profile.get("profile_options") or {}).items()
            }
            available = not card["why_not"] or any(
                not why for option in choices.values() for why in option.values())
            # preselected: each option's default, or else its first choice that can start
            chosen = {}
            for name, option in (profile.get("profile_options") or {}).items():
                default = next(k for k, c in option["choices"].items() if c["default"])
                startable = [k for k, why in choices[name].items() if not why]
                chosen[name] = startable[0] if choices[name][default] and startable else default
            image = card["overrides"].get("image", self._configured["image"])
            cards.append({
                "slug": slug,
                "profile": profile,
                "image": image,
                "facts": await self.image_facts(image),
                "gpus": card["gpus"],
                "mig_profile": card["mig_profile"],
                "free": card["free"],
                "total": card["total"],
                "simulated": card["simulated"],
                "available": available,
                "why_not": "" if available else card["why_not"],
                "can_wait": not available and card["can_wait"],
                "credits_per_hour": card["credits_per_hour"],
                "limits": limits_text(card["overrides"].get("mem_limit"),
                                      card["overrides"].get("cpu_limit")),
                "choices": choices,
                "chosen": chosen,
            })
        return cards

    async def _assess(self, options: dict, profile: dict, devices: list) -> dict:
        """Can ``options`` (trusted: built by the page itself) start now?  The overrides,
        the GPU request, the free count, ``why_not`` (``""`` when it can) and ``can_wait``
        (no GPU free, or members already waiting, and nothing else in the way: the member
        may wait in line)."""
        overrides = profile_overrides(select_profile([profile], options))
        count, mig = gpu_request(overrides.get("gpus", self._configured["gpus"]))
        summary = self.pool.summary(devices, mig_profile=mig)
        price = float(overrides.get("credits_per_hour", 0) or 0)
        waiting = self.line().waiting(mig or "gpu") if count else 0
        why_not = ""
        if count and summary.free < count:
            why_not = self.pool.refusal_message(devices, count, mig)
        elif waiting:
            why_not = f"No GPU free: {waiting} member(s) already wait in line for it."
        cannot_pay = await self._hooks_why_not(price)
        return {"overrides": overrides, "gpus": count, "mig_profile": mig,
                "free": summary.free, "total": summary.total,
                "simulated": summary.kind == "simulated", "credits_per_hour": price,
                "why_not": why_not or cannot_pay,
                "can_wait": bool(why_not and summary.total and not cannot_pay)}

    async def _hooks_why_not(self, credits_per_hour: float) -> str:
        """The first hook's reason why a profile of this price cannot start now, or ``""``."""
        for hook in self.hooks:
            ask = getattr(hook, "why_not", None)
            why_not = await ask(self, credits_per_hour) if ask is not None else ""
            if why_not:
                return why_not
        return ""

    #: image name -> (time.monotonic() of the read, facts); shared by every spawner
    _image_facts: dict[str, tuple[float, dict]] = {}
    #: seconds an image's facts are reused before Docker is asked again (a rebuilt tag)
    image_facts_max_age = 60.0

    async def image_facts(self, image: str) -> dict:
        """What an image contains, from its labels, read at most once a minute per image
        (the spawn page polls; Docker is not asked for every card of every poll).

        Returns {"python", "framework", "framework_version", "cuda", "description"};
        ``{}`` when the image is not on this node.
        """
        cached = self._image_facts.get(image)
        if cached is not None and time.monotonic() - cached[0] < self.image_facts_max_age:
            return cached[1]
        try:
            info = await self.docker("inspect_image", image)
        except (NotFound, APIError):
            facts = {}
        else:
            labels = (info.get("Config") or {}).get("Labels") or {}
            facts = {
                "python": labels.get(LABEL_PREFIX + "python.version", ""),
                "framework": labels.get(LABEL_PREFIX + "framework", ""),
                "framework_version": labels.get(LABEL_PREFIX + "framework.version", ""),
                "cuda": labels.get(LABEL_PREFIX + "cuda.version", ""),
                "description": labels.get("org.opencontainers.image.description", ""),
            }
        self._image_facts[image] = (time.monotonic(), facts)
        return facts
