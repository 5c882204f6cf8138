"""Whether the worker takes requests: starting, serving, stalled (stalls.py) or draining, as the
standard `grpc.health.v1` service tells it (Kubernetes' gRPC probes) and as kembed's Health tells the
gateway (server.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]  # not in grpc-stubs

from kembed.worker.edge.auth import EMBEDDER

log = logging.getLogger("kembed.worker.edge.server")  # its messages kept under the server's logger


class Readiness:
    """Whether the worker takes requests, as the standard health service tells it for the whole server
    ("") and for `kembed.v1.Embedder`, and as kembed's Health tells the gateway."""

    SERVICES = ("", EMBEDDER)

    def __init__(self) -> None:
        self.servicer = health_aio.HealthServicer()
        # The library starts "" at SERVING; its setter is a coroutine (it wakes Watch calls), and there
        # is no Watch before the server starts, so the first statuses are written directly.
        self.servicer._server_status.update(
            dict.fromkeys(self.SERVICES, health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        self._is_started = False
        self._is_drained = False
        self.stall = ""  # why the worker is stalled now (stalls.py); empty: it is not

    @property
    def is_serving(self) -> bool:
        return self._is_started and not self._is_drained and not self.stall

    @property
    def reason(self) -> str:
        """Why it is not serving ("" while it serves)."""
        if self._is_drained:
            return "draining"
        return self.stall or ("" if self._is_started else "starting")

    async def set_serving(self) -> None:
        if self._is_drained:
            return
        self._is_started = True
        await self._publish()

    async def drain(self) -> None:
        """NOT_SERVING for good (later `set_serving` calls are ignored)."""
        self._is_drained = True
        await self.servicer.enter_graceful_shutdown()

    async def watch(self, stall: Callable[[], str | None], every_s: float, beat: Callable[[], None]) -> None:
        """Every `every_s`: NOT_SERVING while `stall()` gives a reason, SERVING again once it gives
        none (the liveness probe, on the same service, restarts a pod stalled for long); `beat` tells
        the loop watch the loop turns. Runs until cancelled."""
        while True:
            await asyncio.sleep(every_s)
            beat()
            was_stalled, self.stall = bool(self.stall), stall() or ""
            if bool(self.stall) == was_stalled:
                continue
            if self.stall:
                log.error("worker not serving: %s", self.stall)
            else:
                log.warning("worker serving again: the stalled step finished")
            await self._publish()

    async def _publish(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.is_serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in self.SERVICES:
            await self.servicer.set(service, status)
