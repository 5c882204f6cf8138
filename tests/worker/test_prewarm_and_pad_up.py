"""Start-up prewarm and pad-up, on the CPU: which buckets are reachable, the order prewarm captures
them in, the budget that stops it, the smallest captured bucket a batch pads up to, and a serving
path that never captures once prewarm has run."""

import itertools
import random

import numpy as np
import pytest

from kembed.worker.buckets import Bucket, BucketTable, PadUpTable
from kembed.worker.engine.graphs import (
    CAPTURE,
    REPLAY,
    CapturePolicy,
    capture_in_order,
)
from kembed.worker.info import COLD, FULL, UNCOVERED

TABLES = {
    "minilm": BucketTable(2048, 256, max_batch_tokens=2048),
    "bge-m3": BucketTable(8194, 256, max_batch_tokens=2048),
    "small": BucketTable(512, 16, max_batch_tokens=300),
    "qwen3-32k-budget-8k": BucketTable(32768, 100, max_batch_tokens=8192),
}


def holds(bucket: Bucket, num_seqs: int, num_tokens: int) -> bool:
    return bucket.num_seqs >= num_seqs and bucket.num_tokens >= num_tokens


def reachable_batches(table: BucketTable):
    """Every grid cell a scheduled batch can land in, as the largest batch landing there."""
    for bucket in table.reachable():
        yield bucket.num_seqs, bucket.num_tokens, bucket


