"""CreditsClient against scripted answers (httpx.MockTransport): the contract, as the hub sends it.

Each test double is named by what it does (``LedgerDown``, ``FlakyLedger``...).  The real
service is exercised in test_service.py; here the point is the client's side: what it
sends, how it retries, and how it reads (or refuses) what comes back.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal

import httpx
import pytest

from hub_ext.credits import (
    AccountNotFound,
    CreditsAuthError,
    CreditsClient,
    CreditsContractError,
    CreditsError,
    CreditsUnavailable,
    DebitNotFound,
    IdempotencyConflict,
    InsufficientCredits,
    InvalidCreditsRequest,
    RefundExceedsDebit,
)

TOKEN = "tok-0123456789-very-secret"
URL = "http://credits.test"


def transaction(kind="debit", username="alice", amount="1.50", balance="8.50", **extra) -> dict:
    body = {
        "transaction_id": "txn_1",
        "kind": kind,
        "username": username,
        "amount": amount,
        "balance": balance,
        "debit_id": None,
        "created_at": "2025-11-21T10:00:00.000000Z",
    }
    body.update(extra)
    return body


def answer(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


class ScriptedLedger:
    """Answers each request with the next scripted item (a Response or an exception to raise)."""

    def __init__(self, *script):
        self.script = list(script)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        item = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(item, Exception):
            raise item
        return item


@pytest.fixture
def sleeps(monkeypatch) -> list[float]:
    """Back-off delays the client asked for; nothing actually waits."""
    delays: list[float] = []

    async def fake_sleep(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr("hub_ext.credits.client.asyncio.sleep", fake_sleep)
    return delays


def make_client(ledger, **kwargs) -> CreditsClient:
    return CreditsClient(url=URL, token=TOKEN, transport=httpx.MockTransport(ledger), **kwargs)


# -- what is sent -----------------------------------------------------------------------------


async def test_debit_sends_contract_body_token_and_idempotency_key():
    ledger = ScriptedLedger(answer(201, transaction(metadata={"server": "gpu-1"})))
    async with make_client(ledger) as client:
        entry = await client.debit(
            "alice",
            Decimal("1.5"),
            key="alice/gpu-1/000001",
            reason="interval",
            metadata={"server": "gpu-1"},
        )
    (request,) = ledger.requests
    assert request.method == "POST"
    assert request.url.path == "/v1/accounts/alice/debits"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Idempotency-Key"] == "alice/gpu-1/000001"
    assert json.loads(request.content) == {
        "amount": "1.50",
        "reason": "interval",
        "metadata": {"server": "gpu-1"},
    }
    assert entry.amount == Decimal("1.50") and entry.balance == Decimal("8.50")
    assert entry.metadata == {"server": "gpu-1"}
    assert entry.replayed is False


@pytest.mark.parametrize(
    ("amount", "sent"),
    [
        pytest.param(Decimal("1.5"), "1.50", id="decimal-one-place"),
        pytest.param(Decimal("0.10"), "0.10", id="decimal-two-places"),
        pytest.param(2, "2.00", id="int"),
        pytest.param("3", "3.00", id="contract-string"),
        pytest.param(Decimal("1E+2"), "100.00", id="decimal-exponent"),
    ],
)
async def test_amounts_are_sent_as_strings_with_two_places(amount, sent):
    ledger = ScriptedLedger(answer(201, transaction(kind="grant", amount=sent)))
    async with make_client(ledger) as client:
        await client.grant("alice", amount, key="grant-key-1")
    assert json.loads(ledger.requests[0].content)["amount"] == sent


@pytest.mark.parametrize(
    ("amount", "error"),
    [
        pytest.param(1.5, TypeError, id="float"),
        pytest.param(Decimal("1.005"), ValueError, id="three-places"),
        pytest.param(Decimal("-1"), ValueError, id="negative"),
        pytest.param(Decimal("NaN"), ValueError, id="nan"),
        pytest.param("1.5e3", ValueError, id="string-exponent"),
        pytest.param(Decimal("1000000000000"), ValueError, id="thirteen-digits"),
    ],
)
async def test_amounts_the_contract_cannot_carry_are_refused_before_sending(amount, error):
    ledger = ScriptedLedger(answer(201, transaction()))
    async with make_client(ledger) as client:
        with pytest.raises(error):
            await client.debit("alice", amount, key="debit-key-1")
    assert ledger.requests == []


async def test_short_idempotency_key_is_refused_before_sending():
    ledger = ScriptedLedger(answer(201, transaction()))
    async with make_client(ledger) as client:
        with pytest.raises(ValueError, match="Idempotency-Key"):
            await client.debit("alice", 1, key="short")
    assert ledger.requests == []


async def test_username_is_one_path_segment():
    # contract 1.1 forbids "/" (JupyterHub does too); anything else is quoted
    ledger = ScriptedLedger(answer(200, {"username": "a?b c%", "balance": "1.00"}))
    async with make_client(ledger) as client:
        account = await client.balance("a?b c%")
    assert ledger.requests[0].url.raw_path == b"/v1/accounts/a%3Fb%20c%25"
    assert account.username == "a?b c%"


async def test_url_with_a_prefix_keeps_the_prefix():
    ledger = ScriptedLedger(answer(200, {"username": "alice", "balance": "1.00"}))
    client = CreditsClient(
        url="http://hub.test/services/credits", token=TOKEN, transport=httpx.MockTransport(ledger)
    )
    async with client:
        await client.balance("alice")
    assert ledger.requests[0].url.path == "/services/credits/v1/accounts/alice"


async def test_url_and_token_default_to_the_environment(monkeypatch):
    monkeypatch.setenv("GPUHUB_CREDITS_URL", "http://env.test:8123")
    monkeypatch.setenv("GPUHUB_CREDITS_TOKEN", TOKEN)
    ledger = ScriptedLedger(answer(200, {"username": "alice", "balance": "0.00"}))
    async with CreditsClient(transport=httpx.MockTransport(ledger)) as client:
        account = await client.balance("alice")
    assert account.balance == Decimal("0.00")
    assert str(ledger.requests[0].url) == "http://env.test:8123/v1/accounts/alice"
    assert ledger.requests[0].headers["Authorization"] == f"Bearer {TOKEN}"


def test_url_without_scheme_is_refused_with_the_fix():
    with pytest.raises(Exception, match="c.CreditsClient.url must start with http"):
        CreditsClient(url="credits.test:8123", token=TOKEN)


# -- retries ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(answer(503, {"error": "down", "message": "maintenance"}), id="503"),
        pytest.param(httpx.Response(502, text="<html>bad gateway</html>"), id="502-html"),
        pytest.param(answer(500, {"error": "internal_error", "message": "x"}), id="500"),
        pytest.param(httpx.ConnectError("connection refused"), id="connect-error"),
        pytest.param(httpx.ReadTimeout("read timed out"), id="read-timeout"),
        pytest.param(httpx.RemoteProtocolError("server disconnected"), id="disconnect"),
    ],
)
async def test_transient_failures_are_retried_with_the_same_key_and_body(failure, sleeps):
    ledger = ScriptedLedger(failure, failure, answer(200, transaction()))
    async with make_client(ledger) as client:
        entry = await client.debit("alice", "1.50", key="alice/gpu-1/000007", reason="interval")
    assert len(ledger.requests) == 3
    assert {r.headers["Idempotency-Key"] for r in ledger.requests} == {"alice/gpu-1/000007"}
    assert {r.content for r in ledger.requests} == {ledger.requests[0].content}
    assert entry.replayed is True  # the service answered the third try as a replay
    assert len(sleeps) == 2


async def test_gives_up_after_max_attempts_with_credits_unavailable(sleeps):
    ledger = ScriptedLedger(httpx.ConnectError("connection refused"))
    async with make_client(ledger, max_attempts=3) as client:
        with pytest.raises(CreditsUnavailable, match="after 3 attempts") as info:
            await client.debit("alice", "1.00", key="debit-key-1")
    assert len(ledger.requests) == 3
    assert info.value.status is None


async def test_back_off_grows_and_is_capped(monkeypatch, sleeps):
    monkeypatch.setattr("hub_ext.credits.client.random.uniform", lambda low, high: high)
    ledger = ScriptedLedger(answer(503, {"error": "down", "message": "x"}))
    async with make_client(ledger, max_attempts=6, backoff_base=0.5, backoff_max=3.0) as client:
        with pytest.raises(CreditsUnavailable):
            await client.balance("alice")
    assert sleeps == [0.5, 1.0, 2.0, 3.0, 3.0]


async def test_retry_after_is_honoured_up_to_the_cap(sleeps):
    busy = httpx.Response(503, headers={"Retry-After": "2"}, json={"error": "busy", "message": "x"})
    ledger = ScriptedLedger(busy, answer(200, {"username": "alice", "balance": "1.00"}))
    async with make_client(ledger, backoff_max=5.0) as client:
        await client.balance("alice")
    assert sleeps == [2.0]


@pytest.mark.parametrize("status", [400, 401, 402, 404, 409, 422])
async def test_refusals_are_not_retried(status, sleeps):
    ledger = ScriptedLedger(answer(status, {"error": "x", "message": "no"}))
    async with make_client(ledger) as client:
        with pytest.raises(CreditsError):
            await client.debit("alice", "1.00", key="debit-key-1")
    assert len(ledger.requests) == 1
    assert sleeps == []


# -- typed errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        pytest.param(
            402,
            {"error": "insufficient_credits", "message": "no", "balance": "0.50"},
            InsufficientCredits,
            id="402",
        ),
        pytest.param(
            404, {"error": "account_not_found", "message": "no"}, AccountNotFound, id="404-account"
        ),
        pytest.param(
            409, {"error": "idempotency_conflict", "message": "no"}, IdempotencyConflict, id="409"
        ),
        pytest.param(401, {"error": "unauthorized", "message": "no"}, CreditsAuthError, id="401"),
        pytest.param(
            400, {"error": "invalid_json", "message": "no"}, InvalidCreditsRequest, id="400"
        ),
        pytest.param(
            422, {"error": "invalid_request", "message": "no"}, InvalidCreditsRequest, id="422"
        ),
    ],
)
async def test_debit_refusals_raise_typed_errors(status, body, error):
    ledger = ScriptedLedger(answer(status, body))
    async with make_client(ledger) as client:
        with pytest.raises(error) as info:
            await client.debit("alice", "1.00", key="debit-key-1")
    assert info.value.status == status
    assert info.value.code == body["error"]
    assert isinstance(info.value, CreditsError)


async def test_insufficient_credits_carries_the_balance():
    ledger = ScriptedLedger(
        answer(402, {"error": "insufficient_credits", "message": "no", "balance": "0.50"})
    )
    async with make_client(ledger) as client:
        with pytest.raises(InsufficientCredits) as info:
            await client.debit("alice", "1.00", key="debit-key-1")
    assert info.value.balance == Decimal("0.50")


async def test_refund_past_the_debit_raises_refund_exceeds_debit():
    ledger = ScriptedLedger(answer(422, {"error": "refund_exceeds_debit", "message": "no"}))
    async with make_client(ledger) as client:
        with pytest.raises(RefundExceedsDebit):
            await client.refund("alice", "txn_1", "5.00", key="refund-key-1")
    assert json.loads(ledger.requests[0].content) == {"amount": "5.00", "debit_id": "txn_1"}


async def test_grant_with_a_hub_token_raises_auth_error():
    ledger = ScriptedLedger(answer(403, {"error": "forbidden", "message": "admins only"}))
    async with make_client(ledger) as client:
        with pytest.raises(CreditsAuthError) as info:
            await client.grant("alice", "5", key="grant-key-1")
    assert info.value.status == 403


# -- answers the contract does not allow ------------------------------------------------------


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(
            httpx.Response(201, content=b"{not json", headers={"Content-Type": "application/json"}),
            id="malformed-json",
        ),
        pytest.param(httpx.Response(201, text="<html>ok</html>"), id="html"),
        pytest.param(answer(201, ["a", "list"]), id="not-an-object"),
        pytest.param(
            answer(201, {k: v for k, v in transaction().items() if k != "balance"}),
            id="missing-balance",
        ),
        pytest.param(
            answer(201, {k: v for k, v in transaction().items() if k != "transaction_id"}),
            id="missing-id",
        ),
        pytest.param(answer(201, transaction(amount="1.500")), id="three-places"),
        pytest.param(answer(201, transaction(amount=1.5)), id="number-not-string"),
        pytest.param(answer(201, transaction(balance="-1.00")), id="negative-balance"),
        pytest.param(answer(201, transaction(kind="grant")), id="wrong-kind"),
        pytest.param(answer(201, transaction(username="bob")), id="wrong-account"),
        pytest.param(answer(201, transaction(created_at="yesterday")), id="bad-date"),
        pytest.param(answer(201, transaction(created_at="2025-11-21T10:00:00")), id="naive-date"),
        pytest.param(answer(201, transaction(metadata={"n": 1})), id="metadata-not-strings"),
        pytest.param(answer(418, {"error": "teapot", "message": "x"}), id="undocumented-status"),
        pytest.param(answer(402, {"detail": "no"}), id="error-without-code"),
        pytest.param(httpx.Response(404, text="Not Found"), id="proxy-404-page"),
    ],
)
async def test_answers_outside_the_contract_raise_contract_error(response):
    ledger = ScriptedLedger(response)
    async with make_client(ledger) as client:
        with pytest.raises(CreditsContractError):
            await client.debit("alice", "1.50", key="debit-key-1")


async def test_400_on_a_grant_is_outside_the_contract():
    ledger = ScriptedLedger(answer(400, {"error": "invalid_json", "message": "x"}))
    async with make_client(ledger) as client:
        with pytest.raises(CreditsContractError, match="not in the contract"):
            await client.grant("alice", "1", key="grant-key-1")


async def test_balance_with_a_bad_amount_is_a_contract_error():
    ledger = ScriptedLedger(answer(200, {"username": "alice", "balance": "12"}))
    async with make_client(ledger) as client:
        assert (await client.balance("alice")).balance == Decimal("12.00")
    ledger = ScriptedLedger(answer(200, {"username": "alice", "balance": "1,50"}))
    async with make_client(ledger) as client:
        with pytest.raises(CreditsContractError, match="balance"):
            await client.balance("alice")


# -- the ledger listing -----------------------------------------------------------------------


async def test_transactions_sends_limit_and_before_and_returns_next_before():
    page = {"transactions": [transaction(transaction_id="txn_9")], "next_before": "txn_9"}
    ledger = ScriptedLedger(answer(200, page))
    async with make_client(ledger) as client:
        entries, next_before = await client.transactions("alice", limit=1, before="txn_10")
    assert dict(ledger.requests[0].url.params) == {"limit": "1", "before": "txn_10"}
    assert [e.transaction_id for e in entries] == ["txn_9"]
    assert next_before == "txn_9"


async def test_iter_transactions_follows_next_before_to_the_last_page():
    ledger = ScriptedLedger(
        answer(
            200,
            {
                "transactions": [
                    transaction(transaction_id="txn_3"),
                    transaction(transaction_id="txn_2"),
                ],
                "next_before": "txn_2",
            },
        ),
        answer(200, {"transactions": [transaction(transaction_id="txn_1")], "next_before": None}),
    )
    async with make_client(ledger) as client:
        ids = [entry.transaction_id async for entry in client.iter_transactions("alice", 2)]
    assert ids == ["txn_3", "txn_2", "txn_1"]
    assert ledger.requests[1].url.params["before"] == "txn_2"


# -- the token stays secret -------------------------------------------------------------------


class LedgerDown:
    """Refuses every connection, quoting the request's Authorization header (a leaky proxy)."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused: {request.headers['Authorization']}")


