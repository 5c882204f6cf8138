"""How one chunk is sent: tries on distinct replicas, a hedge when an attempt runs long, a re-send
when its replica is found stalled, and a replica tried before tried again once it serves again.

Embedding is idempotent, so a chunk may run on two replicas and the first answer be taken (Dean and
Barroso, "The Tail at Scale", 2013: a hedged request sent after the 95th-percentile latency cut
their p99.9 from 1800 to 74 ms for 2 % more load). Here an attempt is hedged once it has run past its
budget: `hedge_after_s` (bulk: `bulk_hedge_after_s`) or, if longer, `hedge_multiple` times what its
tokens and those queued ahead of it take at the replica's measured rate, so a loaded fleet, whose
every answer is slower, does not hedge everything. What bounds the extra load is a throttle, as
gRPC's retry throttling does: each chunk sent earns `max_hedge_share` of a hedge, a hedge spends a
whole one, at most `MAX_HEDGE_CREDIT` are saved; never more than one hedge per chunk. The loser is
cancelled (its `cancel` reaches the worker, which frees its place in the queue).

An attempt past its budget also makes its replica *suspect*: it gets no new work (unless no other
replica serves) and is probed at once (`WorkerPool.check`). A probe that answers SERVING clears it,
as does any answer from it; one that says NOT_SERVING (a worker that found itself stalled), or
none within `health_timeout_s` while another replica serves (a stopped process, a wedged loop),
marks it down, and every attempt outstanding on it is re-sent elsewhere at once, unthrottled: it is
a move, not a duplicate.

A replica a chunk was tried on is not tried again while it is the same serving spell (its attempt
failed, or it was found stalled, and it has not been heard SERVING since), but once it has come back
(marked down, then SERVING to a probe: `Target.num_rejoins` moved on) it is a replica like any other:
a chunk moved off a stopped worker whose second replica then dies goes back to the first if it runs
again (before, such a chunk failed 503 with a replica serving). A chunk with nowhere to go that was
sent before (its work admitted) waits for a replica to serve again, up to `max_rejoin_wait_s` and
within its deadline, rather than failing at once; a chunk's first attempt with none serving fails
at once (503). Each try again needs a probe's round trip, so a flapping fleet cannot make a chunk
spin. Mutated only on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc
import numpy as np

from kembed.gateway.config import GatewayConfig
from kembed.gateway.errors import Overloaded, Timeout, Unavailable
from kembed.gateway.metrics import GatewayMetrics
from kembed.gateway.pool.batches import Part
from kembed.proto import embedder_pb2 as pb

log = logging.getLogger(__name__)

MAX_HEDGE_CREDIT = 10.0  # hedges saved up at most: a burst of this many goes out at once


class Hedging:
    """The budget after which an attempt is hedged, and the throttle on hedges."""

    def __init__(self, config: GatewayConfig) -> None:
        self._after_s: dict[int, float] = {
            pb.PRIORITY_INTERACTIVE: config.hedge_after_s,
            pb.PRIORITY_BULK: config.bulk_hedge_after_s,
        }
        self._multiple = config.hedge_multiple
        self._share = config.max_hedge_share
        self.is_enabled = config.hedge_after_s > 0 and config.max_hedge_share > 0
        self._credit = MAX_HEDGE_CREDIT

    def budget_s(self, replica: Target, part: Part, ahead_tokens: int) -> float:
        """How long an attempt of `part` on `replica` may run before it is hedged: its class's floor,
        or `hedge_multiple` times what it and `ahead_tokens` take at the replica's rate."""
        floor = self._after_s.get(part.priority, self._after_s[pb.PRIORITY_INTERACTIVE])
        rate = float(replica.tokens_per_s)
        if rate > 0:
            return max(floor, self._multiple * (ahead_tokens + part.num_tokens) / rate)
        return floor

    def earn(self) -> None:
        """A chunk's first attempt was sent."""
        self._credit = min(MAX_HEDGE_CREDIT, self._credit + self._share)

    def refund(self) -> None:
        self._credit += 1

    def spend(self) -> bool:
        """Whether a hedge may go now (and it is counted as gone)."""
        if self._credit < 1:
            return False
        self._credit -= 1
        return True


