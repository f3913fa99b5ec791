"""``gpuhub credits grant|balance|history`` against the real reference service."""

from __future__ import annotations

import asyncio

import pytest

from hub_ext.credits.cli import main


@pytest.fixture
def cli_env(monkeypatch, credits_service):
    monkeypatch.setenv("GPUHUB_CREDITS_URL", credits_service.url)
    monkeypatch.setenv("GPUHUB_CREDITS_TOKEN", credits_service.hub_token)
    monkeypatch.setenv("GPUHUB_CREDITS_ADMIN_TOKEN", credits_service.admin_token)
    return credits_service


def test_grant_then_balance_then_history(cli_env, credits_username, capsys):
    assert main(["credits", "grant", credits_username, "100", "--reason", "course budget"]) == 0
    out = capsys.readouterr().out
    assert f"Granted 100.00 credits to {credits_username}. Balance: 100.00" in out

    async def spend():
        async with cli_env.client() as hub:
            await hub.debit(credits_username, "2.50", key="cli-test-debit-1", reason="gpu interval")

    asyncio.run(spend())

    assert main(["balance", credits_username]) == 0
    assert capsys.readouterr().out.strip() == f"{credits_username}: 97.50 credits"

    assert main(["history", credits_username]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["WHEN", "(UTC)", "KIND", "AMOUNT", "BALANCE", "REASON"]
    assert lines[1].split()[2:] == ["debit", "-2.50", "97.50", "gpu", "interval"]
    assert lines[2].split()[2:] == ["grant", "+100.00", "100.00", "course", "budget"]


def test_grant_with_the_same_key_grants_once(cli_env, credits_username, capsys):
    assert main(["grant", credits_username, "5", "--key", "cli-grant-fixed-1"]) == 0
    assert main(["grant", credits_username, "5", "--key", "cli-grant-fixed-1"]) == 0
    out = capsys.readouterr().out
    assert "Already granted (same key)" in out
    assert main(["balance", credits_username]) == 0
    assert "5.00 credits" in capsys.readouterr().out


def test_history_limit(cli_env, credits_username, capsys):
    for n in range(5):
        main(["grant", credits_username, f"{n + 1}"])
    capsys.readouterr()
    assert main(["history", credits_username, "--limit", "2"]) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [row.split()[3] for row in rows] == ["+5.00", "+4.00"]


def test_unknown_account_exits_1_with_a_message(cli_env, credits_username, capsys):
    assert main(["balance", credits_username]) == 1
    err = capsys.readouterr().err
    assert "account_not_found" in err
    assert cli_env.hub_token not in err


def test_grant_with_only_the_hub_token_is_refused(cli_env, credits_username, capsys, monkeypatch):
    monkeypatch.delenv("GPUHUB_CREDITS_ADMIN_TOKEN")
    assert main(["grant", credits_username, "5"]) == 1
    assert "403" in capsys.readouterr().err


@pytest.mark.parametrize("amount", ["1.005", "-3", "lots"])
def test_bad_amount_is_a_usage_error(cli_env, credits_username, capsys, amount):
    assert main(["grant", credits_username, amount]) == 2
    assert "not an amount of credits" in capsys.readouterr().err


def test_missing_url_is_a_usage_error(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("GPUHUB_CREDITS_URL", raising=False)
    monkeypatch.setenv("GPUHUB_STATE_DIR", str(tmp_path))  # no hub's token files here
    assert main(["balance", "alice"]) == 2
    assert "GPUHUB_CREDITS_URL" in capsys.readouterr().err


def test_unreachable_service_exits_1(monkeypatch, capsys):
    monkeypatch.setenv("GPUHUB_CREDITS_TOKEN", "t")
    assert main(["--url", "http://127.0.0.1:9", "balance", "alice"]) == 1
    assert "failed after" in capsys.readouterr().err