class FakeClock:
    """Each capture takes `step` seconds."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


def capturing(policy: CapturePolicy, clock: FakeClock | None = None, log: list | None = None):
    def capture(bucket: Bucket) -> None:
        if clock is not None:
            clock.now += clock.step
        if log is not None:
            log.append(bucket)
        policy.captured(bucket)

    return capture


def batch_shape(table: BucketTable, rng: np.random.Generator, max_seqs: int) -> tuple[int, int]:
    """(sequences, tokens) of a random batch the scheduler could form: one sequence up to the table's
    longest, several within the batch budget."""
    num_seqs = int(rng.integers(1, min(table.max_seqs, max_seqs) + 1))
    budget = table.max_tokens if num_seqs == 1 else table.max_batch_tokens
    return num_seqs, int(rng.integers(num_seqs, max(num_seqs, budget) + 1))


@pytest.mark.parametrize("name", TABLES, ids=list(TABLES))
def test_reachable_buckets_are_every_one_a_scheduled_batch_lands_in(name):
    table = TABLES[name]
    reachable = set(table.reachable())
    rng = np.random.default_rng(0)
    for _ in range(2000):
        num_seqs, num_tokens = batch_shape(table, rng, max_seqs=300)
        own = table.lookup(num_seqs, num_tokens)
        if own is not None and (num_seqs == 1 or num_tokens <= table.max_batch_tokens):
            assert own in reachable, (num_seqs, num_tokens)
    # several sequences never pass the budget; a bucket with more sequences than tokens can be reached
    assert all(b.num_seqs == 1 or b.num_tokens <= table.max_batch_tokens for b in reachable)
    assert set(table.all()) >= reachable


def test_a_bucket_of_more_sequences_than_tokens_is_reachable():
    table = BucketTable(2048, 256)
    assert table.lookup(129, 129) == Bucket(256, 192) and Bucket(256, 192) in table.reachable()


@pytest.mark.parametrize("name", TABLES, ids=list(TABLES))
def test_with_the_cover_captured_every_reachable_batch_pads_up_at_most_twice_its_bucket(name):
    table = TABLES[name]
    cover = table.cover()
    assert set(cover) <= set(table.reachable()) and len(cover) < len(table.reachable())
    pad_up = PadUpTable(table, cover)
    for num_seqs, num_tokens, own in reachable_batches(table):
        padded = pad_up.lookup(num_seqs, num_tokens)
        assert padded is not None and holds(padded, num_seqs, num_tokens), own
        assert padded.num_tokens <= 2 * own.num_tokens, (own, padded)


@pytest.mark.parametrize("name", TABLES, ids=list(TABLES))
def test_prewarm_order_is_hot_first_then_the_cover_then_the_rest_smallest_first(name):
    table = TABLES[name]
    hot = [Bucket(8, 512), Bucket(1, 128), Bucket(4096, 64)]  # the last fits no table here
    order = table.prewarm_order(hot)
    fitting_hot = [b for b in hot if table.fits(b)]
    assert order[: len(fitting_hot)] == fitting_hot
    cover = [b for b in table.cover() if b not in fitting_hot]
    assert order[len(fitting_hot) : len(fitting_hot) + len(cover)] == cover
    rest = order[len(fitting_hot) + len(cover) :]
    assert rest == sorted(rest, key=lambda b: (b.num_tokens, b.num_seqs))
    assert len(order) == len(set(order)) and set(order) == set(table.reachable()) | set(fitting_hot)


@pytest.mark.parametrize("seed", range(20), ids=lambda s: f"seed{s}")
def test_pad_up_picks_the_smallest_captured_bucket_that_holds_the_batch(seed):
    table = TABLES["small"]
    rnd = random.Random(seed)
    grid = table.all()
    off_grid = [Bucket(3, 100), Bucket(12, 300), Bucket(5, 64), Bucket(1, 30)]
    captured = rnd.sample(grid, rnd.randint(0, len(grid))) + rnd.sample(off_grid, 2)
    pad_up = PadUpTable(table, captured)
    for num_seqs, num_tokens in itertools.product(range(1, 17), range(1, 513, 7)):
        own = table.lookup(num_seqs, num_tokens)
        # every captured bucket holding the batch's whole cell holds the batch
        holders = [b for b in captured if holds(b, own.num_seqs, own.num_tokens)]
        expected = min(holders, key=lambda b: (b.num_tokens, b.num_seqs), default=None)
        assert pad_up.lookup(num_seqs, num_tokens) == expected, (num_seqs, num_tokens)


def test_pad_up_answers_nothing_beyond_the_table_or_with_nothing_captured():
    table = TABLES["small"]
    assert PadUpTable(table).lookup(1, 10) is None
    assert PadUpTable(table, table.all()).lookup(17, 100) is None
    assert PadUpTable(table, table.all()).lookup(1, 513) is None


def test_lazy_policy_without_prewarm_still_runs_cold_then_captures():
    policy = CapturePolicy(max_graphs=8, table=TABLES["small"])
    bucket = Bucket(2, 128)
    assert policy.serving_bucket(bucket, 2, 100) == bucket  # no pad-up before prewarm
    assert [policy.decide(bucket) for _ in range(2)] == [COLD, CAPTURE]
    assert policy.num_serving_captures == 1


@pytest.mark.parametrize("name", TABLES, ids=list(TABLES))
def test_after_prewarm_of_all_the_serving_path_only_replays(name):
    table = TABLES[name]
    policy = CapturePolicy(max_graphs=1024, table=table)
    report = policy.prewarm(table.prewarm_order(), capturing(policy), max_seconds=60)
    assert not report.is_cut_short and report.num_captured == len(table.reachable())
    rng = np.random.default_rng(1)
    for _ in range(300):
        num_seqs, num_tokens = batch_shape(table, rng, max_seqs=64)
        own = table.lookup(num_seqs, num_tokens)
        run = policy.serving_bucket(own, num_seqs, num_tokens)
        assert run == own  # everything reachable is captured: no padding beyond the own bucket
        assert policy.decide(own, run) == REPLAY
    assert sum(policy.eager_counts().values()) == 0 and policy.num_serving_captures == 0


def test_after_prewarm_a_covered_batch_pads_up_and_an_uncovered_one_runs_eagerly_and_is_deferred():
    table = TABLES["small"]
    policy = CapturePolicy(max_graphs=64, table=table)
    policy.prewarm([Bucket(4, 256)], capturing(policy), max_seconds=60)
    own = table.lookup(3, 100)
    assert own == Bucket(4, 128)
    run = policy.serving_bucket(own, 3, 100)
    assert run == Bucket(4, 256) and policy.decide(own, run) == REPLAY
    assert policy.states[own].hits == 1  # the hit counts on the batch's own bucket
    uncovered = table.lookup(8, 300)
    assert policy.serving_bucket(uncovered, 8, 300) == uncovered
    assert [policy.decide(uncovered) for _ in range(3)] == [UNCOVERED] * 3  # never a capture
    assert list(policy.deferred) == [uncovered] and policy.num_serving_captures == 0
    captured = []
    report = policy.capture_deferred(capturing(policy, log=captured), max_seconds=1)
    assert report.num_captured == 1 and captured == [uncovered] and not policy.deferred
    assert policy.decide(uncovered, policy.serving_bucket(uncovered, 8, 300)) == REPLAY


def test_the_budget_stops_prewarm_and_the_rest_is_captured_when_idle():
    table = TABLES["small"]
    policy = CapturePolicy(max_graphs=1024, table=table)
    clock, order = FakeClock(step=1.0), table.prewarm_order()
    report = policy.prewarm(order, capturing(policy, clock), max_seconds=2.5, clock=clock)
    # captures start at t = 0, 1 and 2; none starts at 3 >= 2.5
    assert (report.num_captured, report.stopped_by, report.is_cut_short) == (3, "budget", True)
    assert report.seconds == 3.0 and report.num_planned == len(order)
    assert policy.backlog == order[3:] and policy.is_prewarmed
    captured = []
    later = policy.capture_deferred(capturing(policy, clock, captured), max_seconds=1.5, clock=clock)
    assert later.num_captured == 2 and captured == order[3:5] and policy.backlog == order[5:]


def test_the_graph_cap_stops_prewarm_and_says_so():
    table = TABLES["small"]
    policy = CapturePolicy(max_graphs=2, table=table)
    report = policy.prewarm(table.prewarm_order(), capturing(policy), max_seconds=60)
    assert (report.num_captured, report.stopped_by) == (2, "max_graphs")
    uncovered = table.lookup(16, 512)
    assert policy.decide(uncovered) == FULL and not policy.deferred  # nothing can be captured later


def test_buckets_already_captured_are_counted_not_captured_again():
    policy = CapturePolicy(max_graphs=8, table=TABLES["small"])
    policy.captured(Bucket(1, 64))
    captured = []
    report = capture_in_order([Bucket(1, 64), Bucket(2, 64)], capturing(policy, log=captured), policy, 60)
    assert (report.num_captured, report.num_already, captured) == (1, 1, [Bucket(2, 64)])
