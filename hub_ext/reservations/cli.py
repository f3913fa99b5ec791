"""``gpuhub reservations list|create|edit|delete``: the running hub's reservations.

Talks to the hub's REST API (``/hub/api/gpuhub/reservations``, :mod:`.handlers`) on this
machine with the token the hub keeps in its state dir (``gpuhub-cli-token``, mode 0600),
whose role holds the board's read scope and ``custom:gpuhub:reservations:admin``, nothing
more (:mod:`.hubconfig`).  The hub checks everything; a refusal is printed as the hub's
sentence on one line, exit 1.  Times are ISO 8601; one without an offset is read in
``--timezone`` (UTC by default).
"""

from __future__ import annotations

import json
import sys
from urllib.parse import urlencode

from ..common.hub_api import HubRefused as Refused
from ..common.hub_api import HubUnreachable, hub_request
from ..settings import Settings

__all__ = ["add_parser", "hub_request"]

PATH = "/gpuhub/reservations"


def _body(args) -> dict:
    """The fields given on the command line (``--except`` and ``--no-repeat`` included)."""
    body = {
        key: getattr(args, key)
        for key in ("group", "gpus", "mig_profile", "start", "end", "timezone", "rrule", "note")
        if getattr(args, key, None) is not None
    }
    if getattr(args, "no_repeat", False):
        body["rrule"] = None
        body["exdates"] = []
    if args.exdates is not None:
        body["exdates"] = args.exdates
    return body


def _line(r: dict) -> str:
    gpus = (
        f"{r['gpus']} x {r['mig_profile']}"
        if r["mig_profile"]
        else f"{r['gpus']} GPU{'s' if r['gpus'] != 1 else ''}"
    )
    nxt = f"{r['next']['start']} to {r['next']['end']}" if r["next"] else "none left"
    return (
        f"{r['id']:>4}  {r['group']:<16} {gpus:<12} {r['rrule'] or 'once':<28} {nxt}  {r['note']}"
    )


def run(args) -> int:
    """One subcommand against the running hub; exit 1 with one line when it fails."""
    settings = Settings.from_env()
    try:
        if args.action == "list":
            query = urlencode({k: v for k, v in (("from", args.since), ("to", args.until)) if v})
            answer = hub_request(settings, "GET", PATH + ("?" + query if query else ""))
            if args.json:
                print(json.dumps(answer, indent=2))
                return 0
            print(f"{'ID':>4}  {'GROUP':<16} {'GPUS':<12} {'REPEATS':<28} NEXT OCCURRENCE")
            for r in answer["reservations"]:
                print(_line(r))
            for o in answer.get("occurrences", []):
                print(f"  {o['start']} to {o['end']}  #{o['reservation']} {o['group']} {o['gpus']}")
        elif args.action == "create":
            print(_line(hub_request(settings, "POST", PATH, _body(args))))
        elif args.action == "edit":
            body = _body(args)
            if not body:
                print(
                    "gpuhub reservations edit: nothing to change; give an option such "
                    "as --gpus or --end",
                    file=sys.stderr,
                )
                return 2
            print(_line(hub_request(settings, "PATCH", f"{PATH}/{args.id}", body)))
        else:
            hub_request(settings, "DELETE", f"{PATH}/{args.id}")
            print(f"deleted reservation {args.id}")
    except (HubUnreachable, Refused, ValueError) as e:
        print(f"gpuhub reservations {args.action}: {e}", file=sys.stderr)
        return 1
    return 0


def _rule_options(p, required: bool) -> None:
    p.add_argument("--group", required=required, help="the JupyterHub group (e.g. ml101)")
    p.add_argument(
        "--gpus",
        type=int,
        required=required,
        help="how many GPUs (or MIG slices with --mig-profile)",
    )
    p.add_argument(
        "--start", required=required, help="first occurrence's start, ISO 8601 (2026-12-01T14:00)"
    )
    p.add_argument("--end", required=required, help="first occurrence's end, ISO 8601")
    p.add_argument("--mig-profile", dest="mig_profile", help="reserve MIG slices of it")
    p.add_argument(
        "--timezone",
        help="IANA zone for times without an offset and for the "
        "recurrence's wall-clock time (default UTC)",
    )
    p.add_argument("--rrule", help="RFC 5545 rule, e.g. 'FREQ=WEEKLY;BYDAY=TU;COUNT=12'")
    p.add_argument(
        "--except",
        dest="exdates",
        action="append",
        metavar="START",
        help="an occurrence that does not take place (its start); repeatable",
    )
    p.add_argument("--note", help="a few words for the list (e.g. 'ML101 lab')")


def add_parser(sub) -> None:
    """Add ``reservations`` and its subcommands to the ``gpuhub`` parser's ``sub``."""
    p = sub.add_parser(
        "reservations",
        help="GPUs reserved for a group: list, create, edit, delete (on the running hub)",
    )
    actions = p.add_subparsers(dest="action", required=True)
    a = actions.add_parser("list", help="every reservation and its next occurrence")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.add_argument("--from", dest="since", help="also list the occurrences from then")
    a.add_argument("--to", dest="until", help="... until then (ISO 8601)")
    a = actions.add_parser("create", help="reserve GPUs for a group")
    _rule_options(a, required=True)
    a = actions.add_parser("edit", help="change a reservation (only the options given)")
    a.add_argument("id", type=int)
    _rule_options(a, required=False)
    a.add_argument(
        "--no-repeat",
        action="store_true",
        help="make it happen once (drop its rule and exceptions)",
    )
    a = actions.add_parser("delete", help="delete a reservation")
    a.add_argument("id", type=int)
    p.set_defaults(func=run)
