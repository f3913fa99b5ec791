"""The reference service, running as a real process on SQLite and on PostgreSQL.

Raw HTTP (httpx) where the status code is the point, the real client where the typed
result is.  Every test names its own account, since the services are shared.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

import httpx
import pytest
import sqlalchemy as sa

from hub_ext.credits import (
    AccountNotFound,
    CreditsAuthError,
    IdempotencyConflict,
    InsufficientCredits,
    InvalidCreditsRequest,
    RefundExceedsDebit,
)
from tests.fixtures.credits import running_credits_service


def key() -> str:
    return f"key-{uuid.uuid4().hex}"


class API:
    """Raw calls to one running service, with its tokens."""

    def __init__(self, service):
        self.service = service
        self.http = httpx.Client(base_url=service.url, timeout=30)

    def headers(self, token: str | None, idempotency_key: str | None = None) -> dict:
        headers = {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return headers

    def post(self, username, operation, body, *, idempotency_key=None, token="hub", raw=None):
        token = {"hub": self.service.hub_token, "admin": self.service.admin_token}.get(token, token)
        return self.http.post(
            f"/v1/accounts/{username}/{operation}",
            headers=self.headers(token, idempotency_key or key()),
            **({"content": raw} if raw is not None else {"json": body}),
        )

    def get(self, path, *, token="hub", params=None):
        token = {"hub": self.service.hub_token, "admin": self.service.admin_token}.get(token, token)
        return self.http.get(path, headers=self.headers(token), params=params)

    def grant(self, username, amount="10.00"):
        response = self.post(username, "grants", {"amount": amount}, token="admin")
        assert response.status_code == 201, response.text
        return response.json()

    def balance(self, username) -> str:
        response = self.get(f"/v1/accounts/{username}")
        assert response.status_code == 200, response.text
        return response.json()["balance"]


@pytest.fixture
def api(any_credits_service):
    client = API(any_credits_service)
    yield client
    client.http.close()


# -- grants and balances ----------------------------------------------------------------------


def test_grant_creates_the_account_and_sets_its_balance(api, credits_username):
    entry = api.grant(credits_username, "12.5")
    assert entry["kind"] == "grant"
    assert entry["amount"] == "12.50"
    assert entry["balance"] == "12.50"
    assert entry["username"] == credits_username
    account = api.get(f"/v1/accounts/{credits_username}").json()
    assert account["balance"] == "12.50"
    assert account["username"] == credits_username
    api.grant(credits_username, "0.5")
    assert api.balance(credits_username) == "13.00"


def test_unknown_account_is_404(api, credits_username):
    response = api.get(f"/v1/accounts/{credits_username}")
    assert response.status_code == 404
    assert response.json()["error"] == "account_not_found"
    debit = api.post(credits_username, "debits", {"amount": "1.00"})
    assert debit.status_code == 404


def test_grant_with_the_hub_token_is_403(api, credits_username):
    response = api.post(credits_username, "grants", {"amount": "5.00"}, token="hub")
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert api.get(f"/v1/accounts/{credits_username}").status_code == 404


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="no-token"),
        pytest.param("Bearer wrong-token", id="bad-token"),
        pytest.param("Bearer", id="empty-bearer"),
        pytest.param("token {hub}", id="hub-token-other-scheme"),
    ],
)
@pytest.mark.parametrize(
    ("method", "operation"),
    [
        ("GET", ""),
        ("GET", "/transactions"),
        ("POST", "/debits"),
        ("POST", "/refunds"),
        ("POST", "/grants"),
    ],
)
def test_requests_without_a_valid_token_are_401(
    api, credits_username, authorization, method, operation
):
    api.grant(credits_username)
    headers = {"Idempotency-Key": key()}
    if authorization is not None:
        headers["Authorization"] = authorization.format(hub=api.service.hub_token)
    response = api.http.request(
        method,
        f"/v1/accounts/{credits_username}{operation}",
        headers=headers,
        json={"amount": "1.00", "debit_id": "txn_x"} if method == "POST" else None,
    )
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert api.balance(credits_username) == "10.00"


def test_admin_token_may_also_read_and_debit(api, credits_username):
    api.grant(credits_username)
    assert api.get(f"/v1/accounts/{credits_username}", token="admin").status_code == 200
    response = api.post(credits_username, "debits", {"amount": "1.00"}, token="admin")
    assert response.status_code == 201


# -- debits -----------------------------------------------------------------------------------


def test_debit_takes_credits_and_reports_the_balance_after(api, credits_username):
    api.grant(credits_username, "10.00")
    response = api.post(
        credits_username,
        "debits",
        {"amount": "2.25", "reason": "spawn", "metadata": {"server": "gpu-1"}},
    )
    assert response.status_code == 201
    entry = response.json()
    assert (entry["kind"], entry["amount"], entry["balance"]) == ("debit", "2.25", "7.75")
    assert entry["reason"] == "spawn"
    assert entry["metadata"] == {"server": "gpu-1"}
    assert api.balance(credits_username) == "7.75"


def test_replay_with_the_same_key_and_body_returns_the_original_with_200(api, credits_username):
    api.grant(credits_username, "10.00")
    body = {"amount": "3.00", "reason": "interval 7"}
    first = api.post(credits_username, "debits", body, idempotency_key="alice/gpu/0007")
    again = api.post(credits_username, "debits", body, idempotency_key="alice/gpu/0007")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert api.balance(credits_username) == "7.00"


def test_amount_equal_by_value_counts_as_the_same_body(api, credits_username):
    api.grant(credits_username, "10.00")
    first = api.post(credits_username, "debits", {"amount": "1.5"}, idempotency_key="same-key-1")
    again = api.post(credits_username, "debits", {"amount": "1.50"}, idempotency_key="same-key-1")
    assert (first.status_code, again.status_code) == (201, 200)


def test_same_key_with_a_different_body_is_409_and_takes_nothing(api, credits_username):
    api.grant(credits_username, "10.00")
    assert (
        api.post(
            credits_username, "debits", {"amount": "1.00"}, idempotency_key="conflict-key"
        ).status_code
        == 201
    )
    response = api.post(
        credits_username, "debits", {"amount": "2.00"}, idempotency_key="conflict-key"
    )
    assert response.status_code == 409
    assert response.json()["error"] == "idempotency_conflict"
    assert api.balance(credits_username) == "9.00"


def test_keys_are_scoped_to_account_and_kind(api, credits_username):
    other = credits_username + "-other"
    api.grant(credits_username, "10.00")
    api.grant(other, "10.00")
    shared = "shared-key-0001"
    assert (
        api.post(credits_username, "debits", {"amount": "1.00"}, idempotency_key=shared).status_code
        == 201
    )
    assert api.post(other, "debits", {"amount": "2.00"}, idempotency_key=shared).status_code == 201
    assert (
        api.post(
            credits_username, "grants", {"amount": "5.00"}, token="admin", idempotency_key=shared
        ).status_code
        == 201
    )
    assert api.balance(credits_username) == "14.00"
    assert api.balance(other) == "8.00"


def test_debit_beyond_the_balance_is_402_with_the_balance(api, credits_username):
    api.grant(credits_username, "2.00")
    response = api.post(credits_username, "debits", {"amount": "2.01"})
    assert response.status_code == 402
    assert response.json()["error"] == "insufficient_credits"
    assert response.json()["balance"] == "2.00"
    assert api.balance(credits_username) == "2.00"
    exact = api.post(credits_username, "debits", {"amount": "2.00"})
    assert exact.status_code == 201
    assert exact.json()["balance"] == "0.00"


def test_a_refused_debit_stores_nothing_so_its_key_works_after_a_grant(api, credits_username):
    api.grant(credits_username, "1.00")
    assert (
        api.post(
            credits_username, "debits", {"amount": "5.00"}, idempotency_key="retry-after-topup"
        ).status_code
        == 402
    )
    api.grant(credits_username, "10.00")
    assert (
        api.post(
            credits_username, "debits", {"amount": "5.00"}, idempotency_key="retry-after-topup"
        ).status_code
        == 201
    )
    assert api.balance(credits_username) == "6.00"


@pytest.mark.parametrize(
    "amount",
    [
        pytest.param("1.005", id="three-places"),
        pytest.param("-1.00", id="negative"),
        pytest.param("1e3", id="exponent"),
        pytest.param("0", id="zero"),
        pytest.param("0.00", id="zero-two-places"),
        pytest.param(1.5, id="json-number"),
        pytest.param("", id="empty"),
        pytest.param("1000000000000", id="thirteen-digits"),
        pytest.param(" 1.00", id="space"),
        pytest.param("01.50", id="leading-zero"),
        pytest.param("00.50", id="leading-zeros-below-one"),
        pytest.param("1.00\n", id="trailing-newline"),
    ],
)
def test_amounts_outside_the_contract_are_422(api, credits_username, amount):
    api.grant(credits_username, "10.00")
    response = api.post(credits_username, "debits", {"amount": amount})
    assert response.status_code == 422, response.text
    assert api.balance(credits_username) == "10.00"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({}, id="no-amount"),
        pytest.param({"amount": "1.00", "debit_id": "txn_1"}, id="unknown-field"),
        pytest.param({"amount": "1.00", "reason": "x" * 501}, id="long-reason"),
        pytest.param({"amount": "1.00", "metadata": {"n": 1}}, id="metadata-not-strings"),
        pytest.param({"amount": "1.00", "metadata": ["x"]}, id="metadata-not-object"),
        pytest.param(["1.00"], id="not-an-object"),
        pytest.param({"amount": "1.00", "reason": None}, id="reason-null"),
        pytest.param({"amount": "1.00", "metadata": None}, id="metadata-null"),
        pytest.param(
            {"amount": "1.00", "metadata": {str(i): "v" for i in range(21)}},
            id="metadata-21-entries",
        ),
        pytest.param({"amount": "1.00", "metadata": {"k": "v" * 501}}, id="metadata-long-value"),
    ],
)
def test_invalid_debit_bodies_are_422(api, credits_username, body):
    api.grant(credits_username, "10.00")
    assert api.post(credits_username, "debits", body).status_code == 422


def test_unreadable_writes_are_400_on_debits_and_422_on_grants(api, credits_username):
    api.grant(credits_username, "10.00")
    assert api.post(credits_username, "debits", None, raw=b"{nope").status_code == 400
    deep = api.post(credits_username, "debits", None, raw=b"[" * 10000)  # RecursionError
    assert (deep.status_code, deep.json()["error"]) == (400, "invalid_json"), deep.text
    no_key = api.http.post(
        f"/v1/accounts/{credits_username}/debits",
        headers=api.headers(api.service.hub_token),
        json={"amount": "1.00"},
    )
    assert no_key.status_code == 400
    assert no_key.json()["error"] == "invalid_idempotency_key"
    short_key = api.post(credits_username, "debits", {"amount": "1.00"}, idempotency_key="short")
    assert short_key.status_code == 400
    grant_no_key = api.http.post(
        f"/v1/accounts/{credits_username}/grants",
        headers=api.headers(api.service.admin_token),
        json={"amount": "1.00"},
    )
    assert grant_no_key.status_code == 422
    assert api.balance(credits_username) == "10.00"


# -- refunds ----------------------------------------------------------------------------------


def test_partial_refunds_up_to_the_debit_then_422(api, credits_username):
    api.grant(credits_username, "10.00")
    debit = api.post(credits_username, "debits", {"amount": "5.00"}).json()
    first = api.post(
        credits_username, "refunds", {"amount": "3.00", "debit_id": debit["transaction_id"]}
    )
    assert first.status_code == 201
    assert (first.json()["kind"], first.json()["balance"]) == ("refund", "8.00")
    assert first.json()["debit_id"] == debit["transaction_id"]
    too_much = api.post(
        credits_username, "refunds", {"amount": "2.01", "debit_id": debit["transaction_id"]}
    )
    assert too_much.status_code == 422
    assert too_much.json()["error"] == "refund_exceeds_debit"
    rest = api.post(
        credits_username, "refunds", {"amount": "2.00", "debit_id": debit["transaction_id"]}
    )
    assert rest.status_code == 201
    assert api.balance(credits_username) == "10.00"
    assert (
        api.post(
            credits_username, "refunds", {"amount": "0.01", "debit_id": debit["transaction_id"]}
        ).status_code
        == 422
    )


def test_refund_replay_returns_the_original(api, credits_username):
    api.grant(credits_username, "10.00")
    debit = api.post(credits_username, "debits", {"amount": "4.00"}).json()
    body = {"amount": "4.00", "debit_id": debit["transaction_id"], "reason": "spawn failed"}
    first = api.post(credits_username, "refunds", body, idempotency_key="refund-spawn-1")
    again = api.post(credits_username, "refunds", body, idempotency_key="refund-spawn-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["transaction_id"] == first.json()["transaction_id"]
    assert api.balance(credits_username) == "10.00"


@pytest.mark.parametrize("target", ["missing", "grant", "other-account"])
def test_refund_of_something_that_is_not_this_accounts_debit_is_404(api, credits_username, target):
    grant = api.grant(credits_username, "10.00")
    other = credits_username + "-x"
    api.grant(other, "10.00")
    other_debit = api.post(other, "debits", {"amount": "1.00"}).json()
    debit_id = {
        "missing": "txn_nope",
        "grant": grant["transaction_id"],
        "other-account": other_debit["transaction_id"],
    }[target]
    response = api.post(credits_username, "refunds", {"amount": "1.00", "debit_id": debit_id})
    assert response.status_code == 404  # contract 1.1
    assert response.json()["error"] == "debit_not_found"
    assert api.balance(credits_username) == "10.00"


#: 23 characters, a NUL and two lone surrogates among them: a JSON string like any other
#: (``"\\u0000"``, ``"\\ud800"``), which PostgreSQL's text and UTF-8 cannot hold as they are
ODD_REASON = "GPU time\x00 \ud800 and \udfff: 2.5h"


def test_nul_characters_never_reach_the_database(api, credits_username):
    """PostgreSQL text cannot hold NUL; the service answers instead of failing with 500."""
    api.grant(credits_username, "10.00")
    refund = api.post(credits_username, "refunds", {"amount": "1.00", "debit_id": "txn\x00"})
    assert refund.status_code == 404  # names no debit
    listing = api.get(f"/v1/accounts/{credits_username}/transactions", params={"before": "txn\x00"})
    assert listing.status_code == 404
    meta = api.post(credits_username, "debits", {"amount": "1.00", "metadata": {"k\x00": "v\x00"}})
    assert meta.status_code == 201
    assert meta.json()["metadata"] == {"k\x00": "v\x00"}
    assert api.balance(credits_username) == "9.00"


def test_any_json_string_is_a_reason_and_is_kept_exactly(api, credits_username):
    """The contract's reason is ``{type: string, maxLength: 500}``: a NUL and lone surrogates
    are valid, so the debit is taken and the ledger gives the reason back as it came; the
    database's own column holds a readable copy."""
    assert len(ODD_REASON) == 23
    api.grant(credits_username, "10.00")
    body = json.dumps({"amount": "1.00", "reason": ODD_REASON}).encode()  # \u escapes
    assert b"\\u0000" in body and b"\\ud800" in body
    idempotency_key = key()
    debit = api.post(credits_username, "debits", None, raw=body, idempotency_key=idempotency_key)
    assert debit.status_code == 201, debit.text
    assert debit.json()["reason"] == ODD_REASON
    replay = api.post(credits_username, "debits", None, raw=body, idempotency_key=idempotency_key)
    assert (replay.status_code, replay.json()) == (200, debit.json())
    refund = {"amount": "0.50", "debit_id": debit.json()["transaction_id"], "reason": ODD_REASON}
    refunded = api.post(credits_username, "refunds", None, raw=json.dumps(refund).encode())
    assert refunded.status_code == 201, refunded.text
    listing = api.get(f"/v1/accounts/{credits_username}/transactions").json()["transactions"]
    assert [e.get("reason") for e in listing] == [ODD_REASON, ODD_REASON, None]
    assert api.balance(credits_username) == "9.50"
    engine = sa.create_engine(api.service.db_url)
    try:
        with engine.connect() as conn:
            stored = conn.scalar(
                sa.text("SELECT reason FROM transactions WHERE transaction_id = :t"),
                {"t": debit.json()["transaction_id"]},
            )
    finally:
        engine.dispose()
    assert stored == "GPU time\ufffd \ufffd and \ufffd: 2.5h"


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        pytest.param("x" * 501, "reason is 501 characters long; at most 500", id="long"),
        pytest.param(None, "reason must be a string", id="null"),
        pytest.param(5, "reason must be a string", id="number"),
    ],
)
def test_a_refused_reason_is_told_by_its_rule(api, credits_username, reason, words):
    api.grant(credits_username, "10.00")
    response = api.post(credits_username, "debits", {"amount": "1.00", "reason": reason})
    assert response.status_code == 422
    assert words in response.json()["message"]
    assert api.balance(credits_username) == "10.00"


