"""The two classes of work a worker serves, and how a request is given one: plain Python.

INTERACTIVE is a search-time query, whose every millisecond shows; BULK is (re-)indexing, where only
throughput counts. `ClassPolicy` says how the two share the worker (queues.py applies it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# A request that does not say its class (a plain gRPC client) is INTERACTIVE when it is at most this
# large, BULK otherwise: a search-time query embeds one text, a handful with query expansion.
INTERACTIVE_MAX_SEQUENCES = 8
INTERACTIVE_MAX_TOKENS = 1024


class Priority(enum.IntEnum):
    """A request's class; the values are the gRPC contract's `Priority`."""

    UNSPECIFIED = 0
    INTERACTIVE = 1
    BULK = 2

    @property
    def label(self) -> str:
        """The metrics' `class` label: "interactive" or "bulk"."""
        return "bulk" if self == Priority.BULK else "interactive"


def classify(said: int, num_sequences: int, num_tokens: int) -> Priority:
    """The class of a request: what the caller said, else by size (see the constants above)."""
    if said in (Priority.INTERACTIVE, Priority.BULK):
        return Priority(said)
    if num_sequences <= INTERACTIVE_MAX_SEQUENCES and num_tokens <= INTERACTIVE_MAX_TOKENS:
        return Priority.INTERACTIVE
    return Priority.BULK


@dataclass(frozen=True)
class ClassPolicy:
    """How the two classes share the worker (queues.py; each field documented in WorkerConfig)."""

    is_enabled: bool = True
    bulk_step_tokens: int = 1024  # most bulk tokens in a step while interactive traffic is about
    interactive_hold_s: float = 1.0  # how long after an interactive request bulk steps stay short
    bulk_max_wait_s: float = 0.5  # bulk waiting this long without a launch goes first
    bulk_queue_share: float = 0.75  # bulk is admitted while the queue is below this share of its cap
    max_bulk_inflight: int = 0  # while interactive is about: steps in flight before a query-less one (0: any)
