"""Home-page messages: one per (user, server, topic), withdrawn by whoever posted them."""

from __future__ import annotations

from types import SimpleNamespace

from hub_ext.common.notices import HomeNotices, home_notices, notices


def test_messages_are_kept_per_server_and_topic():
    board = HomeNotices()
    board.post("alice", "", "credits", "Your credits ran out.")
    board.post("alice", "lab", "culling", "Your server 'lab' was stopped.")
    board.post("alice", "", "credits", "Your credits ran out (balance 0.00).")  # replaces
    assert board.for_user("alice") == [
        "Your server 'lab' was stopped.",
        "Your credits ran out (balance 0.00).",
    ]
    assert board.get("alice", "", "credits") == "Your credits ran out (balance 0.00)."
    board.withdraw("alice", "", "culling")  # another topic: nothing to withdraw
    assert len(board.for_user("alice")) == 2
    board.withdraw("alice", "lab")
    assert board.for_user("alice") == ["Your credits ran out (balance 0.00)."]
    assert board.for_user("bob") == []


def test_home_page_shows_the_logged_in_members_messages_only():
    notices().post("notice-carol", "", "culling", "Your server was stopped.")
    assert home_notices(SimpleNamespace(name="notice-carol")) == ["Your server was stopped."]
    assert home_notices(SimpleNamespace(name="notice-dave")) == []
    assert home_notices(None) == []
    notices().withdraw("notice-carol", "")
