"""The pure profile steps: initialise, filter by group, validate user_options, override."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub_ext.spawn.profiles import (
    ProfileError,
    apply_overrides,
    gpu_request,
    init_profiles,
    profile_overrides,
    select_profile,
    visible_profiles,
)

PROFILES = [
    {"display_name": "CPU only", "spawner_override": {"image": "gpuhub/base:latest"}},
    {
        "display_name": "PyTorch",
        "slug": "pytorch",
        "gpus": 1,
        "credits_per_hour": 2,
        "kubespawner_override": {"image": "gpuhub/pytorch:latest", "environment": {"A": "1"}},
        "profile_options": {
            "gpus": {
                "display_name": "GPUs",
                "choices": {
                    "1": {"display_name": "one", "spawner_override": {"gpus": 1}},
                    "2": {
                        "display_name": "two",
                        "spawner_override": {"gpus": 2, "environment": {"B": "2"}},
                    },
                },
            }
        },
    },
    {"display_name": "Course GPU", "slug": "course", "gpus": 1, "allowed_groups": ["ml101"]},
]


@pytest.fixture
def profiles():
    return init_profiles(PROFILES)


def test_init_fills_slugs_and_one_default(profiles):
    assert [p["slug"] for p in profiles] == ["cpu-only", "pytorch", "course"]
    assert [p["default"] for p in profiles] == [True, False, False]
    assert PROFILES[0].get("slug") is None  # the configured list is not modified


def test_init_refuses_two_defaults():
    with pytest.raises(ProfileError, match="2 defaults"):
        init_profiles(
            [{"display_name": "a", "default": True}, {"display_name": "b", "default": True}]
        )


def test_init_refuses_unknown_override_keys():
    with pytest.raises(ProfileError, match="not supported here: node_selector"):
        init_profiles([{"display_name": "a", "kubespawner_override": {"node_selector": {}}}])


def test_groups_decide_what_a_member_sees(profiles):
    assert [p["slug"] for p in visible_profiles(profiles, [], admin=False)] == [
        "cpu-only",
        "pytorch",
    ]
    assert len(visible_profiles(profiles, ["ml101"], admin=False)) == 3
    assert len(visible_profiles(profiles, [], admin=True)) == 3


def test_empty_options_give_the_default(profiles):
    assert select_profile(profiles, {}).slug == "cpu-only"
    assert select_profile(profiles, None).slug == "cpu-only"


def test_choices_come_as_kubespawner_user_options(profiles):
    sel = select_profile(profiles, {"profile": "pytorch", "gpus": "2"})
    overrides = profile_overrides(sel)
    assert overrides["gpus"] == 2
    assert overrides["image"] == "gpuhub/pytorch:latest"
    assert overrides["environment"] == {"A": "1", "B": "2"}
    assert overrides["credits_per_hour"] == 2


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param(
            {"profile": "gpu-x"},
            "No such profile: 'gpu-x'. Options include: cpu-only, pytorch",
            id="unknown-slug",
        ),
        pytest.param({"profile": "course"}, "not open to your groups", id="group-forbidden"),
        pytest.param({"profile": "pytorch", "gpus": "3"}, "Choices: 1, 2", id="bad-choice"),
        pytest.param(
            {"profile": "pytorch", "image": "evil/miner"}, "Unexpected field", id="forged-image"
        ),
        pytest.param({"profile": ["pytorch"]}, "No such profile", id="list-not-string"),
        pytest.param({"profile": "pytorch", "gpus": True}, "not a choice", id="bool-choice"),
    ],
)
def test_bad_options_name_the_valid_choices(profiles, options, message):
    visible = visible_profiles(profiles, [], admin=False)
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace(".", r"\.")):
        select_profile(visible, options, profiles)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"profile": "B" * 100_000}, id="long-slug"),
        pytest.param({"profile": "pytorch", "gpus": "9" * 100_000}, id="long-choice"),
        pytest.param({"profile": "pytorch", "x" * 100_000: "1"}, id="long-field"),
        pytest.param(
            {"profile": "pytorch", **{f"f{i}": "1" for i in range(1000)}}, id="many-fields"
        ),
    ],
)
def test_bad_values_are_quoted_by_a_short_prefix(profiles, options):
    visible = visible_profiles(profiles, [], admin=False)
    with pytest.raises(ProfileError) as refused:
        select_profile(visible, options, profiles)
    assert len(str(refused.value)) < 400, str(refused.value)[:500]


def test_overrides_merge_dicts():
    class Spawner:
        environment = {"KEEP": "1"}
        image = "x"

    s = Spawner()
    apply_overrides(s, {"environment": {"NEW": "2"}, "image": "y"})
    assert s.environment == {"KEEP": "1", "NEW": "2"}
    assert s.image == "y"


@pytest.mark.parametrize(
    "value, expected", [(0, (0, None)), (2, (2, None)), ("2", (2, None)), ("1g.5gb", (1, "1g.5gb"))]
)
def test_gpu_request(value, expected):
    assert gpu_request(value) == expected


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
forms = st.dictionaries(
    st.sampled_from(["profile", "gpus", "image", "cmd", "environment"]) | st.text(max_size=10),
    st.sampled_from(["cpu-only", "pytorch", "course", "1", "2", "3"]) | json_values,
    max_size=4,
)


@settings(max_examples=500, deadline=None)
@given(options=forms)
def test_arbitrary_forms_are_refused_cleanly_or_give_a_valid_choice(options):
    profiles = init_profiles(PROFILES)
    visible = visible_profiles(profiles, [], admin=False)
    try:
        selection = select_profile(visible, options, profiles)
    except ProfileError as e:
        assert str(e)  # a sentence, never an empty or internal error
        return
    assert selection.profile in visible
    assert set(options) <= {"profile", *selection.profile.get("profile_options", {})}
    overrides = profile_overrides(selection)
    assert set(overrides) <= {"image", "environment", "gpus", "credits_per_hour"}
    if "image" in overrides:
        assert overrides["image"] in {"gpuhub/base:latest", "gpuhub/pytorch:latest"}


SLURM_PROFILE = {
    "display_name": "A100 long",
    "slug": "a100",
    "gpus": 1,
    "spawner_override": {"req_partition": "a100", "req_runtime": "8:00:00"},
}


def test_a_slurm_profile_sets_its_partition_and_run_time():
    """docs/howto/slurm.md: a profile's own req_partition, req_account, req_qos, req_runtime
    in its spawner_override; the Slurm spawner takes them, the Docker one does not."""
    from hub_ext.docker.spawner import GPUDockerSpawner
    from hub_ext.slurm.spawner import GPUSlurmSpawner

    [profile] = init_profiles([SLURM_PROFILE], GPUSlurmSpawner.profile_keys())
    assert profile["spawner_override"] == {"req_partition": "a100", "req_runtime": "8:00:00"}
    with pytest.raises(ProfileError, match="not supported here: req_partition, req_runtime"):
        init_profiles([SLURM_PROFILE], GPUDockerSpawner.profile_keys())


def test_the_idle_cullers_arbiter_reads_any_backends_profiles():
    from hub_ext.culling.arbiter import ProfileIdleLimits

    profile = {**SLURM_PROFILE, "cull_idle_timeout": 600}
    assert ProfileIdleLimits([profile]).profiles[0]["slug"] == "a100"
