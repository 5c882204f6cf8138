"""API-key check in front of every route but the probes: `Authorization: Bearer <key>`, as the OpenAI
and TEI clients send it (the OpenAI SDK's `api_key=`).

A plain ASGI middleware, so a refused request costs no routing or body parsing; the comparison is
constant-time. /health and /ready stay open for the kubelet's probes, /metrics for Prometheus.
"""

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from kembed.gateway.errors import Unauthorized, flavour_of, reason_of, render
from kembed.gateway.metrics import GatewayMetrics

# The probes, Prometheus, and the API's description (it holds no data): a browser opening /docs cannot
# send the key, and Swagger UI fetches /openapi.json and its own assets under /docs/.
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics", "/openapi.json", "/docs"})
OPEN_PREFIX = "/docs/"


class BearerAuth:
    """Refuses with 401 (in the route's OpenAI, Cohere or TEI error shape) unless the bearer token
    matches."""

    def __init__(self, app: ASGIApp, api_key: str, metrics: GatewayMetrics) -> None:
        self.app = app
        self._metrics = metrics
        self._expected = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIX):
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        # The scheme is case-insensitive (RFC 9110): `bearer` and `BEARER` are `Bearer` too.
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected):
            await self.app(scope, receive, send)
            return
        error = Unauthorized("missing or wrong API key: send the header `Authorization: Bearer <key>`")
        self._metrics.errors.labels(reason_of(error)).inc()
        response = render(error, flavour_of(scope["path"]), retry_after_s=0)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
