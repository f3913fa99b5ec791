"""``gpuhub``: the command line for operators.

    gpuhub gpus [--json]            devices, owners, utilization, health (like nvidia-smi)
    gpuhub usage --since DATE [--by user|group] [--csv] [--jobs]   GPU-hours, credits,
                                    servers; on Slurm beside Slurm's accounting
                                    (hub_ext.ops.usage, hub_ext.slurm.accounting)
    gpuhub credits grant|balance|history ...   the credit ledger (hub_ext.credits.cli)
    gpuhub reservations list|create|edit|delete ...   GPUs reserved for a group
                                    (hub_ext.reservations.cli)
    gpuhub init [--env-file .env] [--force]    a deployment's .env with fresh secrets
    gpuhub upgrade                  migrate the hub database and the credits ledger
    gpuhub config show|check [--env-file .env] [--reach]   the effective settings and
                                    their sources; whether the hub would start with them
                                    (hub_ext.config_cli)

``init`` and ``upgrade`` are in :mod:`hub_ext.ops.deploy`; docs/tutorial/first-hub.md uses them.

``gpuhub gpus`` asks the running hub for its GPU board (``/hub/api/gpuhub/gpus``, the hub's
own inventory: NVML or simulated; on the Slurm backend every node's GPUs with their jobs,
the nodes that take no jobs and the pending jobs) with a token the hub keeps in its state dir
(``gpuhub-cli-token``, mode 0600, scopes ``custom:gpuhub:gpus:read`` and the reservations',
see :mod:`hub_ext.ops.board`, :mod:`hub_ext.reservations.hubconfig`); with no hub answering
it says so in one line and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime
from pathlib import Path

from .common.hub_api import HubRefused, HubUnreachable, hub_request
from .settings import Settings


def board_from_hub(settings: Settings) -> dict:
    """The running hub's GPU board (``GET /hub/api/gpuhub/gpus``, :mod:`hub_ext.ops.board`),
    with the CLI's token from the state dir.  Raises :class:`HubUnreachable` with one
    sentence (:func:`hub_ext.common.hub_api.hub_request`)."""
    try:
        return hub_request(settings, "GET", "/gpuhub/gpus", timeout=10)
    except HubRefused as e:
        raise HubUnreachable(str(e)) from None


def _ago(since: str) -> str:
    minutes = int((time.time() - datetime.fromisoformat(since).timestamp()) // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def gpus(args) -> int:
    """The running hub's GPU board as a table (or its JSON); exit 1 with one line when no
    hub answers."""
    try:
        board = board_from_hub(Settings.from_env())
    except (HubUnreachable, ValueError) as e:
        print(f"gpuhub gpus: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(board, indent=2))
        return 0
    if board["inventory"] == "simulated":
        print("SIMULATED GPUs (no driver): for demos and tests only")
    if board.get("error"):
        print(f"GPU inventory error: {board['error']}")
    header = f"{'IDX':>3}  {'UUID':<40} {'STATE':<9} {'UTIL':>4} {'MEMORY (MiB)':>15}  OWNER"
    print(header)
    print("-" * len(header))
    for r in board["devices"]:
        mem = (
            f"{r['memory_used_mib']}/{r['memory_total_mib']}"
            if r["memory_total_mib"] is not None
            else "?"
        )
        util = f"{r['utilization_pct']}%" if r["utilization_pct"] is not None else "?"
        owner = r["owner"]
        if owner:
            name = owner["user"] + (f":{owner['server']}" if owner["server"] else "")
            since = _ago(owner["since"]) if owner["since"] else "?"
            who = f"{name} ({owner['profile'] or '-'}, {since})"
        elif r["state"] == "outside":
            who = "outside the hub: pid " + ",".join(str(p["pid"]) for p in r["processes"])
        elif r["state"] == "unhealthy":
            who = r["health_reason"]
        else:
            who = "-"
        if r["state"] not in ("free", "held", "outside", "unhealthy"):  # a node's state
            who = f"{r['health_reason'] or '-'}" + (f"; {who}" if owner else "")
        if owner and owner.get("job"):
            who += f" job {owner['job']}"
        print(f"{r['index']:>3}  {r['uuid']:<40} {r['state']:<9} {util:>4} {mem:>15}  {who}")
    print_cluster(board)
    return 0


def print_cluster(board: dict) -> None:
    """A Slurm board's nodes that take no jobs (with Slurm's reason) and pending jobs."""
    for n in board.get("nodes") or []:
        if not n["available"]:
            print(f"node {n['name']} is {n['state']}: {n['reason'] or 'no reason given'}")
    pending = board.get("pending") or []
    if pending:
        print(
            f"\n{'POS':>3}  {'JOB':<10} {'PARTITION':<12} {'REASON':<14} "
            f"{'EXPECTED START':<20} MEMBER"
        )
        for j in pending:
            who = j["user"] + (f":{j['server']}" if j["server"] else "")
            who += (
                f" ({j['profile']})"
                if j["profile"]
                else (" (not the hub's)" if not j["known"] else "")
            )
            print(
                f"{j['position']:>3}  {j['job']:<10} {j['partition']:<12} {j['reason']:<14} "
                f"{j['expected_start'] or 'unknown':<20} {who}"
            )


def init(args) -> int:
    """Write a new .env (mode 0600) with fresh secrets; exit 1 when one exists."""
    from .ops.deploy import EnvFileExists, write_env

    try:
        path = write_env(Path(args.env_file), force=args.force, socket=args.docker_socket)
    except EnvFileExists:
        print(
            f"gpuhub init: {args.env_file} exists. Its secrets are in use once the hub ran "
            "(the crypt key, the database passwords); `gpuhub init --force` replaces it "
            'with new ones (docs/howto/upgrades-backups.md, "Change a secret")',
            file=sys.stderr,
        )
        return 1
    print(
        f"gpuhub init: wrote {path} (mode 600) with fresh secrets. Fill in the login "
        "settings (GPUHUB_OIDC_*), put the TLS certificate and key in ./tls, then follow "
        "docs/tutorial/first-hub.md."
    )
    return 0


def upgrade(args) -> int:
    """Migrate both databases; exit 1 (with the cause, never a password) when one fails."""
    import logging

    from .ops.deploy import upgrade as run_upgrade

    logging.basicConfig(level=logging.INFO, format="gpuhub upgrade: %(message)s")
    log = logging.getLogger("gpuhub.upgrade")
    try:
        steps = run_upgrade(Settings.from_env(), log)
    except Exception as e:  # noqa: BLE001 - the operator needs the cause, not a traceback
        print(f"gpuhub upgrade: failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    for step in steps:
        print(f"gpuhub upgrade: {step.name} {step.url}: {step.outcome}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``gpuhub`` parser, its subcommands with their arguments (the CLI reference page
    of the docs is generated from it).  ``credits`` is listed here but parsed by
    :func:`hub_ext.credits.cli.build_parser`."""
    parser = argparse.ArgumentParser(prog="gpuhub", description="GPU Cluster Hub operations")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gpus", help="devices, owners, utilization and health")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=gpus)
    p = sub.add_parser("init", help="write a deployment's .env with fresh secrets (mode 600)")
    p.add_argument("--env-file", default=".env", help="where to write it (default: .env)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing file, and its secrets, with new ones",
    )
    p.add_argument(
        "--docker-socket",
        default="/var/run/docker.sock",
        help="the socket whose group the hub joins (default /var/run/docker.sock)",
    )
    p.set_defaults(func=init)
    p = sub.add_parser("upgrade", help="migrate the hub database and the credits ledger")
    p.set_defaults(func=upgrade)
    from .ops.usage import add_arguments, usage

    p = sub.add_parser("usage", help="GPU-hours, credits and servers per user or group")
    add_arguments(p)
    p.set_defaults(func=usage)
    from .reservations.cli import add_parser as add_reservations

    add_reservations(sub)

    from .config_cli import add_arguments as add_config_arguments

    p = sub.add_parser(
        "config",
        help="the effective settings (show) and whether the hub would start with them (check)",
    )
    add_config_arguments(p)
    sub.add_parser("credits", help="the credit ledger: grant, balance, history", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if argv and argv[0] == "credits":
        from .credits.cli import main as credits_main

        return credits_main(argv[1:])
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
