"""Requests held while their model has no serving worker: scale from zero that loses none.

A model scaled to zero (or whose every worker is restarting) stays routable: a request that finds no
serving replica waits here, bounded by a count, the bytes of the bodies held and a wake deadline,
until one serves, then goes on as any other; past a bound, or the deadline, it is answered 503 with
Retry-After. The requests held are the demand that wakes the model: `kembed_gateway_held_requests`
(with the model's label behind a several-model endpoint) is what the operator scales 0 -> 1 on. A
worker serves only once its self-check has passed (the worker opens its port after it), so no held
request is answered by one that has not.
"""

from __future__ import annotations

import asyncio
import math

from kembed.gateway.config import GatewayConfig
from kembed.gateway.errors import Unavailable
from kembed.gateway.metrics import GatewayMetrics
from kembed.gateway.pool.workers import WorkerPool

# How often a held request looks whether a worker serves: the pool probes every 0.25 s while none
# does (workers.UNREADY_PROBE_S), so a held request goes on within ~0.3 s of a worker's first answer.
POLL_S = 0.05


class Hold:
    """The held requests of one model, and their bounds (GatewayConfig.max_held_*, wake_timeout_s)."""

    def __init__(self, config: GatewayConfig, pool: WorkerPool, metrics: GatewayMetrics) -> None:
        self._config = config
        self._pool = pool
        self._metrics = metrics
        self.num_held = 0  # only touched on the event loop
        self.num_bytes = 0

    @property
    def is_holding(self) -> bool:
        """Whether a request with no serving worker is held (else refused at once, as before)."""
        return self._config.max_held_requests > 0

    async def wait(self, num_bytes: int) -> None:
        """Return once a worker serves: at once if one does or nothing is held; else after holding
        the request, or Unavailable (503, Retry-After) past a bound or the wake deadline."""
        if not self.is_holding or self._pool.is_ready():
            return
        config = self._config
        retry_after_s = max(1, math.ceil(config.wake_timeout_s / 4))
        if self.num_held >= config.max_held_requests or self.num_bytes + num_bytes > config.max_held_bytes:
            self._metrics.hold_refusals.labels("full").inc()
            raise Unavailable(
                f"the model has no serving worker yet and {self.num_held} requests "
                f"({self.num_bytes} bytes) are already held for it, the limit; retry later",
                retry_after_s=retry_after_s,
            )
        self.num_held += 1
        self.num_bytes += num_bytes
        self._metrics.held_requests.inc()
        self._metrics.holds.inc()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + config.wake_timeout_s
        try:
            while not self._pool.is_ready():
                if loop.time() >= deadline:
                    self._metrics.hold_refusals.labels("expired").inc()
                    raise Unavailable(
                        f"the model has no serving worker: it was woken and none served within "
                        f"{config.wake_timeout_s:g} s; retry later",
                        retry_after_s=retry_after_s,
                    )
                await asyncio.sleep(POLL_S)
        finally:
            self.num_held -= 1
            self.num_bytes -= num_bytes
            self._metrics.held_requests.dec()
