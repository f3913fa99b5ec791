"""Shared pytest set-up: fixture plugins, one per real part the tests start."""

pytest_plugins = [
    "tests.fixtures.nvml",
    "tests.fixtures.credits",
    "tests.fixtures.oidc",
    "tests.fixtures.hub",
    "tests.fixtures.network",
    "tests.fixtures.browser",
    "tests.fixtures.slurm",
]