# -- the ledger listing -----------------------------------------------------------------------


def test_transactions_are_listed_newest_first_in_pages(api, credits_username):
    api.grant(credits_username, "100.00")
    ids = [api.grant(credits_username, "1.00")["transaction_id"]]
    for n in range(1, 8):
        entry = api.post(credits_username, "debits", {"amount": f"{n}.00"}).json()
        ids.append(entry["transaction_id"])
    everything = api.get(f"/v1/accounts/{credits_username}/transactions").json()
    assert len(everything["transactions"]) == 9
    assert everything["next_before"] is None
    newest_first = [e["transaction_id"] for e in everything["transactions"]]
    assert newest_first[:8] == list(reversed(ids))

    seen, before = [], None
    while True:
        params = {"limit": 4} if before is None else {"limit": 4, "before": before}
        page = api.get(f"/v1/accounts/{credits_username}/transactions", params=params).json()
        assert len(page["transactions"]) <= 4
        seen += [e["transaction_id"] for e in page["transactions"]]
        before = page["next_before"]
        if before is None:
            break
    assert seen == newest_first
    balances = [Decimal(e["balance"]) for e in everything["transactions"]]
    assert balances[0] == Decimal(api.balance(credits_username))


def test_a_full_last_page_has_no_next_before(api, credits_username):
    api.grant(credits_username, "1.00")
    api.grant(credits_username, "1.00")
    page = api.get(f"/v1/accounts/{credits_username}/transactions", params={"limit": 2}).json()
    assert len(page["transactions"]) == 2
    assert page["next_before"] is None


