"""``gpuhub``: the command line for operators.

    gpuhub gpus [--json]            devices, owners, utilization, health (like nvidia-smi)
    gpuhub usage --since DATE [--by user|group] [--csv]   GPU-hours, credits, servers
                                    (hub_ext.usage)
    gpuhub credits grant|balance|history ...   the credit ledger (hub_ext.credits.cli)
    gpuhub init [--env-file .env] [--force]    a deployment's .env with fresh secrets
    gpuhub upgrade                  migrate the hub database and the credits ledger

``init`` and ``upgrade`` are in :mod:`hub_ext.deploy`; README.md "Production" uses them.

``gpuhub gpus`` needs no running hub: it reads the inventory the hub is configured with
(GPUHUB_GPUS) and the owners from the labels on the hub's containers (GPUHUB_HUB_ID).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .config import Settings
from .inventory import SimulatedInventory, allocatable_units


def _inventory(settings: Settings):
    if settings.gpus.startswith("simulated:"):
        spec = settings.gpus.split(":", 1)[1]
        return (SimulatedInventory(count=int(spec)) if spec.isdigit()
                else SimulatedInventory(path=spec))
    from .nvml import NVMLInventory

    return NVMLInventory()


def _owners(hub_id: str) -> dict[str, dict]:
    """Device UUID -> {owner, profile, since, container}, from container labels."""
    import docker

    from .reconcile import containers_by_owner

    try:
        live = containers_by_owner(docker.APIClient(), hub_id)
    except Exception as e:  # noqa: BLE001 - a table without owners is still useful
        print(f"gpuhub: cannot read containers from Docker ({e}); owners unknown",
              file=sys.stderr)
        return {}
    return {
        uuid: {"owner": str(owner), "profile": info["profile"], "since": info["since"],
               "container": info["name"]}
        for owner, info in live.items() for uuid in info["uuids"]
    }


def _ago(since: float) -> str:
    minutes = int((time.time() - since) // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def gpus(args) -> int:
    from .pool import unit_state  # traitlets: not needed by ``gpuhub init``

    settings = Settings.from_env()
    inventory = _inventory(settings)
    devices = inventory.read()
    owners = _owners(settings.hub_id)
    rows = []
    for unit in allocatable_units(devices):
        held = owners.get(unit.uuid)
        state = unit_state(unit, held is not None)
        rows.append({**unit.to_dict(), "state": state, "owner": held})
    if args.json:
        print(json.dumps({"inventory": inventory.kind, "devices": rows}, indent=2))
        return 0
    if inventory.kind == "simulated":
        print("SIMULATED GPUs (no driver): for demos and tests only")
    header = f"{'IDX':>3}  {'UUID':<40} {'STATE':<9} {'UTIL':>4} {'MEMORY (MiB)':>15}  OWNER"
    print(header)
    print("-" * len(header))
    for r in rows:
        mem = (f"{r['memory_used_mib']}/{r['memory_total_mib']}"
               if r["memory_total_mib"] is not None else "?")
        util = f"{r['utilization_pct']}%" if r["utilization_pct"] is not None else "?"
        if r["owner"]:
            who = (f"{r['owner']['owner']} ({r['owner']['profile'] or '-'}, "
                   f"{_ago(r['owner']['since'])})")
        elif r["state"] == "outside":
            who = "outside the hub: pid " + ",".join(str(p["pid"]) for p in r["processes"])
        elif r["state"] == "unhealthy":
            who = r["health_reason"]
        else:
            who = "-"
        print(f"{r['index']:>3}  {r['uuid']:<40} {r['state']:<9} {util:>4} {mem:>15}  {who}")
    return 0


def init(args) -> int:
    """Write a new .env (mode 0600) with fresh secrets; exit 1 when one exists."""
    from .deploy import EnvFileExists, write_env

    try:
        path = write_env(Path(args.env_file), force=args.force, socket=args.docker_socket)
    except EnvFileExists:
        print(f"gpuhub init: {args.env_file} exists. Its secrets are in use once the hub ran "
              "(the crypt key, the database passwords); `gpuhub init --force` replaces it "
              "with new ones (README.md \"Production\": changing a secret)", file=sys.stderr)
        return 1
    print(f"gpuhub init: wrote {path} (mode 600) with fresh secrets. Fill in the login "
          "settings (GPUHUB_OIDC_*), put the TLS certificate and key in ./tls, then follow "
          "README.md \"Production\".")
    return 0


def upgrade(args) -> int:
    """Migrate both databases; exit 1 (with the cause, never a password) when one fails."""
    import logging

    from .deploy import upgrade as run_upgrade

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="gpuhub", description="GPU Cluster Hub operations")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gpus", help="devices, owners, utilization and health")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=gpus)
    p = sub.add_parser("init", help="write a deployment's .env with fresh secrets (mode 600)")
    p.add_argument("--env-file", default=".env", help="where to write it (default: .env)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing file, and its secrets, with new ones")
    p.add_argument("--docker-socket", default="/var/run/docker.sock",
                   help="the socket whose group the hub joins (default /var/run/docker.sock)")
    p.set_defaults(func=init)
    p = sub.add_parser("upgrade", help="migrate the hub database and the credits ledger")
    p.set_defaults(func=upgrade)
    from .usage import add_arguments, usage

    p = sub.add_parser("usage", help="GPU-hours, credits and servers per user or group")
    add_arguments(p)
    p.set_defaults(func=usage)
    sub.add_parser("credits", help="the credit ledger: grant, balance, history",
                   add_help=False)
    if argv and argv[0] == "credits":
        from .credits.cli import main as credits_main

        return credits_main(argv[1:])
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
