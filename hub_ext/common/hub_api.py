"""The running hub's REST API as ``gpuhub`` commands reach it on the hub's machine: its
address and one request with the CLI's token (``gpuhub gpus``, ``gpuhub reservations``).

The token is the ``gpuhub-cli`` service's, kept in the state dir (:data:`CLI_TOKEN_FILE`,
mode 0600) and made at the hub's first start; its role holds only what the commands need
(:mod:`hub_ext.ops.board`, :mod:`hub_ext.reservations.hubconfig`).
"""

from __future__ import annotations

from pathlib import Path

from .services import CLI_TOKEN_FILE

__all__ = ["HubRefused", "HubUnreachable", "hub_api_url", "hub_request"]


class HubUnreachable(Exception):
    """No running hub answered with the CLI's token (none running, no token, the token
    refused); ``str()`` is the one line a command prints."""


class HubRefused(Exception):
    """The hub answered with an error; ``str()`` is its message."""


def hub_api_url(settings) -> str:
    """The hub's own REST API on this machine (``GPUHUB_HUB_IP``:``GPUHUB_HUB_PORT``; an
    address that means every interface is reached on loopback)."""
    ip = settings.hub_ip if settings.hub_ip not in ("", "0.0.0.0", "::") else "127.0.0.1"
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{settings.hub_port}/hub/api"


def hub_request(settings, method: str, path: str, body: dict | None = None, timeout: float = 30):
    """``method path`` (``/gpuhub/...``) on the running hub's API with the CLI's token: the
    decoded JSON answer (None for 204).  Raises :class:`HubUnreachable` (no hub, no token,
    the token refused: 401/403) or :class:`HubRefused` (another 4xx/5xx, the hub's
    message)."""
    import httpx

    token_path = Path(settings.state_dir) / CLI_TOKEN_FILE
    url = hub_api_url(settings) + path
    if not token_path.exists():
        raise HubUnreachable(
            f"no hub token in {token_path}: no hub has run with this "
            "GPUHUB_STATE_DIR; start it, or set GPUHUB_STATE_DIR to its"
        )
    headers = {"Authorization": f"token {token_path.read_text().strip()}"}
    try:
        r = httpx.request(method, url, headers=headers, json=body, timeout=timeout)
    except httpx.HTTPError as e:
        raise HubUnreachable(
            f"no hub answers at {url} ({type(e).__name__}); start it, or "
            "set GPUHUB_HUB_PORT / GPUHUB_STATE_DIR to the running "
            "hub's"
        ) from None
    if r.status_code == 204:
        return None
    try:
        answer = r.json()
    except ValueError:
        answer = {"message": r.text[:200]}
    message = answer.get("message") if isinstance(answer, dict) else None
    if r.status_code in (401, 403):
        raise HubUnreachable(
            f"the hub at {url} refused the token in {token_path} "
            f"({r.status_code}"
            + (f": {message}" if message else "")
            + "); restart the hub so it loads it"
        )
    if r.status_code >= 400:
        raise HubRefused(message or f"the hub at {url} answered {r.status_code}")
    return answer
