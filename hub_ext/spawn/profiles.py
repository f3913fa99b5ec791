"""The profile list: a row of small pure steps, in KubeSpawner's schema.

A z2jh ``profile_list`` moves over with few changes.  Each profile is a dict::

    {"display_name": "PyTorch, 1 GPU",
     "slug": "pytorch",                 # derived from display_name when missing
     "description": "PyTorch with CUDA",
     "default": True,                   # exactly one profile is the default
     "gpus": 1,                         # whole GPUs, or a MIG slice: "1g.5gb"
     "credits_per_hour": 2,
     "allowed_groups": ["ml-course"],   # empty or missing: everyone
     "jobs": True,                      # GPU notebook jobs may run on it (default: GPU ones)
     "job_max_seconds": 86400,          # a job's longest run (0: no limit)
     "kernels": True,                   # offered as a GPU kernel to every server (default: no)
     "spawner_override": {"image": "gpuhub/pytorch:latest", "mem_limit": "16G"},
     "profile_options": {
         "gpus": {"display_name": "GPUs",
                  "choices": {"1": {"display_name": "1 GPU", "default": True,
                                    "spawner_override": {"gpus": 1}},
                              "2": {"display_name": "2 GPUs",
                                    "spawner_override": {"gpus": 2}}}}}}

``kubespawner_override`` is accepted as a synonym of ``spawner_override`` for the keys
that make sense here.  The steps, in the order the spawner runs them
(KubeSpawner ``_load_profile`` and ``_validate_user_options``):

1. :func:`init_profiles` - deep copy, slugs, exactly one default;
2. :func:`visible_profiles` - the profiles a member's groups allow (admins: all);
3. :func:`select_profile` - validate untrusted ``user_options``, pick profile and choices;
4. :func:`profile_overrides` - the merged overrides of the profile and its choices;
5. :func:`apply_overrides` - ``setattr`` them on the spawner, dicts merged.

Every refusal is a :class:`ProfileError`, which the spawner turns into HTTP 400 with the
valid choices in the message; a bad value is quoted by its first characters only
(:func:`quote`), never echoed whole.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

#: Prefix of the labels the notebook images carry (what a profile card shows: framework,
#: versions) and of the labels each server container gets (owner, devices; both backends
#: run the same images).
LABEL_PREFIX = "io.gpuhub."

__all__ = [
    "ProfileError",
    "Selection",
    "apply_overrides",
    "init_profiles",
    "job_max_seconds",
    "jobs_allowed",
    "kernels_allowed",
    "profile_overrides",
    "profile_requests",
    "quote",
    "select_profile",
    "slugify",
    "visible_profiles",
]

#: spawner traits a profile may set; anything else in an override is a config error
OVERRIDABLE = {
    "image",
    "mem_limit",
    "cpu_limit",
    "environment",
    "volumes",
    "extra_host_config",
    "extra_create_kwargs",
    "gpus",
    "credits_per_hour",
    "cmd",
    "default_url",
    "gpu_idle_timeout",
    "cull_idle_timeout",
    "cull_max_age",
    "pids_limit",
    "shm_size",
}


class ProfileError(ValueError):
    """Bad ``user_options`` or a bad profile list.  ``str()`` is the message for people."""


@dataclass
class Selection:
    """The outcome of :func:`select_profile`: the profile and the chosen option keys."""

    profile: dict
    choices: dict[str, str] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return self.profile["slug"]


def slugify(text: str) -> str:
    """``"PyTorch, 1 GPU"`` -> ``"pytorch-1-gpu"`` (KubeSpawner derives slugs the same way)."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "profile"


def _override(entry: dict, overridable: Iterable[str] | None) -> dict:
    override = dict(entry.get("kubespawner_override") or {})
    override.update(entry.get("spawner_override") or {})
    unknown = set(override) - set(overridable) if overridable is not None else set()
    if unknown:
        raise ProfileError(
            f"profile override keys not supported here: {', '.join(sorted(unknown))}; "
            f"supported: {', '.join(sorted(overridable))}"
        )
    return override


