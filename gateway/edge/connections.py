"""The HTTP connection edge: uvicorn's httptools protocol with the bounds it lacks.

uvicorn closes a keep-alive connection that stays idle after a response, and nothing else: a
connection that never sends a byte, one that sends its headers a byte at a time, or a body that
trickles in is held forever, and a header of 64 MB is parsed in full before any route sees it. A
few hundred silent connections then use up the process's file descriptors and every new client is
refused. `guarded_protocol` adds, per connection:

- a request head (request line and headers) must arrive within `header_timeout_s` of the
  connection opening or of its first byte after a response (else 408 and close; a new connection
  that sent nothing at all is closed without an answer, as uvicorn closes an idle keep-alive one
  after `keep_alive_timeout_s`);
- a body must arrive within `body_timeout_s` of its headers (else 408 and close);
- a head larger than `max_header_bytes` or with more than `max_headers` fields is refused with 431
  as soon as it passes the limit, before it is parsed further;
- at most `max_connections` are open at once: past that, the longest-open connection that is not
  being served (idle between requests or still sending its head) is closed to make room, and if
  every connection is busy the new one is answered 503 and closed. The open connections are kept
  in the order they opened, so the one to close is found from the oldest and the search stops
  there (scanning them all for each newcomer past the cap held up the accept loop: 5,000 silent
  connections at a cap of 4,096 delayed a /health 1.9-2.7 s on 2 loaded cores, 0.08 s below it).

Each close is counted in `kembed_gateway_connections_closed_total{reason}`; open connections in
`kembed_gateway_open_connections`.

A POST to a hot route (`/v1/embeddings`, `/embed`) is served here past the ASGI stack: its body is
gathered, `HotPath.respond` (hot_path.py) answers it, and the answer leaves in one write; the
connection's end cancels it. Everything else, and a hot request that arrives pipelined behind
another or asks for `100-continue`, goes to the ASGI app as before.

It also answers an HTTP/2 upgrade offer (`Upgrade: h2c`, which curl's `--http2`, Spring's
RestClient and Ktor clients send on plain-HTTP requests) as the HTTP/1.1 request it is. The gateway
speaks HTTP/1.1 only, and a server may ignore an Upgrade offer (RFC 9110 §7.8), but httptools stops
parsing at the end of such a request's head, so uvicorn hands the app an empty body (a 400 for
every such client). A request head is therefore held until it is whole (it usually comes in one
read) and its Upgrade field dropped before the parser sees it.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
import resource
import time
from asyncio import TimerHandle
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from kembed.gateway.config import GatewayConfig
from kembed.gateway.edge.hot_path import HotPath
from kembed.gateway.errors import (
    GatewayError,
    HeadersTooLarge,
    PayloadTooLarge,
    RequestTimeout,
    Unavailable,
    flavour_of,
    render,
)
from kembed.gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

# File descriptors kept free for what is not a client connection: worker channels and data-port
# connections, the tokenizer, logs, metrics files.
RESERVED_FDS = 64

_IDLE, _HEAD, _BODY, _SERVING = "idle", "head", "body", "serving"
_HEAD_END = b"\r\n\r\n"
_UPGRADE_FIELD = re.compile(rb"\r\nupgrade[ \t]*:[^\r]*", re.IGNORECASE)
_BARE_LF = re.compile(rb"(?<!\r)\n")


def without_upgrade(head: bytes) -> bytes:
    """A request head (through its blank line) without its Upgrade fields, so that it is parsed as
    the plain HTTP/1.1 request it also is."""
    return _UPGRADE_FIELD.sub(b"", head)


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (the default soft 1024 is far below
    what a gateway with thousands of keep-alive clients needs); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # not allowed here: keep what we have
            pass
    return soft


def connection_cap(config: GatewayConfig, fd_limit: int) -> int:
    """`max_connections`, lowered to fit the file descriptors this process may open."""
    cap = min(config.max_connections, max(fd_limit - RESERVED_FDS, 1))
    if cap < config.max_connections:
        log.warning(
            "max_connections lowered from %d to %d: the open-file limit is %d",
            config.max_connections,
            cap,
            fd_limit,
        )
    return cap


def _raw_response(status: int, message: str, url: bytes) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, rendered as every error is
    (errors.render: the body shape of the route's API)."""
    error = _ERRORS[status](message)
    response = render(error, flavour_of(url.decode("latin-1")), retry_after_s=0)
    body = bytes(response.body)
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_ERRORS: dict[int, type[GatewayError]] = {
    408: RequestTimeout,
    413: PayloadTooLarge,
    431: HeadersTooLarge,
    503: Unavailable,
}


