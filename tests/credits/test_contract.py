"""The reference service against the OpenAPI contract (1.1), by schemathesis, every check.

``schemathesis run --checks all`` generates requests from ``hub_ext/credits/openapi.yaml``
(examples, coverage edge cases, fuzzing, and stateful runs that grant, debit and refund
along the links it infers) and checks every answer: no 5xx, only documented statuses,
headers and content types, bodies matching the schemas, invalid requests refused, valid
ones accepted, methods not in the contract 405 with ``Allow``, and so on.  The contract's
business refusals of valid requests (a debit's 402, a refund's 404/422, a grant past the
largest amount) are expected answers, configured in ``tests/credits/schemathesis.toml``.
It runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.credits import REPO_ROOT
from tests.fixtures.hub import _need

SPEC = REPO_ROOT / "hub_ext" / "credits" / "openapi.yaml"
SHARED_SPEC = REPO_ROOT.parent / "shared" / "credits-api.yaml"
CONFIG = Path(__file__).with_name("schemathesis.toml")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def test_the_repo_copy_of_the_contract_equals_the_shared_one():
    # the shared contract lies beside the repo; CI must have it, a checkout elsewhere skips
    _need(SHARED_SPEC.exists(), f"no {SHARED_SPEC} beside the repo")
    assert filecmp.cmp(SPEC, SHARED_SPEC, shallow=False), (
        f"{SPEC} differs from {SHARED_SPEC}; copy the shared contract into the repo"
    )


def run_schemathesis(service, workdir: Path) -> subprocess.CompletedProcess:
    """``schemathesis run --checks all`` against ``service``, the admin token on every call
    (it may read, debit, refund and grant).  Random examples locally (fuzzing); a fixed,
    repeatable set in CI.  CREDITS_CONTRACT_EXAMPLES=500 searches harder."""
    command = [
        str(SCHEMATHESIS),
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        str(SPEC),
        "--url",
        service.url,
        "--checks",
        "all",
        "--continue-on-failure",
        "--header",
        f"Authorization: Bearer {service.admin_token}",
        "--max-examples",
        os.environ.get("CREDITS_CONTRACT_EXAMPLES", "50"),
        "--report",
        "junit",
        "--report-dir",
        str(workdir),
    ]
    if os.environ.get("CI"):
        # a fixed set (deterministic generation keeps no example database)
        command += ["--generation-deterministic", "--seed", "13"]
    else:
        command += ["--generation-database", "none"]
    return subprocess.run(command, capture_output=True, text=True, cwd=workdir, timeout=900)


def test_service_follows_the_contract_with_every_check(any_credits_service, tmp_path):
    result = run_schemathesis(any_credits_service, tmp_path)
    assert result.returncode == 0, result.stdout[-12000:] + result.stderr[-3000:]
    assert any_credits_service.admin_token not in result.stdout  # sanitised output
