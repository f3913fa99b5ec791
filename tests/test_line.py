"""The line's rules as pure functions, and the Line on a real SQLite database (no hub)."""

from __future__ import annotations

import asyncio

import pytest
from traitlets import TraitError

from hub_ext.line import Line, LineBackend, LineLeft, LineRefused
from hub_ext.line.order import (
    Waiting,
    estimate_wait,
    expected_left,
    grants,
    ordinal,
    place_sentence,
    sort_key,
)


@pytest.mark.parametrize(
    "n, word",
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (101, "101st"),
    ],
)
def test_ordinal(n, word):
    assert ordinal(n) == word


def test_place_sentence_reads_as_the_issue_says():
    assert place_sentence(3, 1, "GPU", "PyTorch", 20 * 60, 58 * 60) == (
        "You are 3rd in line for 1 GPU (PyTorch). Estimated wait: about 20 min. "
        "Your place is kept for about 58 min more."
    )


def test_grants_first_come_first_served():
    line = [Waiting("a", 1, 10), Waiting("b", 1, 5), Waiting("c", 1, 1)]
    assert grants(line, 2, backfill_age=0) == ["a", "b"]


def test_a_big_request_lets_smaller_ones_pass_until_its_backfill_age():
    line = [Waiting("big", 2, 100), Waiting("small", 1, 5)]
    assert grants(line, 1, backfill_age=600) == ["small"]
    assert grants(line, 1, backfill_age=60) == []  # waited long enough: nobody passes
    assert grants(line, 1, backfill_age=0) == []  # strict order


def test_a_place_not_waiting_yet_blocks_those_behind_it():
    line = [Waiting("restarted", 1, 100, ready=False), Waiting("b", 1, 5)]
    assert grants(line, 2, backfill_age=600) == []


def test_fair_share_puts_fewer_gpu_hours_first_but_admins_front_wins():
    keys = {
        "heavy": sort_key(False, 30.0, 1, True),
        "light": sort_key(False, 1.0, 2, True),
        "moved": sort_key(True, 99.0, 0, True),
    }
    assert sorted(keys, key=keys.get) == ["moved", "light", "heavy"]
    off = {"heavy": sort_key(False, 30.0, 1, False), "light": sort_key(False, 1.0, 2, False)}
    assert sorted(off, key=off.get) == ["heavy", "light"]


def test_estimate_from_running_servers():
    frees = [(600.0, 1), (1200.0, 1)]
    assert estimate_wait(1, frees, 3600) == 600
    assert estimate_wait(2, frees, 3600) == 1200
    assert estimate_wait(3, frees, 3600) == 600 + 3600  # a second round
    assert estimate_wait(1, [], 3600) is None
    assert (
        expected_left(age=100, max_age=1000, idle_timeout=60, gpu_idle_timeout=0, typical_run=3600)
        == 900
    )
    assert expected_left(100, 0, 1800, 900, 3600) == 900
    assert expected_left(100, 0, 0, 0, 3600) == 3500


class OneFreeGPU(LineBackend):
    """A backend with ``free`` whole GPUs; grants take them."""

    def __init__(self, free: int):
        self.free, self.granted = free, []

    def free_units(self, units):
        return self.free

    def grant(self, place):
        if self.free < place.count:
            return None
        self.free -= place.count
        self.granted.append(place.key)
        return f"gpu-for-{place.key[0]}"

    def ungrant(self, place, grant):
        self.free += place.count

    def frees(self, units):
        return [(600.0, 1)]


@pytest.fixture
def line(hub_db):
    line = Line(update_interval=0.05)
    line.attach(hub_db, OneFreeGPU(0))
    return line


async def join(line, user, profile="gpu", server=""):
    return await line.join(
        (user, server),
        profile=profile,
        profile_name="PyTorch",
        units="gpu",
        count=1,
        user_options={"profile": profile},
    )


async def test_places_are_kept_in_the_database_in_order(line, hub_db):
    for user in ("bob", "carol", "dave"):
        await join(line, user)
    line.move_to_front(("dave", ""))
    await line.written()  # the rows are written in the background
    again = Line()
    again.attach(hub_db)
    assert again.ordered_keys() == [("dave", ""), ("bob", ""), ("carol", "")]


async def test_one_place_per_member_and_profile(line):
    await join(line, "bob")
    with pytest.raises(LineRefused, match="already in line for PyTorch"):
        await join(line, "bob", server="other")
    await join(line, "bob", profile="tf", server="other")  # another profile: fine