def init_profiles(
    profile_list: Iterable[dict], overridable: Iterable[str] | None = OVERRIDABLE
) -> list[dict]:
    """Deep-copy the configured list, fill in slugs and make exactly one profile default.

    ``overridable``: the override keys the spawner takes (its ``_overridable``: the Slurm
    backend's ``req_partition`` and the like are not Docker's); ``None`` checks none (a
    reader that uses a few keys, such as the idle culler's arbiter).  Raises
    :class:`ProfileError` for duplicate slugs, several defaults, unknown override keys or a
    malformed option.
    """
    profiles = copy.deepcopy(list(profile_list))
    seen = set()
    defaults = [p for p in profiles if p.get("default")]
    if len(defaults) > 1:
        names = ", ".join(p.get("display_name", "?") for p in defaults)
        raise ProfileError(f"profile_list has {len(defaults)} defaults ({names}); keep one")
    for i, profile in enumerate(profiles):
        if "display_name" not in profile:
            raise ProfileError(f"profile {i} has no display_name")
        profile.setdefault("slug", slugify(profile["display_name"]))
        if profile["slug"] in seen:
            raise ProfileError(f"profile_list has the slug {profile['slug']!r} twice")
        seen.add(profile["slug"])
        profile["default"] = bool(profile.get("default")) or (not defaults and i == 0)
        profile.setdefault("description", "")
        _check_job_keys(profile)
        profile["spawner_override"] = _override(profile, overridable)
        profile.pop("kubespawner_override", None)
        for name, option in (profile.get("profile_options") or {}).items():
            choices = option.get("choices") or {}
            if not choices:
                raise ProfileError(f"profile {profile['slug']!r} option {name!r} has no choices")
            option.setdefault("display_name", name)
            option_defaults = [k for k, c in choices.items() if c.get("default")]
            default_key = option_defaults[0] if option_defaults else next(iter(choices))
            for key, choice in choices.items():
                choice.setdefault("display_name", key)
                choice["default"] = key == default_key
                choice["spawner_override"] = _override(choice, overridable)
                choice.pop("kubespawner_override", None)
    return profiles


#: a job's longest run when its profile names none (seconds)
JOB_MAX_SECONDS = 86400


def _check_job_keys(profile: dict) -> None:
    for key in ("jobs", "kernels"):
        value = profile.get(key)
        if value is not None and not isinstance(value, bool):
            raise ProfileError(
                f"profile {profile['slug']!r}: {key} must be true or false, not {value!r}"
            )
    limit = profile.get("job_max_seconds")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ProfileError(
            f"profile {profile['slug']!r}: job_max_seconds must be 0 (no limit) or a positive "
            f"number of seconds, not {limit!r}"
        )


def jobs_allowed(profile: dict) -> bool:
    """Whether GPU notebook jobs may run on ``profile``: its ``jobs`` key, else true for a
    profile with GPUs and false for a CPU one (docs: howto/notebook-jobs)."""
    if profile.get("jobs") is not None:
        return bool(profile["jobs"])
    return gpu_request(profile_overrides(Selection(profile)).get("gpus", 0))[0] > 0


def kernels_allowed(profile: dict) -> bool:
    """Whether ``profile`` is offered as a GPU kernel (a notebook's kernel in a container of
    its own, :mod:`hub_ext.kernels`): its ``kernels`` key, false when missing (docs:
    howto/gpu-kernels)."""
    return profile.get("kernels") is True


def job_max_seconds(profile: dict) -> int:
    """A job's longest run on ``profile`` in seconds (0: no limit); default 86400."""
    limit = profile.get("job_max_seconds")
    return JOB_MAX_SECONDS if limit is None else int(limit)


def visible_profiles(profiles: list[dict], groups: Iterable[str], admin: bool) -> list[dict]:
    """The profiles a member may use: those with no ``allowed_groups``, or sharing a group.

    Admins see every profile.
    """
    if admin:
        return list(profiles)
    groups = set(groups)
    return [p for p in profiles if not p.get("allowed_groups") or groups & set(p["allowed_groups"])]


