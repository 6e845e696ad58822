"""The service's guard, before a request reaches the app (app.py): its Host header, its API key, its body's size.
Each refusal is OpenAI's error JSON."""

from __future__ import annotations

import hmac
from typing import Iterable

from .protocol import ServeError

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


class Guard:
    """Before a request reaches the app: its Host header (one of `allowed_hosts`, unless None), its API key (a Bearer
    token, compared in constant time) and its body's size (the declared length, and the bytes as they are read: a
    body sent without a length is stopped at the limit)."""

    def __init__(self, app, api_key: str | None, max_body: int, allowed_hosts: Iterable[str] | None):
        self.app, self.api_key, self.max_body = app, api_key, max_body
        self.allowed_hosts = None if allowed_hosts is None else {h.lower().strip("[]") for h in allowed_hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.allowed_hosts is not None and _host_name(headers.get("host", "")) not in self.allowed_hosts:
            refusal = ServeError(
                403,
                f"Host {headers.get('host', '')!r} is not served here ({sorted(self.allowed_hosts)}; serve "
                "--allowed-host adds a name).",
                None,
                "permission_error",
            )
            return await refusal.response()(scope, receive, send)
        if self.api_key is not None:
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                refusal = ServeError(401, "a valid API key is required (Authorization: Bearer KEY).", None, "auth")
                return await refusal.response()(scope, receive, send)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await self._too_large().response()(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_large(self) -> ServeError:
        return ServeError(413, f"the request body is over {self.max_body} bytes.", None)


def _host_name(host: str) -> str:
    """A Host header's name without its port ("[::1]:8000" → "::1", "localhost:8000" → "localhost")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