async def test_a_freed_gpu_goes_to_the_head_and_the_waiter_wakes(line):
    await join(line, "bob")
    await join(line, "carol")
    updates = []
    bob = asyncio.ensure_future(line.wait_turn(("bob", ""), updates.append))
    carol = asyncio.ensure_future(line.wait_turn(("carol", ""), lambda _: None))
    await asyncio.sleep(0.1)
    line.backend.free = 1
    line.dispatch()
    assert await bob == "gpu-for-bob"
    assert not carol.done()
    assert line.position(("carol", "")) == 1
    assert updates[0]["sentence"].startswith("You are 1st in line for 1 GPU (PyTorch).")
    carol.cancel()
    with pytest.raises(asyncio.CancelledError):
        await carol
    assert line.places == {}  # a cancelled wait leaves the line


async def test_removal_and_expiry_end_the_wait_with_a_sentence(line):
    await join(line, "bob")
    waiting = asyncio.ensure_future(line.wait_turn(("bob", ""), lambda _: None))
    await asyncio.sleep(0.05)
    line.remove(("bob", ""), "removed", "An admin removed your place in line.")
    with pytest.raises(LineLeft, match="An admin removed"):
        await waiting
    line.max_wait = 0.1
    await join(line, "carol")
    with pytest.raises(LineLeft, match="expired: no GPU freed within 0.1 s"):
        await line.wait_turn(("carol", ""), lambda _: None)


def test_the_wait_button_picks_its_profile_and_asks_to_wait():
    from hub_ext.spawn.choice import options_from_form

    form = {"profile": ["cpu"], "gpuhub_wait": ["pytorch"], "pytorch--gpus": ["2"]}
    assert options_from_form(form, 8192) == {"profile": "pytorch", "wait": True, "gpus": "2"}
    assert options_from_form({"profile": ["cpu"]}, 8192) == {"profile": "cpu"}


def test_line_config_gives_its_service_a_private_token_and_only_server_scopes(tmp_path):
    import stat

    from traitlets.config import Config

    from hub_ext.config import Settings
    from hub_ext.line.hubconfig import LINE_SERVICE, apply_line_config

    settings = Settings(state_dir=tmp_path, line_max_wait=600, line_backfill_age=0)
    c = Config()
    apply_line_config(c, settings)
    token_file = tmp_path / "gpuhub-line-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert c.Line.api_token == token_file.read_text().strip()
    assert (c.Line.max_wait, c.Line.backfill_age, c.Line.fair_share_days) == (600, 0, 0)
    [service] = [s for s in c.JupyterHub.services if s["name"] == LINE_SERVICE]
    [role] = [r for r in c.JupyterHub.load_roles if r["services"] == [LINE_SERVICE]]
    assert role["scopes"] == ["servers", "read:users:name"]
    apply_line_config(c, settings)  # the same token across restarts
    assert c.Line.api_token == service["api_token"]


@pytest.mark.parametrize(
    "trait, value", [("max_wait", 0), ("backfill_age", -1), ("fair_share_days", -2)]
)
def test_line_settings_are_checked(trait, value):
    with pytest.raises(TraitError, match=f"'{trait}' trait of a Line instance"):
        Line(**{trait: value})


async def test_a_start_cancelled_right_after_its_grant_is_forgotten(line, hub_db):
    await join(line, "bob")
    waiting = asyncio.ensure_future(line.wait_turn(("bob", ""), lambda _: None))
    await asyncio.sleep(0.05)
    waiting.cancel()  # the member stopped the pending server ...
    line.backend.free = 1
    line.dispatch()  # ... and a GPU freed in the same step: granted before it resumed
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert line.granted == {}
    assert line.backend.free == 1  # the grant went back
    await line.written()
    again = Line()
    again.attach(hub_db)
    assert again.ordered_keys() == []  # nothing resumed after a restart
    await join(line, "bob")  # and the next join is not refused by a row left behind


async def test_a_stop_just_after_the_grant_still_stops_the_start(line):
    # The other order: the GPU is granted first, then the member stops the pending server
    # before the waiting start resumes.  Python 3.11's asyncio.wait_for returns the result
    # of a future that completed alongside its own cancellation (bpo-42130, changed in
    # 3.12), which would let this start go on after its stop.
    await join(line, "bob")
    waiting = asyncio.ensure_future(line.wait_turn(("bob", ""), lambda _: None))
    await asyncio.sleep(0.05)
    line.backend.free = 1
    line.dispatch()  # bob's turn ...
    waiting.cancel()  # ... and his stop, in the same step
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert line.granted == {}
    assert line.backend.free == 1  # the grant went back