def test_unknown_before_is_404(api, credits_username):
    api.grant(credits_username)
    response = api.get(
        f"/v1/accounts/{credits_username}/transactions", params={"before": "txn_unknown"}
    )
    assert response.status_code == 404
    assert response.json()["error"] == "transaction_not_found"


@pytest.mark.parametrize("limit", ["0", "501", "abc", "-1"])
def test_limit_outside_1_to_500_is_refused(api, credits_username, limit):
    api.grant(credits_username)
    response = api.get(f"/v1/accounts/{credits_username}/transactions", params={"limit": limit})
    assert response.status_code == 400


# -- through the client -----------------------------------------------------------------------


async def test_client_round_trip_against_the_real_service(any_credits_service, credits_username):
    async with any_credits_service.client(admin=True) as admin, any_credits_service.client() as hub:
        with pytest.raises(AccountNotFound):
            await hub.balance(credits_username)
        with pytest.raises(CreditsAuthError):
            await hub.grant(credits_username, 5, key=key())
        await admin.grant(credits_username, Decimal("5"), key=key())
        debit = await hub.debit(credits_username, Decimal("1.25"), key="server-a/interval-1")
        replay = await hub.debit(credits_username, Decimal("1.25"), key="server-a/interval-1")
        assert (debit.replayed, replay.replayed) == (False, True)
        assert replay.transaction_id == debit.transaction_id
        with pytest.raises(IdempotencyConflict):
            await hub.debit(credits_username, Decimal("2"), key="server-a/interval-1")
        with pytest.raises(InsufficientCredits) as info:
            await hub.debit(credits_username, Decimal("100"), key=key())
        assert info.value.balance == Decimal("3.75")
        refund = await hub.refund(credits_username, debit.transaction_id, "1.00", key=key())
        assert refund.balance == Decimal("4.75")
        with pytest.raises(RefundExceedsDebit):
            await hub.refund(credits_username, debit.transaction_id, "0.26", key=key())
        with pytest.raises(InvalidCreditsRequest):
            await hub.transactions(credits_username, before="txn_nope")
        entries = [e async for e in hub.iter_transactions(credits_username, page_size=2)]
        assert [e.kind for e in entries] == ["refund", "debit", "grant"]
        assert (await hub.balance(credits_username)).balance == Decimal("4.75")