class Target(Protocol):
    """What the attempts read and count of a replica (workers.py's `Replica`)."""

    address: str
    outstanding_tokens: int  # tokens sent and not yet answered
    queued_tokens: int  # tokens its worker last said were queued
    tokens_per_s: float  # its device's rate (0: not known)
    num_rejoins: int  # times it was heard SERVING after it was not: a new serving spell

    def down_signal(self) -> asyncio.Future[None]: ...


Replica = TypeVar("Replica", bound=Target)


@dataclass(eq=False, slots=True)
class _Attempt(Generic[Replica]):
    replica: Replica
    task: asyncio.Future[np.ndarray]  # the transport's request
    down: asyncio.Future[None]  # set once its replica is marked down
    hedge_at: float  # loop.time() past which it is overdue
    is_hedge: bool
    is_overdue: bool = False


class Attempts(Generic[Replica]):
    """The attempts of one chunk (see the module docstring); `run` returns its rows."""

    def __init__(
        self,
        part: Part,
        *,
        pick: Callable[[Callable[[Replica], bool]], Replica | None],
        request: Callable[[Replica], asyncio.Future[np.ndarray]],
        answered: Callable[[Replica, Part], None],
        hedging: Hedging,
        check: Callable[[Replica], None],
        mark_down: Callable[[Replica, str], None],
        wait_serving: Callable[[float], Awaitable[None]],
        translate: Callable[[grpc.aio.AioRpcError, str], Exception],
        metrics: GatewayMetrics,
        max_attempts: int,
        max_rejoin_wait_s: float,
    ) -> None:
        self._part = part
        self._pick, self._request, self._answered, self._hedging = pick, request, answered, hedging
        self._check, self._mark_down, self._translate = check, mark_down, translate
        self._wait_serving = wait_serving
        self._metrics = metrics
        self._max_attempts, self._max_rejoin_wait_s = max_attempts, max_rejoin_wait_s
        self._tried: dict[Replica, int] = {}  # each replica tried: its num_rejoins when last tried
        self._running: list[_Attempt[Replica]] = []
        self._is_hedged = False
        self._is_overloaded = False

    async def run(self) -> np.ndarray:
        try:
            return await self._race()
        finally:
            for attempt in list(self._running):  # the loser, or every attempt of a caller that gave up
                self._drop(attempt)

    async def _race(self) -> np.ndarray:
        loop = asyncio.get_running_loop()
        while True:
            if not self._running and not self._start(is_hedge=False):
                if self._is_overloaded:
                    raise Overloaded("every worker replica tried has a full queue; retry later")
                if not self._tried or not await self._rejoined(loop):
                    raise Unavailable("no worker replica is serving; retry later")
                continue
            waits: list[asyncio.Future[Any]] = [a.task for a in self._running]
            waits += [a.down for a in self._running]
            first = self._running[0]
            until = None
            if not self._is_hedged and len(self._running) == 1 and not first.is_overdue:
                until = first.hedge_at
            if not await first_of(waits, until, loop):  # the attempt ran past its budget
                self._overdue(first)
                continue
            for attempt in list(self._running):
                if attempt.task.done():
                    rows = self._settle(attempt)
                    if rows is not None:
                        return rows
                elif attempt.down.done():  # its replica was found stalled: moved elsewhere
                    self._drop(attempt)

    async def _rejoined(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether a replica serves again (any, heard SERVING after it was not) within
        `max_rejoin_wait_s` and the chunk's deadline; Timeout once the deadline has passed."""
        until = min(self._part.deadline, loop.time() + self._max_rejoin_wait_s)
        while loop.time() < until:
            await self._wait_serving(until)
            if self._pick(self._is_allowed) is not None:
                return True
        if self._part.deadline <= loop.time():
            raise Timeout("the request did not complete within its deadline")
        return False

    def _is_allowed(self, replica: Replica) -> bool:
        """Whether a new attempt may go to `replica`: not running one of this chunk, and either new
        to it (while distinct tries are left) or back since it was tried (a new serving spell)."""
        if any(attempt.replica is replica for attempt in self._running):
            return False
        tried_at = self._tried.get(replica)
        if tried_at is None:
            return len(self._tried) < self._max_attempts
        return replica.num_rejoins != tried_at

    def _start(self, *, is_hedge: bool) -> bool:
        """A new attempt on the best replica allowed; False if none is."""
        replica = self._pick(self._is_allowed)
        if replica is None:
            return False
        if self._part.deadline <= asyncio.get_running_loop().time():
            raise Timeout("the request did not complete within its deadline")
        if is_hedge:
            self._metrics.hedges.inc()
        elif self._tried:  # the previous replica refused the chunk, was down or stalled
            self._metrics.upstream_retries.inc()
        else:
            self._hedging.earn()
        self._tried[replica] = replica.num_rejoins
        ahead = max(replica.outstanding_tokens, replica.queued_tokens)
        hedge_at = asyncio.get_running_loop().time() + self._hedging.budget_s(replica, self._part, ahead)
        replica.outstanding_tokens += self._part.num_tokens  # so chunks sent this turn spread out
        task = self._request(replica)
        self._running.append(_Attempt(replica, task, replica.down_signal(), hedge_at, is_hedge))
        return True

    def _drop(self, attempt: _Attempt[Replica]) -> None:
        """No longer waited for (settled, or cancelled now): its tokens leave its replica's count."""
        self._running.remove(attempt)
        attempt.task.cancel()
        attempt.task.add_done_callback(_retrieve)  # a loser's own failure is not an error to log
        attempt.replica.outstanding_tokens -= self._part.num_tokens

    def _overdue(self, attempt: _Attempt[Replica]) -> None:
        """Its replica is suspect (probed now); a hedge goes to another if the throttle allows."""
        attempt.is_overdue = True
        self._check(attempt.replica)
        if self._hedging.is_enabled and self._hedging.spend():
            if self._start(is_hedge=True):
                self._is_hedged = True  # one hedge per chunk
            else:
                self._hedging.refund()  # no other replica to hedge on

    def _settle(self, attempt: _Attempt[Replica]) -> np.ndarray | None:
        """The finished attempt's rows, or None to wait for the others (or start another)."""
        self._drop(attempt)
        replica = attempt.replica
        try:
            rows = attempt.task.result()
        except asyncio.CancelledError:  # cancelled because its replica was marked down
            return None
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                self._mark_down(replica, f"UNAVAILABLE: {error.details()}")
                return None
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._is_overloaded = True
                return None
            raise self._translate(error, replica.address) from None
        self._answered(replica, self._part)
        if attempt.is_hedge:
            self._metrics.hedge_wins.inc()
        return rows


def _retrieve(task: asyncio.Future[np.ndarray]) -> None:
    if not task.cancelled():
        task.exception()


async def first_of(
    futures: list[asyncio.Future[Any]], until: float | None, loop: asyncio.AbstractEventLoop
) -> bool:
    """Wait until one of `futures` is done (True) or loop.time() reaches `until` (False): what
    asyncio.wait(FIRST_COMPLETED) does, without its sets, for the one or two futures of a chunk.
    A cancel of the caller always raises CancelledError (3.11's wait_for can lose one)."""
    if any(future.done() for future in futures):
        return True
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    for future in futures:
        future.add_done_callback(wake)
    timer = loop.call_at(until, wake) if until is not None else None
    try:
        await waiter
    finally:
        for future in futures:
            future.remove_done_callback(wake)
        if timer is not None:
            timer.cancel()
    return any(future.done() for future in futures)
