"""Admission by tokens: the gateway takes on only the work its workers can finish in time.

Every admitted request's tokens count as outstanding until it is answered. A request is refused at
once (429, `Overloaded`) when admitting it would
- hold more tokens than the serving workers' queues take together (each worker's `max_queued_tokens`,
  from its Info): past that a worker refuses anyway, and chunks would only queue in front of it; or
- make it wait, behind the work already admitted, longer than `max_queue_wait_s` at the rate the
  workers have been finishing tokens lately: it would time out, and take capacity from requests that
  will not.
Work already admitted is never refused, so under a sustained 10x overload the admitted requests are
answered within their deadline and the rest are told at once to come back. Plain Python, mutated on
the event loop only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class DrainRate:
    """Tokens finished per second, averaged over windows of `window_s` in which work was outstanding
    (idle time does not count against the rate), smoothed with weight `alpha` for the newest window."""

    window_s: float = 0.5
    alpha: float = 0.5
    tokens_per_s: float = math.nan  # unknown until a busy window has ended
    _window_started: float = math.nan
    _window_tokens: int = 0

    def finished(self, num_tokens: int, now: float) -> None:
        if math.isnan(self._window_started):  # opens a window: its tokens were drained before it
            self._window_started = now
            return
        self._window_tokens += num_tokens
        elapsed = now - self._window_started
        if elapsed >= self.window_s:
            rate = self._window_tokens / elapsed
            is_first = math.isnan(self.tokens_per_s)
            self.tokens_per_s = rate if is_first else self.alpha * rate + (1 - self.alpha) * self.tokens_per_s
            self._window_started, self._window_tokens = now, 0

    def idle(self) -> None:
        """Nothing is outstanding: the next window starts with the next work, not now."""
        self._window_started, self._window_tokens = math.nan, 0


class Admission:
    """Outstanding tokens of this gateway process, and the rule that admits more."""

    def __init__(self, max_queue_wait_s: float) -> None:
        self.max_queue_wait_s = max_queue_wait_s
        self.outstanding_tokens = 0
        self.rate = DrainRate()

    def refusal(self, num_tokens: int, capacity_tokens: int) -> str | None:
        """Why a request of `num_tokens` must be refused now, or None to admit it. `capacity_tokens`:
        what the serving workers' queues hold together (0: unknown, no cap)."""
        if self.outstanding_tokens == 0:
            return None  # an idle gateway takes anything a worker would (the worker checks the size)
        held = self.outstanding_tokens + num_tokens
        if capacity_tokens and held > capacity_tokens:
            return (
                f"{self.outstanding_tokens} tokens are in flight; {num_tokens} more would pass the "
                f"{capacity_tokens} the workers' queues hold"
            )
        rate = self.rate.tokens_per_s
        if rate > 0 and held / rate > self.max_queue_wait_s:
            return (
                f"{self.outstanding_tokens} tokens are in flight, {held / rate:.1f} s of work at the "
                f"workers' recent {rate:.0f} tokens/s; this request would wait past "
                f"{self.max_queue_wait_s:g} s"
            )
        return None

    def admit(self, num_tokens: int) -> None:
        self.outstanding_tokens += num_tokens

    def release(self, num_tokens: int, *, is_done: bool, now: float) -> None:
        """A request ended: answered (`is_done`, its tokens count toward the drain rate) or not."""
        self.outstanding_tokens -= num_tokens
        if is_done:
            self.rate.finished(num_tokens, now)
        if self.outstanding_tokens == 0:
            self.rate.idle()