async def test_the_client_sends_any_reason_the_contract_allows(
    any_credits_service, credits_username
):
    """A reason with a NUL and lone surrogates: the client sends it (httpx's own JSON is
    UTF-8, which cannot carry a lone surrogate) and reads it back from the ledger."""
    async with any_credits_service.client(admin=True) as admin, any_credits_service.client() as hub:
        await admin.grant(credits_username, Decimal("5"), key=key(), reason=ODD_REASON)
        debit = await hub.debit(credits_username, Decimal("1"), key=key(), reason=ODD_REASON)
        assert debit.reason == ODD_REASON
        page, _ = await hub.transactions(credits_username)
        assert [e.reason for e in page] == [ODD_REASON, ODD_REASON]


# -- the database -----------------------------------------------------------------------------


def test_balance_always_equals_the_sum_of_the_ledger(api, credits_username):
    api.grant(credits_username, "20.00")
    debit = api.post(credits_username, "debits", {"amount": "7.30"}).json()
    api.post(credits_username, "debits", {"amount": "50.00"})  # 402, stores nothing
    api.post(credits_username, "refunds", {"amount": "2.10", "debit_id": debit["transaction_id"]})
    entries = api.get(f"/v1/accounts/{credits_username}/transactions").json()["transactions"]
    sign = {"grant": 1, "refund": 1, "debit": -1}
    total = sum(sign[e["kind"]] * Decimal(e["amount"]) for e in entries)
    assert total == Decimal(api.balance(credits_username)) == Decimal("14.80")


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE transactions SET amount_cents = 1",
        "DELETE FROM transactions",
    ],
)
def test_the_ledger_table_is_append_only(api, credits_username, statement):
    api.grant(credits_username, "10.00")
    engine = sa.create_engine(api.service.db_url)
    try:
        with pytest.raises(sa.exc.DatabaseError, match="append-only"), engine.begin() as conn:
            conn.execute(sa.text(statement))
    finally:
        engine.dispose()
    assert api.balance(credits_username) == "10.00"


