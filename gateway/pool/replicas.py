"""A worker replica as the gateway knows it (its channel, transport, load and health), how replicas
are found (a DNS name's addresses, resolved again and again by the pool), and a worker's error that
retrying elsewhere would not fix, as the gateway's own."""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from kembed.gateway.errors import GatewayError, InvalidInput, Timeout, Unsupported, WorkerFailed
from kembed.gateway.pool.transports import Transport
from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub

Resolve = Callable[[str, int], Awaitable[list[str]]]
"""`(host, port) -> ["ip:port", ...]`: the addresses a DNS name stands for now."""


async def resolve_dns(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (A and AAAA), as gRPC targets, in the resolver's order; none
    when the name does not exist (a headless Service with no ready pod has no records)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except socket.gaierror as error:
        if error.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            return []
        raise
    targets = [
        f"[{info[4][0]}]:{port}" if info[0] == socket.AF_INET6 else f"{info[4][0]}:{port}" for info in infos
    ]
    return list(dict.fromkeys(targets))


@dataclass(eq=False, slots=True)
class Replica:
    """One worker replica and what the gateway knows of it. Mutated only on the event loop."""

    address: str
    channel: grpc.aio.Channel
    stub: EmbedderStub
    transport: Transport  # unary calls until its Info advertises a data port that answers
    data_port_lost_at: float = -math.inf  # loop.time() its data port last failed to connect
    outstanding_tokens: int = 0
    num_chunks_served: int = 0
    is_serving: bool = False
    last_serving_at: float = -math.inf  # loop.time() of the last SERVING answer
    queued_tokens: int = 0
    info: pb.InfoResponse | None = None
    refusal: str = ""  # why it serves another model than the gateway's (model_check.py); "": it does not
    accepted_at: float = -math.inf  # loop.time() its Info last passed the model check
    last_error: str = ""
    is_discovered: bool = False  # from worker_service's DNS name (removed when it is gone from it)
    is_leaving: bool = False  # gone from the DNS name: no new work; closed once none is outstanding
    # an attempt on it ran past its hedge budget: no new work (while another serves) until a probe
    # or an answer from it says it is alive (attempts.py)
    is_suspect: bool = False
    is_checking: bool = False  # a probe of a suspect is in flight
    tokens_per_s: float = 0.0  # its device's rate, from its Health (0: not known)
    num_stalls: int = 0  # times it was found stalled (a probe not answered, or NOT_SERVING, while suspect)
    num_rejoins: int = 0  # times it was heard SERVING after it was not (a chunk tried on it may come back)
    _down: asyncio.Future[None] | None = None

    def down_signal(self) -> asyncio.Future[None]:
        """A future set when the replica is next marked down (attempts on it wait on it too)."""
        if self._down is None or self._down.done():
            self._down = asyncio.get_running_loop().create_future()
        return self._down

    def mark_down(self, reason: str) -> None:
        """No work until a probe says it serves again; the attempts outstanding on it move."""
        self.is_serving = False
        self.last_error = reason
        if self._down is not None and not self._down.done():
            self._down.set_result(None)

    def describe(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "transport": self.transport.name,
            "serving": self.is_serving,
            "suspect": self.is_suspect,
            "stalls": self.num_stalls,
            "tokens_per_s": round(self.tokens_per_s),
            "outstanding_tokens": self.outstanding_tokens,
            "queued_tokens": self.queued_tokens,
            "num_chunks_served": self.num_chunks_served,
            "last_error": self.last_error or None,
            "refused": self.refusal or None,
            "tokenizer_digest": (self.info.tokenizer_digest or None) if self.info else None,
            "model_digest": (self.info.model_digest or None) if self.info else None,
            "discovered": self.is_discovered,
            "leaving": self.is_leaving,
        }


def translate_error(error: grpc.aio.AioRpcError, address: str) -> GatewayError:
    """A worker error that retrying elsewhere would not fix, as the gateway's error."""
    code, details = error.code(), error.details() or ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidInput(f"worker rejected the batch: {details}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return Unsupported(details or "the worker does not implement this operation")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Timeout("the request did not complete within its deadline")
    return WorkerFailed(f"worker {address} failed: {code.name} {details}")