class LeakyLedger:
    """Answers 402 with a message that echoes the bearer token."""

    def __call__(self, request: httpx.Request) -> httpx.Response:
        token = request.headers["Authorization"]
        return answer(402, {"error": "insufficient_credits", "message": f"for {token}"})


@pytest.mark.parametrize(
    "ledger",
    [pytest.param(LedgerDown(), id="unreachable"), pytest.param(LeakyLedger(), id="leaky")],
)
async def test_token_never_appears_in_logs_errors_or_repr(ledger, caplog, sleeps):
    caplog.set_level(logging.DEBUG)
    client = make_client(ledger)
    async with client:
        with pytest.raises(CreditsError) as info:
            await client.debit("alice", "1.00", key="debit-key-1")
    assert TOKEN not in str(info.value)
    assert TOKEN not in repr(info.value)
    assert TOKEN not in info.value.message
    assert TOKEN not in repr(client)
    assert caplog.records, "the client should log its attempts"
    assert TOKEN not in caplog.text
    for record in caplog.records:
        assert TOKEN not in record.getMessage()


async def test_url_and_token_from_traitlets_config():
    from traitlets.config import Config

    config = Config()
    config.CreditsClient.url = "http://configured.test:8123/"
    config.CreditsClient.token = TOKEN
    config.CreditsClient.max_attempts = 2
    ledger = ScriptedLedger(answer(200, {"username": "alice", "balance": "1.00"}))
    client = CreditsClient(config=config, transport=httpx.MockTransport(ledger))
    async with client:
        await client.balance("alice")
    assert client.max_attempts == 2
    assert str(ledger.requests[0].url) == "http://configured.test:8123/v1/accounts/alice"


