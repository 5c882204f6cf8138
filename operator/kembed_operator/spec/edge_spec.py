"""`spec.gateway.connections`: the bounds each gateway process puts on its client connections
(gateway/edge/connections.py), for gateways behind load balancers or facing many clients. Every field is
optional: unset, the gateway's own default holds and nothing is rendered, so the gateway's template of
a model without them stays as it was."""

from __future__ import annotations

from pydantic import Field

from kembed.operator.spec.spec_base import SpecModel

__all__ = ["CONNECTION_VARIABLES", "ConnectionLimitsSpec"]

# field -> the gateway's environment variable (GatewayConfig's field, upper-cased)
CONNECTION_VARIABLES = {
    "max_connections": "KEMBED_GATEWAY_MAX_CONNECTIONS",
    "header_timeout_seconds": "KEMBED_GATEWAY_HEADER_TIMEOUT_S",
    "body_timeout_seconds": "KEMBED_GATEWAY_BODY_TIMEOUT_S",
    "keep_alive_timeout_seconds": "KEMBED_GATEWAY_KEEP_ALIVE_TIMEOUT_S",
}


class ConnectionLimitsSpec(SpecModel):
    """Client connection bounds per gateway process; unset fields keep the gateway's defaults."""

    max_connections: int | None = Field(
        None,
        ge=1,
        le=1_048_576,
        description="Client connections one gateway process keeps open (gateway default 4096, lowered to "
        "its open-file limit). Past it the longest-open idle connection is closed for the new one, or, "
        "with every one busy, the new one gets 503. Each idle connection costs ~10-20 KB. Raise it for "
        "many kept-alive clients per pod. Gateway: KEMBED_GATEWAY_MAX_CONNECTIONS.",
    )
    header_timeout_seconds: float | None = Field(
        None,
        ge=0.1,
        le=600,
        description="Seconds a client has to send a request's head (gateway default 10); 408 and close "
        "after, and a connection that sends nothing is closed quietly at that age. Gateway: "
        "KEMBED_GATEWAY_HEADER_TIMEOUT_S.",
    )
    body_timeout_seconds: float | None = Field(
        None,
        ge=0.1,
        le=3600,
        description="Seconds a client has to send a request's whole body once its head is in (gateway "
        "default 60, which takes the largest body at ~1.1 Mbit/s); 408 and close after. Raise it for "
        "slow links and large indexing requests. Gateway: KEMBED_GATEWAY_BODY_TIMEOUT_S.",
    )
    keep_alive_timeout_seconds: float | None = Field(
        None,
        ge=0.1,
        le=3600,
        description="Seconds an idle kept-alive connection stays open after a response (gateway default "
        "30). Keep it longer than the idle timeout of the load balancer or client pool in front, so "
        "that they, not the gateway, close the connection and no request races the close. Gateway: "
        "KEMBED_GATEWAY_KEEP_ALIVE_TIMEOUT_S.",
    )