def test_service_log_never_contains_a_token(api, credits_username):
    api.grant(credits_username)
    api.post(credits_username, "debits", {"amount": "1.00"})
    api.get(f"/v1/accounts/{credits_username}", token="wrong")
    logs = api.service.logs()
    assert credits_username in logs  # the log says who
    assert api.service.hub_token not in logs
    assert api.service.admin_token not in logs


# -- deployment -------------------------------------------------------------------------------


async def test_behind_a_jupyterhub_service_prefix(tmp_path, credits_username):
    with running_credits_service(
        f"sqlite:///{tmp_path / 'credits.sqlite'}",
        tmp_path,
        extra_args=("--base-url", "/services/credits/"),
    ) as service:
        assert service.url.endswith("/services/credits")
        async with service.client(admin=True) as admin:
            entry = await admin.grant(credits_username, "3", key=key())
            assert (await admin.balance(credits_username)).balance == Decimal("3.00")
        assert entry.kind == "grant"
        root = httpx.get(
            service.url.removesuffix("/services/credits") + f"/v1/accounts/{credits_username}",
            headers={"Authorization": f"Bearer {service.hub_token}"},
        )
        assert root.status_code == 404


def test_unknown_paths_are_404_in_the_error_shape(credits_service):
    response = httpx.get(credits_service.url + "/v2/nothing")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


@pytest.mark.parametrize("username", ["a%2Fb", "tab%09name", "del%7F", "nl%0A"])
def test_usernames_outside_the_contracts_rule_name_no_account(api, username):
    """1.1: a username has no "/" and no control characters: 404 on reads and debits,
    422 on a grant, which would otherwise make the account."""
    grant = api.http.post(
        f"/v1/accounts/{username}/grants",
        headers={**api.headers(api.service.admin_token), "Idempotency-Key": "grant-bad-name"},
        json={"amount": "1.00"},
    )
    assert grant.status_code == 422, grant.text
    assert grant.json()["error"] == "invalid_username"
    assert api.get(f"/v1/accounts/{username}").status_code == 404


def test_a_refund_needs_a_debit_id_of_1_to_255_characters(api, credits_username):
    api.grant(credits_username, "10.00")
    for debit_id in ("", "t" * 256):
        response = api.post(credits_username, "refunds", {"amount": "1.00", "debit_id": debit_id})
        assert response.status_code == 422, response.text
    assert api.balance(credits_username) == "10.00"