class _Event:
    """What uvicorn's protocol calls on a cycle's message event: nothing waits on a hot one."""

    def set(self) -> None:
        pass


class HotCycle:
    """A hot request in progress, with the attributes uvicorn's protocol reads of a cycle (its body
    as it arrives, whether the response started or completed, the client gone, keep-alive)."""

    message_event = _Event()

    def __init__(self, url: bytes, headers: list[tuple[bytes, bytes]], keep_alive: bool) -> None:
        self.url = url
        self.headers = headers
        self.keep_alive = keep_alive
        self.body = bytearray()
        self.more_body = True
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.task: asyncio.Task[None] | None = None
        self.started = time.perf_counter()


class _Refusal(Exception):
    """Raised from a parser callback to stop parsing a request the gateway refuses."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason


def guarded_protocol(
    config: GatewayConfig, metrics: GatewayMetrics, max_connections: int, hot: HotPath | None = None
) -> type:
    """uvicorn's httptools protocol class with this gateway's connection bounds, serving the hot
    routes of `hot` itself (module docstring)."""
    header_timeout_s = config.header_timeout_s
    body_timeout_s = config.body_timeout_s
    max_header_bytes = config.max_header_bytes
    max_headers = config.max_headers
    max_body_bytes = config.max_request_bytes
    too_large = f"request body is larger than the limit of {max_body_bytes} bytes"
    hot_paths = hot.paths if hot is not None else frozenset()
    closed = metrics.connections_closed
    open_gauge = metrics.open_connections
    # this app's guarded connections, oldest first (a dict keeps insertion order; used as an ordered set)
    by_age: dict[Any, None] = {}

    class GuardedHttpProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._phase = _IDLE
            self._head_bytes = 0  # bytes received while a head is due or arriving
            self._field_bytes = 0  # the current head's URL and fields, as parsed
            self._num_headers = 0
            self._timer: TimerHandle | None = None
            self._is_refused = False
            self._held = b""  # the start of a request head, until its blank line comes
            self.url = b""

        # -- lifecycle --------------------------------------------------------------------------
        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= max_connections and not self._evict_one():
                self._is_refused = True
                transport.write(
                    _raw_response(503, f"the gateway holds {max_connections} connections, its limit", b"")
                )
                transport.close()
                closed.labels("too_many_connections").inc()
                return
            super().connection_made(transport)
            by_age[self] = None
            open_gauge.inc()
            self._arm(header_timeout_s, "header_timeout")  # the first request's head must come

        def connection_lost(self, exc: Exception | None) -> None:
            # refused in connection_made: never counted or registered (uvicorn types the transport as
            # always set; it is None until its connection_made)
            if self.transport is None:
                return  # type: ignore[unreachable]
            if self in self.connections:
                open_gauge.dec()
            by_age.pop(self, None)
            self._disarm()
            cycle = self._hot_cycle()
            super().connection_lost(exc)
            if cycle is not None and cycle.task is not None and not cycle.task.done():
                cycle.task.cancel()  # the client left: its request is dropped (recorded as 499)
            elif cycle is not None and cycle.more_body and not self._is_refused and hot is not None:
                hot.record_left(cycle.url, cycle.started)  # it left while sending its body: 499 too

        def _is_evictable(self) -> bool:
            """Not being served: idle between requests, or still sending a head."""
            is_answered = self.cycle is None or self.cycle.response_complete
            return is_answered and self._phase in (_IDLE, _HEAD) and not self.pipeline

        def _evict_one(self) -> bool:
            """Close the longest-open connection not being served; False if every one is busy. From
            the oldest: it is usually the one (a silent or idle connection is not served)."""
            oldest = next((c for c in by_age if c._is_evictable()), None)
            if oldest is None:
                return False
            oldest._close("evicted_idle")
            return True

        # -- timers -----------------------------------------------------------------------------
        def _arm(self, seconds: float, reason: str) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._expire, reason)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self, reason: str) -> None:
            self._timer = None
            if self.transport.is_closing():
                return
            if reason == "body_timeout" and self.flow.read_paused:  # we stopped reading, not the client
                self._arm(body_timeout_s, reason)
                return
            if reason == "header_timeout" and self._phase == _IDLE:  # not a byte sent: close quietly
                self._close("idle_timeout")
            elif reason == "header_timeout":
                self._refuse(408, f"the request head did not arrive within {header_timeout_s:g} s", reason)
            else:
                self._refuse(408, f"the request body did not arrive within {body_timeout_s:g} s", reason)

        def _refuse(self, status: int, message: str, reason: str) -> None:
            """Answer `status` (unless a response is already under way) and close."""
            self._is_refused = True
            if self.cycle is None or not self.cycle.response_started:
                self.transport.write(_raw_response(status, message, self.url))
            self._close(reason)

        def _close(self, reason: str) -> None:
            closed.labels(reason).inc()
            by_age.pop(self, None)  # closing: no longer one to make room with
            self._disarm()
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True  # the app's receive() now reports a disconnect
                self.cycle.message_event.set()
            self.transport.close()

        # -- input ------------------------------------------------------------------------------
        def data_received(self, data: bytes) -> None:
            """uvicorn's, plus the head-size bound and the refusals raised from the callbacks."""
            if self._is_refused:
                return
            self._unset_keepalive_if_required()
            if self._phase in (_IDLE, _HEAD):
                self._head_bytes += len(data)
            if self._phase == _IDLE or self._held:  # a head begins here, or has begun in self._held
                data = self._whole_head(data)
                if not data:  # held until the head is whole, unless it has grown past its bound
                    if self._head_bytes > max_header_bytes:
                        self._refuse(
                            431,
                            f"the request head is larger than {max_header_bytes} bytes",
                            "headers_too_large",
                        )
                    return
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._unsupported_upgrade_warning()
                return
            except httptools.HttpParserError as error:
                if isinstance(error.__context__, _Refusal):
                    refusal = error.__context__
                    self._refuse(refusal.status, refusal.message, refusal.reason)
                    return
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
                return
            # A head that arrives slowly is bounded here, before the parser has buffered all of it.
            if self._phase in (_IDLE, _HEAD) and self._head_bytes > max_header_bytes:
                self._refuse(
                    431, f"the request head is larger than {max_header_bytes} bytes", "headers_too_large"
                )

        def _whole_head(self, data: bytes) -> bytes:
            """`data` with the held part of the head before it, its Upgrade fields dropped, once the
            head's blank line has come; b"" while it has not (the bytes are held). A head with a
            line ended by LF alone is passed on as it is, for the parser to refuse."""
            held = self._held + data
            end = held.find(_HEAD_END)
            if end < 0 and _BARE_LF.search(held, len(self._held)) is not None:
                # A line ended by LF alone: held, this head would wait for a CRLF CRLF that never
                # comes (408 after header_timeout_s); the parser refuses it at once (400).
                self._held = b""
                return held
            if end < 0:
                self._held = held
                target = held.split(b"\r\n", 1)[0].split(b" ")  # the URL, for a refusal's body shape
                self.url = target[1] if len(target) > 1 else b""  # (the parser sets it again)
                if self._phase == _IDLE:  # the head has begun: from now on it is due (408, not quiet)
                    self._phase = _HEAD
                    if self._timer is None:  # a keep-alive connection's next request
                        self._arm(header_timeout_s, "header_timeout")
                return b""
            self._held = b""
            if _UPGRADE_FIELD.search(held, 0, end) is None:  # nearly every request: passed on uncopied
                return held
            end += len(_HEAD_END)
            return without_upgrade(held[:end]) + held[end:]

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._num_headers = 0
            self._field_bytes = 0
            if self._phase == _IDLE and self._timer is None:  # a keep-alive connection's next request
                self._arm(header_timeout_s, "header_timeout")
            self._phase = _HEAD

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._num_headers += 1
            if self._num_headers > max_headers:
                raise _Refusal(
                    431, f"the request has more than {max_headers} header fields", "headers_too_large"
                )
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count_head(self, num_bytes: int) -> None:
            self._field_bytes += num_bytes
            if self._field_bytes > max_header_bytes:
                raise _Refusal(
                    431, f"the request head is larger than {max_header_bytes} bytes", "headers_too_large"
                )

        def on_headers_complete(self) -> None:
            self._head_bytes = 0
            self._phase = _BODY
            self._arm(body_timeout_s, "body_timeout")
            if self.url in hot_paths and self._is_hot():
                self._begin_hot()
                return
            super().on_headers_complete()

        # -- hot routes (hot_path.py) -----------------------------------------------------------
        def _is_hot(self) -> bool:
            """A POST to a hot route this protocol can serve itself: not pipelined behind another
            request, not asking for 100-continue, not an upgrade."""
            return (
                self.parser.get_method() == b"POST"
                and (self.cycle is None or self.cycle.response_complete)
                and not self.expect_100_continue
                and not self.parser.should_upgrade()
            )

        def _begin_hot(self) -> None:
            keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
            # uvicorn types `cycle` as its own class; a HotCycle has every attribute its protocol reads of
            # one (tests/gateway/test_uvicorn_internals.py)
            self.cycle = HotCycle(self.url, self.headers, keep_alive)  # type: ignore[assignment]
            declared = next((v for n, v in self.headers if n == b"content-length"), b"")
            if declared.isdigit() and int(declared) > max_body_bytes:  # refused before it is read
                raise _Refusal(413, too_large, "body_too_large")

        def _hot_cycle(self) -> HotCycle | None:
            cycle: object = self.cycle  # uvicorn types it as its own cycle class
            return cycle if isinstance(cycle, HotCycle) else None

        def on_body(self, body: bytes) -> None:
            cycle = self._hot_cycle()
            if cycle is None:
                super().on_body(body)
                return
            cycle.body += body
            if len(cycle.body) > max_body_bytes:  # more than it declared: refused as it passes the cap
                raise _Refusal(413, too_large, "body_too_large")

        def on_message_complete(self) -> None:
            self._disarm()
            self._phase = _SERVING
            cycle = self._hot_cycle()
            if cycle is None:
                super().on_message_complete()
                return
            cycle.more_body = False
            cycle.task = self.loop.create_task(self._serve_hot(cycle))
            self.tasks.add(cycle.task)  # the server's graceful shutdown waits for it
            cycle.task.add_done_callback(self.tasks.discard)

        async def _serve_hot(self, cycle: HotCycle) -> None:
            assert hot is not None
            try:
                response = await hot.respond(cycle.url, cycle.headers, bytes(cycle.body))
            except asyncio.CancelledError:  # the client left: nobody to answer
                return
            if cycle.disconnected or self.transport.is_closing():
                return
            head = [STATUS_LINE[response.status_code]]
            for name, value in (*self.server_state.default_headers, *response.raw_headers):
                head += (name, b": ", value, b"\r\n")
            if not cycle.keep_alive:
                head.append(b"connection: close\r\n")
            head.append(b"\r\n")
            cycle.response_started = True
            self.transport.write(b"".join(head) + response.body)
            cycle.response_complete = True
            self.on_response_complete()
            if not cycle.keep_alive:
                self.transport.close()

        def on_response_complete(self) -> None:
            if self._phase == _SERVING:
                self._phase = _IDLE
            super().on_response_complete()

    return GuardedHttpProtocol
