"""The graph smoke test: replay each captured bucket against an eager run on the same random inputs.

A rollout is only as safe as its graphs: a graph that bakes in a stale shape or reads a buffer it
should not gives wrong vectors silently. For each bucket this builds a random ragged batch that
lands exactly in it, runs it eagerly and by replay, and requires cosine >= `min_cosine` per row and
finite values everywhere.
"""

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from kembed.worker.buckets import Bucket
from kembed.worker.info import ModelInfo

# Tested when nothing is listed and nothing was captured yet (a first rollout with no prewarm list):
# a revision is never promoted on an empty check; these capture on the spot.
DEFAULT_BUCKETS = (Bucket(1, 64), Bucket(4, 256), Bucket(16, 1024))


@dataclass(frozen=True)
class SmokeResult:
    bucket: Bucket
    min_cosine: float  # worst row; 1.0 when the bucket cannot hold a real batch (skipped)
    has_nonfinite: bool
    passed: bool
    note: str = ""


class Comparing(Protocol):
    """What a smoke test asks of an engine."""

    info: ModelInfo

    def captured_buckets(self) -> list[Bucket]: ...

    def compare(
        self, token_ids: np.ndarray, lengths: np.ndarray
    ) -> tuple[Bucket, np.ndarray, np.ndarray]: ...


def random_batch(
    rng: np.random.Generator, bucket: Bucket, max_length: int, vocab_size: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """(token_ids int32, lengths int32) filling `bucket` exactly, or None if no real batch can."""
    num_seqs, num_tokens = bucket.num_seqs, bucket.num_tokens
    if num_tokens < num_seqs or num_tokens > num_seqs * max_length:
        return None
    lengths = 1 + rng.multinomial(num_tokens - num_seqs, np.full(num_seqs, 1 / num_seqs))
    # Move any excess past the model's longest sequence onto sequences with room (terminates: the
    # total fits, checked above).
    while (excess := int(np.maximum(lengths - max_length, 0).sum())) > 0:
        lengths = np.minimum(lengths, max_length)
        room = max_length - lengths
        lengths += np.minimum(rng.multinomial(excess, room / room.sum()), room)
        lengths[np.argmax(max_length - lengths)] += num_tokens - int(lengths.sum())
    token_ids = rng.integers(min(1000, vocab_size - 1), vocab_size, num_tokens, dtype=np.int64)
    return token_ids.astype(np.int32), lengths.astype(np.int32)


def smoke_test(
    engine: Comparing, buckets: list[Bucket], min_cosine: float, seed: int = 0
) -> list[SmokeResult]:
    """Results per bucket (every captured bucket when `buckets` is empty, DEFAULT_BUCKETS when none
    is captured either), in bucket order.
    `engine.compare(ids, lengths)` gives (bucket, reference rows, candidate rows): eager against
    graph replay on CUDA, unpadded against padded-to-bucket on the eager engine."""
    rng = np.random.default_rng(seed)
    info = engine.info
    results: list[SmokeResult] = []
    for bucket in sorted(buckets or engine.captured_buckets() or DEFAULT_BUCKETS):
        batch = random_batch(rng, bucket, info.max_sequence_length, info.vocab_size)
        if batch is None:
            results.append(SmokeResult(bucket, 1.0, False, True, "no real batch fits this bucket"))
            continue
        landed, eager, replayed = engine.compare(*batch)
        if landed != bucket:
            results.append(SmokeResult(bucket, 0.0, False, False, f"batch landed in {landed}"))
            continue
        has_nonfinite = not (np.isfinite(eager).all() and np.isfinite(replayed).all())
        norms = np.linalg.norm(eager, axis=1) * np.linalg.norm(replayed, axis=1)
        cosines = (eager * replayed).sum(1) / np.maximum(norms, 1e-30)
        worst = float(np.nan_to_num(cosines, nan=-1.0).min())
        results.append(SmokeResult(bucket, worst, has_nonfinite, worst >= min_cosine and not has_nonfinite))
    return results
