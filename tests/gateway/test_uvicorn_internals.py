"""The uvicorn internals the HTTP edge (gateway/edge/connections.py) subclasses and reads are still there,
with the signatures it calls them with: HttpToolsProtocol's callbacks and helpers, the attributes
it reads of a protocol, its flow control, its server state and its cycle, and STATUS_LINE. A uvicorn
release that renames or reshapes one fails here, not in production (pyproject pins the range)."""

import asyncio
import inspect
import re

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from kembed.gateway.edge.connections import HotCycle

# what GuardedHttpProtocol overrides or calls, and the parameters it passes (self aside)
METHODS = {
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "on_message_begin": [],
    "on_url": ["url"],
    "on_header": ["name", "value"],
    "on_headers_complete": [],
    "on_body": ["body"],
    "on_message_complete": [],
    "on_response_complete": [],
    "_unset_keepalive_if_required": [],
    "_unsupported_upgrade_warning": [],
    "send_400_response": ["msg"],
}

# instance attributes it reads of the protocol once a connection is made and a request has begun
PROTOCOL_ATTRIBUTES = (
    "connections", "tasks", "server_state", "loop", "logger", "parser", "transport", "flow",
    "cycle", "pipeline", "expect_100_continue", "url", "headers",
)  # fmt: skip

# what it calls on the protocol's httptools parser
PARSER_METHODS = ("feed_data", "get_method", "get_http_version", "should_keep_alive", "should_upgrade")


@pytest.mark.parametrize("name", sorted(METHODS), ids=sorted(METHODS))
def test_protocol_method_keeps_its_signature(name: str) -> None:
    method = getattr(HttpToolsProtocol, name)
    parameters = list(inspect.signature(method).parameters)
    assert parameters == ["self", *METHODS[name]]


async def _app(scope, receive, send) -> None:  # pragma: no cover - never called
    raise AssertionError("not served")


class _Transport(asyncio.Transport):
    def get_extra_info(self, name, default=None):
        return default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


async def test_protocol_has_the_attributes_the_edge_reads() -> None:
    config = Config(_app, http="httptools", lifespan="off", log_config=None)
    state = ServerState()
    protocol = HttpToolsProtocol(config=config, server_state=state, app_state={})
    protocol.connection_made(_Transport())
    protocol.on_message_begin()
    try:
        missing = [name for name in PROTOCOL_ATTRIBUTES if not hasattr(protocol, name)]
        assert missing == []
        assert protocol.connections is state.connections and protocol.tasks is state.tasks
        assert protocol in state.connections
        assert protocol.server_state.default_headers == []
        assert protocol.flow.read_paused is False
        assert protocol.cycle is None and protocol.expect_100_continue is False
        assert all(callable(getattr(protocol.parser, name)) for name in PARSER_METHODS)
    finally:
        protocol.connection_lost(None)
    assert protocol not in state.connections


def test_hot_cycle_has_every_attribute_the_protocol_reads_of_a_cycle() -> None:
    """A hot request's HotCycle stands in for uvicorn's RequestResponseCycle as `protocol.cycle`."""
    source = inspect.getsource(HttpToolsProtocol)
    read = set(re.findall(r"self\.cycle\.(\w+)", source))
    assert {"response_complete", "disconnected", "message_event"} <= read  # the scan finds them
    cycle = HotCycle(b"/v1/embeddings", [], keep_alive=True)
    assert sorted(name for name in read if not hasattr(cycle, name)) == []


def test_status_line_is_the_wire_status_line() -> None:
    assert STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"
    assert STATUS_LINE[413].startswith(b"HTTP/1.1 413 ")
    assert httptools_impl.STATUS_LINE is STATUS_LINE
