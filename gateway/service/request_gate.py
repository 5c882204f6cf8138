"""A request's way in: the concurrency cap and the deadline around its work, its class (the
`X-Kembed-Priority` header, else its size), and its hold on the token admission (admission.py),
first at its estimate, then at its token count once tokenized."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kembed.gateway.config import GatewayConfig
from kembed.gateway.errors import InvalidInput, Overloaded, PayloadTooLarge, Timeout
from kembed.gateway.metrics import GatewayMetrics
from kembed.gateway.pool.workers import WorkerPool
from kembed.gateway.service.admission import Admission
from kembed.proto import embedder_pb2 as pb

T = TypeVar("T")

PRIORITY_HEADER = "x-kembed-priority"
_SAID = {"interactive": pb.PRIORITY_INTERACTIVE, "bulk": pb.PRIORITY_BULK}


def said_priority(header: str | None) -> int:
    """The class a request's `X-Kembed-Priority` header asks for; unspecified when absent."""
    if header is None:
        return pb.PRIORITY_UNSPECIFIED
    said = _SAID.get(header.strip().lower())
    if said is None:
        raise InvalidInput(f"header X-Kembed-Priority must be `interactive` or `bulk`, got {header!r}")
    return said


class Admitted:
    """A request's hold on the admission: its estimate, and the class the estimate gives, until
    `settle` gives its token count and so its class."""

    def __init__(self, gate: RequestGate, said: int, num_inputs: int, estimate: int) -> None:
        self._gate = gate
        self._said = said
        self._num_inputs = num_inputs
        self.num_tokens = estimate
        self.priority = gate.classify(said, num_inputs, estimate)

    @property
    def is_bulk(self) -> bool:
        return self.priority == pb.PRIORITY_BULK

    def release(self) -> None:
        """The request ended, answered or not: its tokens leave the admission's count."""
        self._gate.admission.release(self.num_tokens, is_bulk=self.is_bulk)

    def settle(self, num_tokens: int) -> int:
        was_bulk = self.is_bulk
        self.priority = self._gate.classify(self._said, self._num_inputs, num_tokens)
        self._gate.admission.resize(self.num_tokens, num_tokens, was_bulk=was_bulk, is_bulk=self.is_bulk)
        self.num_tokens = num_tokens
        self._gate.check_feasible(num_tokens)  # released by the caller, at its count
        label = "bulk" if self.is_bulk else "interactive"
        self._gate.metrics.class_requests_of[label].inc(1)
        self._gate.metrics.class_tokens_of[label].inc(num_tokens)
        return num_tokens


class RequestGate:
    """What every request of the service passes: the concurrency cap, the deadline, its class and
    the token admission over the workers' queues and rate."""

    def __init__(self, config: GatewayConfig, pool: WorkerPool, metrics: GatewayMetrics) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self._num_in_flight = 0  # requests admitted and not finished; only touched on the event loop
        self.admission = Admission(
            min(config.max_queue_wait_s, config.request_timeout_s),
            quantum_tokens=config.chunk_tokens,
            bulk_share=config.bulk_queue_share,
        )
        pool.on_chunk_served = lambda num_tokens: self.admission.drained(num_tokens, time.monotonic())

    async def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()` admitted under the concurrency cap (429 at once above it) and the deadline (504)."""
        if self._num_in_flight >= self.config.max_concurrent_requests:
            raise Overloaded(
                f"the gateway is handling {self._num_in_flight} requests, its limit; retry later"
            )
        self._num_in_flight += 1
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                return await work()
        except TimeoutError:
            raise Timeout(
                f"the request did not complete within {self.config.request_timeout_s:g} s"
            ) from None
        finally:
            self._num_in_flight -= 1

    def classify(self, said: int, num_inputs: int, num_tokens: int) -> int:
        """A request's class: what its header said, else interactive up to the configured size."""
        config = self.config
        if not config.priority_classes:
            return pb.PRIORITY_INTERACTIVE
        if said != pb.PRIORITY_UNSPECIFIED:
            return said
        if num_inputs <= config.interactive_max_inputs and num_tokens <= config.interactive_max_tokens:
            return pb.PRIORITY_INTERACTIVE
        return pb.PRIORITY_BULK

    def admit(self, said: int, num_inputs: int, estimate: int, deadline: float = math.inf) -> Admitted:
        """The request held as outstanding until `Admitted.release`, first at its `estimate`
        (estimate_tokens), then at its token count once tokenized (`Admitted.settle`); or Overloaded
        (429) at once, before any tokenizing, if the workers cannot take it in time (admission.py).
        Its class (`said`, else by size) decides what it waits behind, and bulk is refused first;
        the work ahead of it must drain before `max_queue_wait_s` and its own `deadline` (loop time)."""
        admitted = Admitted(self, said, num_inputs, estimate)
        # An estimate may be high (5 characters a token where it takes 4): refused on it only if
        # three quarters of it cannot fit; what it let through is checked again once counted.
        self.check_feasible(estimate, share=0.75)
        device_rate = self.pool.tokens_per_s  # until this process has drained enough to measure
        reason = self.admission.refusal(
            estimate,
            self.pool.capacity_tokens,
            is_bulk=admitted.is_bulk,
            device_rate=device_rate,
            deadline_s=deadline - asyncio.get_running_loop().time(),
        )
        if reason is not None:
            retry_after_s = self.admission.retry_after_s(
                estimate, is_bulk=admitted.is_bulk, device_rate=device_rate
            )
            raise Overloaded(
                f"the workers are at capacity: {reason}; retry later", retry_after_s=retry_after_s
            )
        self.admission.admit(estimate, is_bulk=admitted.is_bulk)
        return admitted

    def check_feasible(self, num_tokens: int, *, share: float = 1.0) -> None:
        """PayloadTooLarge (413) if `num_tokens` (`share` of them) can never be served within the
        request's deadline at the serving workers' rate (admission.py)."""
        drained = self.admission.rate.tokens_per_s  # this process's recent rate; NaN until known
        rate = max(self.pool.tokens_per_s, drained if drained > 0 else 0.0)
        reason = self.admission.infeasible(num_tokens, rate, self.config.request_timeout_s, share=share)
        if reason is not None:
            raise PayloadTooLarge(reason)
