"""What the scheduler tells of its work (`SchedulerHooks`): plain callbacks, so that the scheduler imports
no metrics library; worker/metrics.py binds them to its histograms and counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _ignore(*_: object) -> None:
    pass


@dataclass(frozen=True)
class SchedulerHooks:
    """Plain callbacks for what the scheduler sees (the metrics; the scheduler imports none). They run
    on the event loop and must be cheap. Durations are in seconds."""

    # per launched batch: (num_seqs, num_tokens, num_bulk_tokens), the last the bulk class's share
    batch_launched: Callable[[int, int, int], None] = _ignore
    # (seconds, class, count): `count` requests of a class waited this long from admission to the
    # launch of their first batch ("interactive" or "bulk")
    queue_waited: Callable[[float, str, int], None] = _ignore
    batch_finished: Callable[[float], None] = _ignore  # per batch: launch to rows on the host
    # per batch, batch_finished split in four (seconds): packing on the loop; the step's own CPU work
    # (staging, copy, the graph launch), after a hand-off to the launcher thread unless launched from
    # the loop; device time plus the waiter's copy of the rows; the waiter's hand-off back to the loop
    batch_stages: Callable[[float, float, float, float], None] = _ignore
    # (seconds, class, count): `count` requests took this long from admission to answer (or failure)
    request_finished: Callable[[float, str, int], None] = _ignore