def quote(value, limit: int = 40) -> str:
    """``repr(value)``, cut to its first ``limit`` characters when longer, with its length:
    untrusted values are quoted in answers and logs, never echoed whole.

    ``quote("B" * 1000)`` -> ``'BBBB…' (1002 characters)`` (``limit`` of them shown).
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def _names(items: Iterable[str], most: int = 10) -> str:
    names = sorted(items)
    if len(names) > most:
        return f"{', '.join(names[:most])} and {len(names) - most} more"
    return ", ".join(names) or "(none)"


def select_profile(
    profiles: list[dict], user_options: dict | None, all_profiles: list[dict] | None = None
) -> Selection:
    """Validate untrusted ``user_options`` and return the chosen profile and choices.

    ``{}`` or None selects the default profile (the first visible one when the default is
    not visible).  Accepted keys: ``profile`` and the names of that profile's options.
    ``all_profiles`` lets the message tell "not allowed for you" from "no such profile".
    Raises :class:`ProfileError` naming the valid choices.
    """
    if user_options is None:
        user_options = {}
    if not isinstance(user_options, dict):
        raise ProfileError("user_options must be a JSON object")
    if not profiles:
        raise ProfileError("No profile is available to you. Ask an admin to add you to a group.")
    by_slug = {p["slug"]: p for p in profiles}
    slug = user_options.get("profile")
    if slug is None:
        profile = next((p for p in profiles if p.get("default")), profiles[0])
    elif not isinstance(slug, str) or slug not in by_slug:
        known = {p["slug"] for p in all_profiles or ()}
        if isinstance(slug, str) and slug in known:
            raise ProfileError(
                f"The profile {slug!r} is not open to your groups. "
                f"Options include: {_names(by_slug)}"
            )
        raise ProfileError(f"No such profile: {quote(slug)}. Options include: {_names(by_slug)}")
    else:
        profile = by_slug[slug]

    options = profile.get("profile_options") or {}
    extra = set(user_options) - {"profile"} - set(options)
    if extra:
        raise ProfileError(
            f"Unexpected field(s) {_names(map(quote, extra))} for profile {profile['slug']!r}. "
            f"Accepted: {_names(['profile', *options])}"
        )
    choices = {}
    for name, option in options.items():
        value = user_options.get(name)
        valid = option["choices"]
        if value is None:
            value = next(k for k, c in valid.items() if c["default"])
        if not isinstance(value, str | int) or isinstance(value, bool) or str(value) not in valid:
            raise ProfileError(
                f"{quote(value)} is not a choice of {name!r} in profile {profile['slug']!r}. "
                f"Choices: {_names(valid)}"
            )
        choices[name] = str(value)
    return Selection(profile=profile, choices=choices)


def profile_overrides(selection: Selection) -> dict:
    """The overrides of the profile, then of each chosen option, dicts merged.

    Our own profile keys (``gpus``, ``credits_per_hour``) become overrides of the spawner
    traits of the same name.
    """
    profile = selection.profile
    merged: dict = {}
    base = dict(profile.get("spawner_override") or {})
    for key in (
        "gpus",
        "credits_per_hour",
        "gpu_idle_timeout",
        "cull_idle_timeout",
        "cull_max_age",
    ):
        if key in profile:
            base.setdefault(key, profile[key])
    _merge(merged, base)
    for name, key in selection.choices.items():
        choice = profile["profile_options"][name]["choices"][key]
        _merge(merged, choice.get("spawner_override") or {})
    return merged


def profile_requests(profiles: list[dict]):
    """Each way a member may start each profile, as ``(label, overrides)``: the profile
    with its options at their defaults (label: its slug), then each other choice of an
    option with the rest at theirs (label ``"slug (option: choice)"``), as the spawn page
    judges them (:mod:`hub_ext.spawn.page`)."""
    for profile in init_profiles(profiles, overridable=None):
        slug = profile["slug"]
        yield slug, profile_overrides(select_profile([profile], {"profile": slug}))
        for name, option in (profile.get("profile_options") or {}).items():
            for key, choice in option["choices"].items():
                if not choice["default"]:
                    selection = select_profile([profile], {"profile": slug, name: key})
                    yield f"{slug} ({name}: {key})", profile_overrides(selection)


def _merge(dest: dict, src: dict) -> dict:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dest.get(key), dict):
            _merge(dest[key], value)
        else:
            dest[key] = copy.deepcopy(value)
    return dest


def apply_overrides(spawner, overrides: dict) -> None:
    """``setattr`` each override on ``spawner``; a dict is merged into the current value."""
    for key, value in overrides.items():
        current = getattr(spawner, key, None)
        if isinstance(value, dict) and isinstance(current, dict):
            value = _merge(copy.deepcopy(current), value)
        setattr(spawner, key, value)


def gpu_request(gpus) -> tuple[int, str | None]:
    """``gpus`` as (count, MIG slice): ``2`` -> (2, None); ``"1g.5gb"`` -> (1, "1g.5gb")."""
    if isinstance(gpus, str) and not gpus.isdigit():
        return 1, gpus
    return int(gpus or 0), None
