"""How the hub is wired to the credit API (credits are off until the hook lands)."""


def apply_credits_config(c, settings) -> None:
    """Add the credits hook and the credits service to the hub config (none yet)."""
