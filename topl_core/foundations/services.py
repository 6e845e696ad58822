"""Outside services the workbench talks to — an MLflow tracking server, a model hub, a Ray cluster — probed before
the work starts: one that is not there fails in seconds with a ServiceError naming it, the setting that named it and
the fix, instead of minutes of its client's retries and a traceback.

    unreachable(host, port, timeout_s) -> str | None       why a TCP connection failed; None when one was made
    check_reachable(address, default_port, what, setting, fix)   a ServiceError when nothing answers at `address`
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from .errors import ConfigError, ServiceError

PROBE_TIMEOUT_S = 2.0  # a server on the network answers a connect in milliseconds; a dead address waits this long


def unreachable(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a TCP connection to host:port could not be made within timeout_s; None when it was."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except socket.timeout:
        return f"no answer within {timeout_s:g} s"
    except OSError as e:  # refused (nothing listens), no route, a name that does not resolve
        return e.strerror or str(e)
    return None


def host_port(address: str, default_port: int) -> tuple[str, int] | None:
    """(host, port) of a URL (scheme://host[:port]/…) or a bare host[:port]; None when it names no host or port."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port or default_port
    except ValueError:  # a port that is not a number, or out of range
        return None
    return (parts.hostname, port) if parts.hostname else None


def check_reachable(
    address: str, default_port: int, *, what: str, setting: str, fix: str, timeout_s: float = PROBE_TIMEOUT_S
) -> None:
    """Refuse, with the fix, an address where nothing answers: `what` is the service ("the MLflow tracking server"),
    `setting` the option that named it ("mlflow_tracking_uri (--mlflow-tracking-uri)")."""
    where = host_port(address, default_port)
    if where is None:
        raise ConfigError(f"{setting} = {address!r}: not an address (host:port or scheme://host:port/…). {fix}")
    host, port = where
    why = unreachable(host, port, timeout_s)
    if why is not None:
        raise ServiceError(
            f"{setting} = {address}: {what} at {host}:{port} is not reachable ({why}); nothing was started. {fix}"
        )
