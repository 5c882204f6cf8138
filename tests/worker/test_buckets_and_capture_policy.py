"""Bucket table, padded staging and the lazy capture policy: the CUDA-graph bookkeeping, on the CPU."""

import numpy as np
import pytest
import torch

from kembed.worker.buckets import Bucket, BucketTable, token_sizes
from kembed.worker.engine.graphs import CAPTURE, REPLAY, CapturePolicy
from kembed.worker.engine.staging import InputLayout, max_input_bytes, neutral_batch, pad_batch
from kembed.worker.info import COLD, DISABLED, FULL, UNCAPTURABLE


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
    assert Bucket.parse_list(" 1x128, 8x512,1x128,") == (Bucket(1, 128), Bucket(8, 512))


@pytest.mark.parametrize("text", ["8", "x512", "0x64", "8x0", "8y512"], ids=str)
def test_a_malformed_bucket_is_refused(text):
    with pytest.raises(ValueError):
        Bucket.parse(text)


def test_padding_goes_to_one_extra_sequence_slot_and_later_slots_are_empty():
    lengths = np.array([3, 2], np.int32)
    batch = pad_batch(np.arange(1, 6, dtype=np.int32), lengths, np.array([0, 0, 0, 1, 1]), Bucket(4, 8))
    assert batch.cu_seqlens.tolist() == [0, 3, 5, 8, 8, 8]  # real, real, padding, empty, empty
    assert batch.input_ids.tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert batch.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert batch.token_type_ids.tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert batch.seq_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert batch.is_bucketed and batch.own_bucket == Bucket(4, 8)


def test_a_padded_batch_is_one_block_the_device_side_views_read_back():
    """pad_batch writes the five arrays into one block laid out for its bucket: the block is all a
    step copies, and the typed views the graphs read (here over a CPU tensor) decode the same arrays."""
    rng = np.random.default_rng(0)
    lengths = np.array([5, 1, 40], np.int32)
    ids = rng.integers(0, 30000, int(lengths.sum())).astype(np.int32)
    bucket = Bucket(4, 64)
    batch = pad_batch(ids, lengths, None, bucket, own_bucket=Bucket(4, 64))
    layout = InputLayout.of(bucket)
    assert batch.block.dtype == np.uint8 and batch.block.nbytes == layout.num_bytes == 32 * 64 + 4 * 6
    arrays = (batch.input_ids, batch.position_ids, batch.token_type_ids, batch.seq_ids, batch.cu_seqlens)
    assert all(np.shares_memory(a, batch.block) for a in arrays)
    views = layout.torch_views(torch.from_numpy(batch.block.copy()))
    for array, view in zip(arrays, views, strict=True):
        assert view.dtype == {np.int64: torch.int64, np.int32: torch.int32}[array.dtype.type]
        assert view.tolist() == array.tolist()
    assert layout.host_cu_seqlens(torch.from_numpy(batch.block)).tolist() == [0, 5, 6, 46, 64, 64]


def test_a_smaller_bucket_is_a_prefix_of_the_largest_block():
    assert max_input_bytes(1024, 16) == InputLayout(16, 1024).num_bytes
    assert InputLayout.of(Bucket(2, 128)).num_bytes < max_input_bytes(1024, 16)
    assert InputLayout.of(Bucket(2, 128)).cu_seqlens_offset % 8 == 0


def test_a_batch_padded_up_keeps_its_own_bucket_for_hit_counts():
    batch = pad_batch(np.ones(10, np.int32), np.array([10], np.int32), None, Bucket(4, 256), Bucket(1, 64))
    assert (batch.bucket, batch.own_bucket) == (Bucket(4, 256), Bucket(1, 64))
    assert batch.cu_seqlens.tolist() == [0, 10, 256, 256, 256, 256]
    assert batch.seq_ids[10:].tolist() == [1] * 246


def test_the_neutral_batch_is_one_padding_sequence_of_zeros():
    batch = neutral_batch(Bucket(4, 128))
    assert batch.cu_seqlens.tolist() == [0, 128, 128, 128, 128, 128]
    assert not batch.input_ids.any() and not batch.position_ids.any() and not batch.seq_ids.any()


def test_an_unbucketed_batch_is_laid_out_in_its_exact_shape():
    batch = pad_batch(np.ones(3000, np.int32), np.array([1000, 2000], np.int32), None, None)
    assert not batch.is_bucketed and batch.own_bucket is None and batch.bucket == Bucket(2, 3000)
    assert batch.cu_seqlens.tolist() == [0, 1000, 3000, 3000]


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
