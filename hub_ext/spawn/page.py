"""The spawn page: profile cards that say what each image holds, costs and whether it can
start now (the fields they post become ``user_options`` in :mod:`hub_ext.spawn.choice`).

The cards come from the same functions a spawn uses (:mod:`hub_ext.spawn.profiles`, the
backend's free GPUs, the hooks' ``why_not``), so a profile the page offers is one the spawn
accepts; ``GET /hub/api/gpuhub/availability`` (:mod:`hub_ext.ops.handlers`) serves them as
JSON for the page's live refresh.  What the page asks of a backend is part of
:class:`hub_ext.spawn.backend.SpawnBackend` (what is free now: ``gpu_snapshot``,
``gpus_now``; ``limits_of``, ``image_facts``).  HTML comes from
``share/gpuhub/templates/options_form.html``.
"""

from __future__ import annotations

from dataclasses import dataclass

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


async def render_form(spawner) -> str:
    """The spawn form (JupyterHub ``Spawner.options_form``): a card per profile open to
    the member; ``""`` when the hub has no profiles."""
    visible, _ = await spawner.get_profiles()
    if not visible:
        return ""
    cards = await profile_cards(spawner, visible)
    return render(
        "options_form.html",
        profiles=cards,
        availability_url=spawner.hub.base_url + "api/gpuhub/availability",
    )


async def profile_cards(spawner, profiles: list[dict]) -> list[dict]:
    """What the spawn page shows per profile: the image's contents, GPUs asked, free
    now, its memory and CPU limits, cost, and whether it can start now (with the
    reason when it cannot: too few free GPUs, or a hook's ``why_not``, such as a
    balance that cannot pay).

    Each choice of a ``profile_options`` entry is judged too (the others at their
    defaults): ``choices[option][key]`` is ``""`` or why that choice cannot start, so
    a "2 GPUs" choice is disabled when one GPU is free.  A profile is available when
    its default, or any one of its choices, can start.
    """
    snapshot = await spawner.gpu_snapshot()
    cards = []
    for profile in profiles:
        slug = profile["slug"]
        card = await _assess(spawner, {"profile": slug}, profile, snapshot)
        choices = {
            name: {
                key: (await _assess(spawner, {"profile": slug, name: key}, profile, snapshot))[
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
        image = card["overrides"].get("image", spawner.configured_value("image"))
        cards.append(
            {
                "slug": slug,
                "profile": profile,
                "image": image,
                "facts": await spawner.image_facts(image),
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
                "limits": limits_text(*spawner.limits_of(card["overrides"])),
                "choices": choices,
                "chosen": chosen,
            }
        )
    return cards


async def _assess(spawner, options: dict, profile: dict, snapshot) -> dict:
    """Can ``options`` (trusted: built by the page itself) start now?  The overrides,
    the GPU request, the free count, ``why_not`` (``""`` when it can) and ``can_wait``
    (no GPU free, or members already waiting, and nothing else in the way: the member
    may wait in line)."""
    overrides = profile_overrides(select_profile([profile], options))
    gpus = spawner.gpus_now(snapshot, overrides)
    price = float(overrides.get("credits_per_hour", 0) or 0)
    why_not = gpus.refusal
    if not why_not and gpus.count and gpus.waiting and not spawner.goes_first(gpus):
        why_not = f"No GPU free: {gpus.waiting} member(s) already wait in line for it."
    cannot_pay = await _hooks_why_not(spawner, price)
    payer, may_pay_self = _hooks_who_pays(spawner, price)
    return {
        "payer": payer,
        "may_pay_self": may_pay_self,
        "runs_until": spawner.runs_until(gpus) if gpus.count and not why_not else "",
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


def _hooks_who_pays(spawner, credits_per_hour: float) -> tuple[str, bool]:
    """The first hook's word on who pays for a profile of this price (``Hook.who_pays``)."""
    for hook in spawner.hooks:
        payer, may_pay_self = hook.who_pays(spawner, credits_per_hour)
        if payer:
            return payer, may_pay_self
    return "", False


async def _hooks_why_not(spawner, credits_per_hour: float) -> str:
    """The first hook's reason why a profile of this price cannot start now, or ``""``."""
    for hook in spawner.hooks:
        why_not = await hook.why_not(spawner, credits_per_hour)
        if why_not:
            return why_not
    return ""
