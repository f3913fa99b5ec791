"""``gpuhub credits``: grant credits, read a balance, print a user's ledger.

::

    gpuhub credits grant alice 100 --reason "course GPU budget"
    gpuhub credits balance alice
    gpuhub credits history alice --limit 20

It talks to the Credits API through :class:`~hub_ext.credits.client.CreditsClient`.  The URL
comes from ``--url`` or ``GPUHUB_CREDITS_URL``; the token from ``--token`` or the
environment: ``GPUHUB_CREDITS_ADMIN_TOKEN`` for grants (then ``GPUHUB_CREDITS_TOKEN``),
``GPUHUB_CREDITS_TOKEN`` for reads (then the admin token).  Prefer the environment: a
``--token`` shows in ``ps``.

Without ``GPUHUB_CREDITS_URL`` it talks to the reference service the hub runs itself
(``hub_ext.credits.hubconfig``), found the way the hub finds it: on 127.0.0.1 at
``GPUHUB_CREDITS_PORT`` (8123), with the token files in ``GPUHUB_STATE_DIR`` (the
repository's ``var``, as the hub's), so on the hub's machine ``gpuhub credits grant alice
100`` needs nothing else.  Every variable is read as :mod:`hub_ext.settings` declares it.

Exit status: 0 done, 1 the API refused or could not be reached, 2 a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from decimal import Decimal, InvalidOperation
from pathlib import Path

from ..settings import SettingError, value
from .amounts import format_amount
from .client import CreditsClient, Transaction
from .errors import CreditsError

__all__ = ["build_parser", "main"]

_SIGN = {"debit": "-", "refund": "+", "grant": "+"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuhub credits", description="Grant and inspect GPU credits."
    )
    parser.add_argument("--url", help="Credits API URL (default: GPUHUB_CREDITS_URL)")
    parser.add_argument(
        "--token", help="API token (default: from the environment; flags show in ps)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    grant = commands.add_parser("grant", help="add credits to a user, creating the account")
    grant.add_argument("username")
    grant.add_argument("amount", help='credits, at most two decimal places, e.g. 100 or "12.50"')
    grant.add_argument("--reason", help="why, kept in the ledger")
    grant.add_argument(
        "--key",
        help="Idempotency-Key; repeat a grant safely by passing the same key (default: new)",
    )

    balance = commands.add_parser("balance", help="print a user's balance")
    balance.add_argument("username")

    history = commands.add_parser("history", help="print a user's ledger, newest first")
    history.add_argument("username")
    history.add_argument("--limit", type=int, default=20, help="entries to print (default 20)")
    history.add_argument("--all", action="store_true", help="print the whole ledger")
    return parser


def _token(args: argparse.Namespace) -> str | None:
    if args.token:
        return args.token
    names = ["GPUHUB_CREDITS_TOKEN", "GPUHUB_CREDITS_ADMIN_TOKEN"]
    if args.command == "grant":
        names.reverse()
    return next((value(n) for n in names if value(n)), None)


def _managed_service(args: argparse.Namespace) -> tuple[str, str | None] | None:
    """(URL, token) of the reference service the hub runs, when its token files are in
    the hub's state directory; None otherwise."""
    from .hubconfig import ADMIN_TOKEN_FILE, HUB_TOKEN_FILE, SERVICE_NAME

    state = Path(value("GPUHUB_STATE_DIR")).resolve()
    files = [state / HUB_TOKEN_FILE, state / ADMIN_TOKEN_FILE]
    if args.command == "grant":
        files.reverse()
    found = [f for f in files if f.is_file()]
    if not found:
        return None
    port = value("GPUHUB_CREDITS_PORT")
    token = args.token or found[0].read_text().strip() or None
    return f"http://127.0.0.1:{port}/services/{SERVICE_NAME}/", token


def _row(entry: Transaction) -> str:
    when = entry.created_at.strftime("%Y-%m-%d %H:%M:%S")
    amount = f"{_SIGN[entry.kind]}{entry.amount}"
    note = entry.reason or ""
    if entry.debit_id:
        note = f"{note} (of {entry.debit_id})".strip()
    return f"{when}  {entry.kind:<6}  {amount:>12}  {entry.balance:>12}  {note}".rstrip()


async def _run(args: argparse.Namespace, client: CreditsClient) -> int:
    out = sys.stdout
    if args.command == "grant":
        key = args.key or f"cli-grant-{uuid.uuid4().hex}"
        entry = await client.grant(args.username, args.amount, key=key, reason=args.reason)
        verb = "Already granted (same key)" if entry.replayed else "Granted"
        print(
            f"{verb} {entry.amount} credits to {entry.username}. "
            f"Balance: {entry.balance} ({entry.transaction_id})",
            file=out,
        )
    elif args.command == "balance":
        account = await client.balance(args.username)
        print(f"{account.username}: {account.balance} credits", file=out)
    else:
        wanted = None if args.all else args.limit
        entries: list[Transaction] = []
        async for entry in client.iter_transactions(
            args.username, page_size=min(wanted or 500, 500)
        ):
            entries.append(entry)
            if wanted is not None and len(entries) >= wanted:
                break
        if not entries:
            print(f"{args.username}: no transactions", file=out)
            return 0
        print(f"{'WHEN (UTC)':<19}  {'KIND':<6}  {'AMOUNT':>12}  {'BALANCE':>12}  REASON", file=out)
        for entry in entries:
            print(_row(entry), file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``gpuhub credits ARGS``; ``argv`` may start with ``credits`` or not.

    Returns the exit status (0 done, 1 refused or unreachable, 2 usage).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["credits"]:
        argv = argv[1:]
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        url = args.url or value("GPUHUB_CREDITS_URL")
        token = _token(args)
        managed = None if url else _managed_service(args)
    except SettingError as e:
        print(f"credits: {e}", file=sys.stderr)
        return 2
    if not url:
        if managed is None:
            print(
                "credits: no API URL; set GPUHUB_CREDITS_URL or pass --url (or run this "
                "where the hub's GPUHUB_STATE_DIR holds its credits token files)",
                file=sys.stderr,
            )
            return 2
        url, token = managed[0], token or managed[1]
    if not token:
        needed = "GPUHUB_CREDITS_ADMIN_TOKEN" if args.command == "grant" else "GPUHUB_CREDITS_TOKEN"
        print(f"credits: no API token; set {needed} or pass --token", file=sys.stderr)
        return 2
    if args.command == "grant":
        try:
            args.amount = format_amount(Decimal(args.amount))
        except (InvalidOperation, ValueError, TypeError):
            print(
                f"credits: {args.amount!r} is not an amount of credits "
                "(a positive number with at most two decimal places)",
                file=sys.stderr,
            )
            return 2
    if args.command == "history" and args.limit < 1:
        print("credits: --limit must be at least 1", file=sys.stderr)
        return 2

    async def run() -> int:
        async with CreditsClient(url=url, token=token) as client:
            return await _run(args, client)

    try:
        return asyncio.run(run())
    except CreditsError as exc:
        print(f"credits: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
