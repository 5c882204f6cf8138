"""Bucket table, padded staging and the lazy capture policy: the CUDA-graph bookkeeping, on the CPU."""

import numpy as np
import pytest

from kembed.worker.buckets import Bucket, BucketTable, token_sizes
from kembed.worker.engine.graphs import CAPTURE, COLD, DISABLED, FULL, REPLAY, UNCAPTURABLE, CapturePolicy
from kembed.worker.engine.staging import pad_batch


def test_token_sizes_step_64_up_to_1024_then_256():
    sizes = token_sizes(3000)
    assert sizes[:3] == [64, 128, 192] and 1024 in sizes and 1088 not in sizes
    assert sizes[sizes.index(1024) + 1] == 1280 and sizes[-1] == 3072


@pytest.mark.parametrize(
    ("num_seqs", "num_tokens", "expected"),
    [
        (1, 1, Bucket(1, 64)),
        (1, 64, Bucket(1, 64)),
        (3, 65, Bucket(4, 128)),
        (17, 1025, Bucket(32, 1280)),
        (256, 8192, Bucket(256, 8192)),
    ],
    ids=["smallest", "exact", "round-up", "coarse-step", "largest"],
)
def test_lookup_rounds_up_to_the_smallest_holding_bucket(num_seqs, num_tokens, expected):
    assert BucketTable(max_tokens=8192, max_seqs=256).lookup(num_seqs, num_tokens) == expected


def test_batches_beyond_the_table_have_no_bucket():
    table = BucketTable(max_tokens=1024, max_seqs=16)
    assert table.lookup(17, 100) is None and table.lookup(1, 1025) is None


def test_bucket_parses_from_its_command_line_form():
    assert Bucket.parse("8x512") == Bucket(8, 512) and str(Bucket(8, 512)) == "8x512"


def test_padding_goes_to_one_extra_sequence_slot_and_later_slots_are_empty():
    lengths = np.array([3, 2], np.int32)
    batch = pad_batch(np.arange(1, 6, dtype=np.int32), lengths, None, Bucket(4, 8))
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 8, 8, 8]  # real, real, padding, empty, empty
    assert batch.input_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert batch.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert batch.seq_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert batch.is_bucketed


def test_first_hit_is_cold_second_captures_then_replays():
    policy = CapturePolicy(max_graphs=8)
    bucket = Bucket(1, 64)
    assert [policy.decide(bucket) for _ in range(2)] == [COLD, CAPTURE]
    policy.captured(bucket)
    assert policy.decide(bucket) == REPLAY
    assert policy.states[bucket].hits == 3 and policy.eager_reasons[COLD] == 1


def test_past_the_graph_cap_buckets_stay_eager():
    policy = CapturePolicy(max_graphs=1)
    a, b = Bucket(1, 64), Bucket(2, 64)
    policy.decide(a)
    assert policy.decide(a) == CAPTURE
    policy.captured(a)
    policy.decide(b)
    assert policy.decide(b) == FULL and policy.eager_reasons[FULL] == 1


def test_disabled_graphs_and_oversized_batches_are_counted_eager():
    policy = CapturePolicy(max_graphs=8, is_enabled=False)
    assert [policy.decide(Bucket(1, 64)) for _ in range(3)] == [DISABLED] * 3
    assert policy.decide(None) == UNCAPTURABLE
