"""Bearer-token authentication for the reference engine, as SGLang's ``--api-key`` does it
(``srt/utils/auth.py``): every route requires ``Authorization: Bearer <key>`` except the
probes, ``/health*`` and ``/metrics``, which load balancers and Prometheus reach without a
secret. A request without the key, or with another, is answered 401 ``{"error":
"Unauthorized"}``; the key is compared in constant time and never logged."""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PREFIXES = ("/health", "/metrics")


class RequireApiKey:
    """ASGI middleware around the engine's app."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self._expected):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)