# -- contract 1.1: what the client refuses to send, what it reads ----------------------------


async def test_refund_of_an_unknown_debit_raises_debit_not_found():
    ledger = ScriptedLedger(answer(404, {"error": "debit_not_found", "message": "no"}))
    async with make_client(ledger) as client:
        with pytest.raises(DebitNotFound) as info:
            await client.refund("alice", "txn_nope", "1.00", key="refund-key-1")
    assert (info.value.status, info.value.code) == (404, "debit_not_found")
    assert isinstance(info.value, InvalidCreditsRequest)


async def test_a_refused_page_size_is_a_refusal_not_a_contract_error():
    ledger = ScriptedLedger(answer(400, {"error": "invalid_request", "message": "limit"}))
    async with make_client(ledger) as client:
        with pytest.raises(InvalidCreditsRequest) as info:
            await client.transactions("alice", limit=10)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("call", "match"),
    [
        pytest.param(
            lambda c: c.debit("alice", "0", key="debit-key-1"), "greater than zero", id="zero-debit"
        ),
        pytest.param(
            lambda c: c.refund("alice", "txn_1", Decimal("0.00"), key="refund-key-1"),
            "greater than zero",
            id="zero-refund",
        ),
        pytest.param(
            lambda c: c.grant("alice", 0, key="grant-key-1"), "greater than zero", id="zero-grant"
        ),
        pytest.param(lambda c: c.balance("a/b"), '"/"', id="slash-in-username"),
        pytest.param(
            lambda c: c.balance("tab\tname"),
            "control characters",
            id="control-character-in-username",
        ),
        pytest.param(lambda c: c.balance("x" * 256), "1 to 255", id="long-username"),
        pytest.param(
            lambda c: c.debit("alice", "1", key="debit-key-1", reason="r" * 501),
            "at most 500",
            id="long-reason",
        ),
        pytest.param(
            lambda c: c.debit(
                "alice", "1", key="debit-key-1", metadata={str(i): "v" for i in range(21)}
            ),
            "at most 20 entries",
            id="metadata-21-entries",
        ),
        pytest.param(
            lambda c: c.debit("alice", "1", key="debit-key-1", metadata={"k": "v" * 501}),
            "at most 500",
            id="metadata-long-value",
        ),
        pytest.param(
            lambda c: c.refund("alice", "", "1", key="refund-key-1"),
            "1 to 255",
            id="empty-debit-id",
        ),
    ],
)
async def test_requests_the_contract_refuses_are_never_sent(call, match):
    ledger = ScriptedLedger(answer(500, {}))
    async with make_client(ledger) as client:
        with pytest.raises(ValueError, match=match):
            await call(client)
    assert ledger.requests == []


async def test_amounts_are_sent_as_positive_amounts(sleeps):
    from hub_ext.credits.amounts import POSITIVE_AMOUNT_PATTERN

    ledger = ScriptedLedger(answer(201, transaction(amount="0.05", balance="1.00")))
    async with make_client(ledger) as client:
        for amount in ("0.05", Decimal("0.5"), 1, "12.30"):
            await client.debit("alice", amount, key="debit-key-1")
    sent = [json.loads(r.content)["amount"] for r in ledger.requests]
    assert sent == ["0.05", "0.50", "1.00", "12.30"]
    assert all(POSITIVE_AMOUNT_PATTERN.fullmatch(a) for a in sent)
