"""Admission by tokens: the gateway takes on only the work its workers can finish in time.

Every admitted request's tokens count as outstanding until it is answered. Requests are served
round robin (the gateway's RPC windows take one chunk of each waiting request in turn, a worker's
batches one sequence of each), so a new request of n tokens is done once it and, of each request
in flight, at most max(n, one chunk) tokens more have been served: its `ahead` work. It is refused
at once (429, `Overloaded`) when that work would
- pass what the serving workers' queues take together (each worker's `max_queued_tokens`, from its
  Info); or
- take longer than `max_queue_wait_s` (or its own deadline, if that is sooner) at the rate the
  workers have been finishing tokens lately: it would time out, and take capacity from requests
  that will not. Until this process has measured that rate (a busy window of 0.5 s and a chunk's
  worth of tokens), the rate the serving workers report for their devices stands in for it: a
  gateway that has served nothing yet, or only queries, admitted a burst by the queues' capacity
  alone (300 clients at once, 63-68 requests of 1,032 tokens admitted in the first 0.2 s
  by one CPU worker's 65,536, answered after up to 42 s against a 10 s bound, 38-57 of them 504).
A query behind a 2048-text request is thus admitted (one chunk of it is ahead), a second such
request is not. With two classes (the workers serve interactive work before bulk, docs/scheduling.md)
an interactive request's `ahead` is the interactive work only, and a bulk request's is all the
interactive work plus the bulk served in turn with it; bulk is refused once that passes
`bulk_share` of the queues' capacity, so queries still get in when indexing fills the fleet.
A request is admitted on an estimate of its tokens from its characters, before it is tokenized, and
the estimate is then replaced by the count: under overload the gateway refuses at once
instead of first tokenizing what it will refuse (its CPU is then the workers' to use, or the next
admitted request's). Work already admitted is never refused, so under a sustained 10x overload the
admitted requests are answered within their deadline and the rest are told at once to come back.

What can never finish in time is refused apart: a request whose tokens, at the rate the serving
workers' devices have (each worker measures its own and reports it with its health), would take
longer than the request's deadline is answered 413 naming that rate and how many tokens would fit,
idle gateway or not (`infeasible`), rather than admitted to run into a 504 a minute later while
every other request waits behind it. On the estimate, it is refused only when three quarters of
it would not fit (prose runs 4-5 characters a token, so the estimate may be a quarter high); once
tokenized, on its count. A request refused for the work ahead of it
(429) is told, in Retry-After, when that work should have drained.
Plain Python, mutated on the event loop only.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass


@dataclass
class DrainRate:
    """Tokens finished per second, averaged over windows of `window_s` in which work was outstanding
    (idle time does not count against the rate), smoothed with weight `alpha` for the newest window.
    A window also holds at least `min_tokens` (a chunk's worth): chunks finish in lumps, and a window
    in which only queries finished while the chunks of an indexing job were still running would read
    as the workers' rate collapsing (seen: 616 tokens/s, refusing bulk as if it had to wait 43 s)."""

    window_s: float = 0.5
    alpha: float = 0.5
    min_tokens: int = 0
    tokens_per_s: float = math.nan  # unknown until a busy window has ended
    _window_started: float = math.nan
    _window_tokens: int = 0

    def finished(self, num_tokens: int, now: float) -> None:
        if math.isnan(self._window_started):  # opens a window: its tokens were drained before it
            self._window_started = now
            return
        self._window_tokens += num_tokens
        elapsed = now - self._window_started
        if elapsed >= self.window_s and self._window_tokens >= self.min_tokens:
            rate = self._window_tokens / elapsed
            is_first = math.isnan(self.tokens_per_s)
            self.tokens_per_s = rate if is_first else self.alpha * rate + (1 - self.alpha) * self.tokens_per_s
            self._window_started, self._window_tokens = now, 0

    def idle(self) -> None:
        """Nothing is outstanding: the next window starts with the next work, not now."""
        self._window_started, self._window_tokens = math.nan, 0


class Admission:
    """Outstanding tokens of this gateway process, per request and class, and the rule that admits
    more. `quantum_tokens`: what each other request gets served per turn at least (the chunk size);
    `bulk_share`: the share of the workers' queues bulk requests may fill."""

    def __init__(self, max_queue_wait_s: float, quantum_tokens: int = 0, bulk_share: float = 1.0) -> None:
        self.max_queue_wait_s = max_queue_wait_s
        self.quantum_tokens = quantum_tokens
        self.bulk_share = bulk_share
        self.outstanding_tokens = 0
        # tokens of each request in flight -> how many, per class (is_bulk)
        self._sizes: dict[bool, Counter[int]] = {False: Counter(), True: Counter()}
        self.rate = DrainRate(min_tokens=quantum_tokens)

    def ahead(self, num_tokens: int, *, is_bulk: bool = False) -> int:
        """Tokens of the requests in flight served before `num_tokens` more are done: of its own
        class round robin, and for bulk all the interactive work too (served first)."""
        share = max(num_tokens, self.quantum_tokens)
        ahead = sum(min(size, share) * count for size, count in self._sizes[is_bulk].items())
        if is_bulk:
            ahead += sum(size * count for size, count in self._sizes[False].items())
        return ahead

    @staticmethod
    def infeasible(
        num_tokens: int, tokens_per_s: float, deadline_s: float, *, share: float = 1.0
    ) -> str | None:
        """Why a request of `num_tokens` can never be answered within `deadline_s` by workers serving
        `tokens_per_s` together (0: not known, no limit), or None; with `share`, only if that share
        of its tokens could not be either (an estimate's margin)."""
        if tokens_per_s <= 0 or num_tokens * share <= tokens_per_s * deadline_s:
            return None
        most = int(tokens_per_s * deadline_s / 2)  # half: room for the work of others beside it
        return (
            f"this request holds ~{num_tokens} tokens; the serving workers embed "
            f"{tokens_per_s:.0f} tokens/s together, so it would take ~{num_tokens / tokens_per_s:.0f} s, "
            f"past its {deadline_s:g} s deadline: send at most ~{most} tokens per request"
        )

    def tokens_per_s(self, device_rate: float = 0.0) -> float:
        """The rate the wait rule counts on: this process's recent drain rate, else `device_rate`
        (the serving workers' own measure of their devices; 0: not known either)."""
        rate = self.rate.tokens_per_s
        return rate if rate > 0 else device_rate

    def retry_after_s(
        self, num_tokens: int, *, is_bulk: bool = False, device_rate: float = 0.0
    ) -> int | None:
        """Seconds until the work ahead of a refused request should have drained enough for it to be
        admitted (at the rate `tokens_per_s` gives), at least 1, at most 60; None if no rate is known."""
        rate = self.tokens_per_s(device_rate)
        if not rate > 0:
            return None
        held = self.ahead(num_tokens, is_bulk=is_bulk) + num_tokens
        return max(1, min(60, math.ceil(held / rate - self.max_queue_wait_s)))

    def refusal(
        self,
        num_tokens: int,
        capacity_tokens: int,
        *,
        is_bulk: bool = False,
        device_rate: float = 0.0,
        deadline_s: float = math.inf,
    ) -> str | None:
        """Why a request of `num_tokens` must be refused now, or None to admit it. `capacity_tokens`:
        what the serving workers' queues hold together (0: unknown, no cap); `device_rate`: the
        serving workers' devices' tokens/s, counted on until a drain rate is measured; `deadline_s`:
        the time the request has left, if sooner than `max_queue_wait_s`."""
        if self.outstanding_tokens == 0:
            return None  # an idle gateway takes anything a worker would (the worker checks the size)
        held = self.ahead(num_tokens, is_bulk=is_bulk) + num_tokens
        if is_bulk:
            capacity_tokens = int(capacity_tokens * self.bulk_share)
        kind = "bulk request" if is_bulk else "request"
        if capacity_tokens and held > capacity_tokens:
            share = f" ({self.bulk_share:g} of the queues, the rest kept for queries)" if is_bulk else ""
            return (
                f"{self.outstanding_tokens} tokens are in flight; served in turn with them, this {kind} "
                f"of {num_tokens} tokens would pass the {capacity_tokens} the workers' queues hold{share}"
            )
        rate = self.tokens_per_s(device_rate)
        bound_s = min(self.max_queue_wait_s, deadline_s)
        if rate > 0 and held / rate > bound_s:
            measured = "recent" if self.rate.tokens_per_s > 0 else "devices'"
            return (
                f"{self.outstanding_tokens} tokens are in flight; served in turn with them, this {kind} "
                f"would take {held / rate:.1f} s at the workers' {measured} {rate:.0f} tokens/s, "
                f"past {bound_s:g} s"
            )
        return None

    def admit(self, num_tokens: int, *, is_bulk: bool = False) -> None:
        self.outstanding_tokens += num_tokens
        self._sizes[is_bulk][num_tokens] += 1

    def resize(self, old: int, new: int, *, was_bulk: bool = False, is_bulk: bool = False) -> None:
        """An admitted request's estimate (see `estimate_tokens`) and class replaced by its real
        token count and the class that count gives."""
        self.outstanding_tokens += new - old
        sizes = self._sizes[was_bulk]
        sizes[old] -= 1
        if not sizes[old]:
            del sizes[old]
        self._sizes[is_bulk][new] += 1

    def drained(self, num_tokens: int, now: float) -> None:
        """A chunk of `num_tokens` came back answered: the drain rate counts chunks, not requests,
        so that a large request served in turn with others is credited as it goes."""
        self.rate.finished(num_tokens, now)

    def release(self, num_tokens: int, *, is_bulk: bool = False) -> None:
        """A request ended, answered or not."""
        self.outstanding_tokens -= num_tokens
        sizes = self._sizes[is_bulk]
        sizes[num_tokens] -= 1
        if not sizes[num_tokens]:
            del sizes[num_tokens]
        if self.outstanding_tokens == 0:
            self.rate.idle()


# Characters per token of the estimate: ~4 for English with the tokenizers served (BERT WordPiece,
# XLM-R SentencePiece, Qwen's byte-level BPE); CJK text has fewer, long words more.
CHARS_PER_TOKEN = 4


def estimate_tokens(lengths: list[int], max_length: int | None, *, specials: int = 2) -> int:
    """Tokens a request of texts of `lengths` characters likely holds: each ~len / CHARS_PER_TOKEN
    plus its special tokens, at most `max_length` (truncation) where one applies."""
    cap = max_length or 2**31 - 1
    return sum(min(n // CHARS_PER_TOKEN + specials, cap) for n in lengths)
