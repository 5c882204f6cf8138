"""The hot routes (POST /v1/embeddings, /embed) served from the connection edge, past the ASGI stack.

A query's whole answer costs the gateway a few hundred microseconds of CPU, and under uvicorn and
Starlette a share of it goes to what a hot route does not need: a request-response cycle object, the
scope, the ASGI task's receive and send callables, each middleware's wrappers, a Starlette Request
and a response sent as two messages and two socket writes. The connection edge (connections.py)
hands a hot request here whole, body included; `HotPath.respond` runs the same route handler with
what the middleware stack does around it, and the edge writes the answer in one write:

- the request metrics (in flight, duration by route and status) and the errors counter, as
  `RequestMetrics` and the app's error handler record them;
- the API key (`Authorization: Bearer`), as `BearerAuth` checks it;
- the one error handler: a `GatewayError` rendered in the route's API shape, anything else logged and
  answered as a JSON 500;
- a client that leaves: its connection's end cancels the request at once (recorded as 499), as
  `CancelOnDisconnect` does, without a watcher task; one that leaves before its body is whole is
  recorded as 499 too (`record_left`).

Everything else (other routes, pipelined requests, `Expect: 100-continue`, requests through an ASGI
server other than the gateway's own) takes the ASGI path, which answers the same (a test checks the
two agree, request for request).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import Response

from kembed.gateway.edge.disconnect import CLIENT_CLOSED
from kembed.gateway.errors import GatewayError, Unauthorized, flavour_of, reason_of, render
from kembed.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

Endpoint = Callable[[Any], Awaitable[Response]]
ErrorHandler = Callable[[Any, Exception], Awaitable[Response]]


class _Url:
    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path


class HotRequest:
    """A request on a hot route, whole: what the route handlers and the error handler read of a
    Starlette `Request` (its method, path, headers and body)."""

    __slots__ = ("_headers", "_raw_headers", "method", "url", "whole_body")

    def __init__(self, path: str, raw_headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.method = "POST"
        self.url = _Url(path)
        self._raw_headers = raw_headers  # lower-cased names, as uvicorn parses them
        self._headers: Headers | None = None
        self.whole_body = body  # under the connection edge's body cap

    @property
    def headers(self) -> Headers:
        if self._headers is None:
            self._headers = Headers(raw=self._raw_headers)
        return self._headers

    async def stream(self) -> AsyncIterator[bytes]:
        yield self.whole_body

    async def body(self) -> bytes:
        return self.whole_body


class HotPath:
    """The hot routes' handlers, by their path as sent (bytes), and what the middleware does."""

    def __init__(
        self,
        handlers: dict[str, Endpoint],
        on_error: ErrorHandler,
        metrics: GatewayMetrics,
        api_key: str = "",
    ) -> None:
        self._handlers = {path.encode(): (path, handler) for path, handler in handlers.items()}
        self.paths = frozenset(self._handlers)
        self._on_error = on_error
        self._metrics = metrics
        self._expected = api_key.encode() if api_key else None
        self.num_requests = 0  # served here since start

    async def respond(self, url: bytes, raw_headers: list[tuple[bytes, bytes]], body: bytes) -> Response:
        """The response to a POST of `body` to the hot route `url`; raises CancelledError if the
        client left (recorded as 499)."""
        route, handler = self._handlers[url]
        started = time.perf_counter()
        self.num_requests += 1
        code = 500
        inflight = self._metrics.inflight_requests
        inflight.inc()
        try:
            request = HotRequest(route, raw_headers, body)
            if self._expected is not None and not self._is_authorized(raw_headers):
                response = self._unauthorized(route)
            else:
                try:
                    response = await handler(request)
                except Exception as error:
                    if not isinstance(error, GatewayError):  # a bug: logged, answered as JSON
                        log.exception("POST %s failed", route)
                    response = await self._on_error(request, error)
            code = response.status_code
            return response
        except asyncio.CancelledError:
            code = CLIENT_CLOSED
            raise
        finally:
            inflight.dec()
            self._metrics.duration(route, code).observe(time.perf_counter() - started)

    def record_left(self, url: bytes, started: float) -> None:
        """A request on the hot route `url` whose client left before its body was whole: 499, as
        one that leaves while it is served (nothing was started for it)."""
        route, _ = self._handlers[url]
        self._metrics.duration(route, CLIENT_CLOSED).observe(time.perf_counter() - started)

    def _is_authorized(self, raw_headers: list[tuple[bytes, bytes]]) -> bool:
        given = next((value for name, value in raw_headers if name == b"authorization"), b"")
        scheme, _, token = given.partition(b" ")
        assert self._expected is not None
        # The scheme is case-insensitive (RFC 9110): `bearer` and `BEARER` are `Bearer` too.
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected)

    def _unauthorized(self, route: str) -> Response:
        error = Unauthorized("missing or wrong API key: send the header `Authorization: Bearer <key>`")
        self._metrics.errors.labels(reason_of(error)).inc()
        response = render(error, flavour_of(route), retry_after_s=0)
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