async def test_a_join_cancelled_while_its_row_is_written_leaves_no_row(line, hub_db):
    joining = asyncio.ensure_future(join(line, "bob"))
    await asyncio.sleep(0)  # the insert is submitted
    joining.cancel()
    with pytest.raises(asyncio.CancelledError):
        await joining
    await line.written()
    again = Line()
    again.attach(hub_db)
    assert again.ordered_keys() == []
    await join(line, "bob")


async def test_a_granted_start_still_counts_as_the_members_place(line):
    await join(line, "bob")
    waiting = asyncio.ensure_future(line.wait_turn(("bob", ""), lambda _: None))
    await asyncio.sleep(0.05)
    line.backend.free = 1
    line.dispatch()
    await waiting  # granted, still starting
    with pytest.raises(LineRefused, match="already in line for PyTorch"):
        await join(line, "bob", server="other")


async def test_a_row_already_in_the_database_is_a_refusal_not_an_error(line, hub_db):
    await join(line, "bob")
    await line.written()
    other = Line()  # another process's line, not knowing of bob's place
    other.attach(hub_db)
    other.places.clear()
    with pytest.raises(LineRefused, match="already in line for PyTorch"):
        await join(other, "bob", server="other")


class PerMemberLimit(OneFreeGPU):
    """One GPU per member: ``busy`` members hold theirs already."""

    def __init__(self, free, busy):
        super().__init__(free)
        self.busy = busy

    def fits(self, place):
        return place.key[0] not in self.busy


async def test_a_head_over_its_members_limit_lets_the_others_pass(line):
    line.backend = PerMemberLimit(0, busy={"bob"})
    await join(line, "bob")
    await join(line, "carol")
    bob = asyncio.ensure_future(line.wait_turn(("bob", ""), lambda _: None))
    carol = asyncio.ensure_future(line.wait_turn(("carol", ""), lambda _: None))
    await asyncio.sleep(0.05)
    line.backend.free = 1
    line.dispatch()
    assert ("carol", "") in line.granted  # bob, over his limit, does not hold her up
    assert await carol == "gpu-for-carol"
    assert line.position(("bob", "")) == 1
    bob.cancel()


def test_line_token_file_is_narrowed_and_an_empty_one_refused(tmp_path):
    import stat

    from hub_ext.line.hubconfig import line_token

    path = tmp_path / "gpuhub-line-token"
    path.write_text("abc\n")
    path.chmod(0o644)
    assert line_token(tmp_path) == "abc"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("")
    with pytest.raises(ValueError, match="is empty; delete it"):
        line_token(tmp_path)


def test_only_the_admin_role_may_change_the_line_not_the_cli_token(tmp_path):
    from traitlets.config import Config

    from hub_ext.config import Settings
    from hub_ext.line.handlers import LINE_ADMIN_SCOPE as HANDLERS_SCOPE
    from hub_ext.ops.board import (
        CLI_SERVICE,
        GPUS_SCOPE,
        LINE_ADMIN_SCOPE,
        ROLE_NAME,
        apply_admin_config,
    )

    c = Config()
    apply_admin_config(c, Settings(state_dir=tmp_path))
    roles = {r["name"]: r["scopes"] for r in c.JupyterHub.load_roles}
    assert LINE_ADMIN_SCOPE == HANDLERS_SCOPE and LINE_ADMIN_SCOPE in c.JupyterHub.custom_scopes
    assert roles[ROLE_NAME] == [GPUS_SCOPE, LINE_ADMIN_SCOPE]
    assert roles[CLI_SERVICE] == [GPUS_SCOPE]


async def test_a_restart_asks_again_when_the_hub_refuses_for_now_and_keeps_the_place(line):
    """A stand-in for the hub's REST API: 429 (its spawn limits) twice, then 202."""
    from tornado.web import Application, RequestHandler

    from hub_ext.line.resume import resume_places

    asked = []

    class Hub(RequestHandler):
        def get(self):
            self.write("{}")

        def post(self, user):
            asked.append(user)
            self.set_status(429 if len(asked) <= 2 else 202)

    app = Application([(r"/hub/api/", Hub), (r"/hub/api/users/([^/]+)/server", Hub)])
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    line.api_token = "t"
    await join(line, "bob")
    try:
        await resume_places(line, f"http://127.0.0.1:{port}/hub/api", retry_delay=0.01)
    finally:
        server.stop()
    assert asked == ["bob", "bob", "bob"]
    assert line.position(("bob", "")) == 1  # the place is kept
