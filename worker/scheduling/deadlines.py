"""The deadlines of queued request groups: one timer for the earliest of them all, not one per request.

A group's requests may each carry a deadline (a data-port frame's `timeouts_ms`); the scheduler
watches each group at its earliest one. When the timer fires, every group whose earliest deadline has
passed gives up its late requests (`RequestGroup.expired`) to `on_expired`, and is watched again at
its next one. Plain Python on the event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable

import numpy as np

from kembed.worker.scheduling.groups import RequestGroup


class Deadlines:
    """Watches groups' deadlines; `on_expired(group, requests)` is told of the late requests."""

    def __init__(self, on_expired: Callable[[RequestGroup, np.ndarray], None]) -> None:
        self._on_expired = on_expired
        self._heap: list[tuple[float, int, RequestGroup]] = []  # (earliest deadline, tie-break, group)
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def watch(self, group: RequestGroup) -> None:
        """Watch `group` at its earliest deadline (perf_counter time; inf: none)."""
        if group.min_deadline == math.inf:
            return
        heapq.heappush(self._heap, (group.min_deadline, next(self._order), group))
        if self._heap[0][2] is group:  # the earliest now: the timer moves to it
            self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self.close()
        if self._heap:
            delay = max(0.0, self._heap[0][0] - time.perf_counter())
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = time.perf_counter()
        while self._heap and self._heap[0][0] <= now:
            _, _, group = heapq.heappop(self._heap)
            late = group.expired(now)
            if len(late):
                self._on_expired(group, late)
            if group.num_live and group.min_deadline < math.inf:
                heapq.heappush(self._heap, (group.min_deadline, next(self._order), group))
        self._arm()
