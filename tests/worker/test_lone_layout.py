"""A lone sequence's padded layout, copied from the one made for its shape, is the layout the general
path writes: every byte of the block, whatever the length, bucket or token types."""

import numpy as np
import pytest

from kembed.worker.buckets import Bucket
from kembed.worker.engine import staging
from kembed.worker.engine.staging import pad_batch


def _general(ids, lengths, types, bucket):
    """The block the general path writes for the same batch (pad_batch's own helper)."""
    layout = staging.InputLayout.of(bucket)
    block = np.empty(layout.num_bytes, dtype=np.uint8)
    staging._lay_out(ids, lengths, types, bucket, layout.numpy_views(block))
    return block


@pytest.mark.parametrize(
    ("length", "bucket", "has_types"),
    [(1, Bucket(1, 64), False), (64, Bucket(1, 64), False), (100, Bucket(1, 128), True),
     (300, Bucket(2, 320), False), (512, Bucket(1, 512), True)],
    ids=["one-token", "full-bucket", "pair-types", "padded-up-bucket", "largest"],
)  # fmt: skip
def test_a_lone_sequence_gets_the_general_layout(length, bucket, has_types):
    rng = np.random.default_rng(length)
    for _ in range(3):  # the layout is reused: later queries of the shape see none of earlier ones' ids
        ids = rng.integers(0, 250_000, length).astype(np.int32)
        types = rng.integers(0, 2, length) if has_types else None
        lengths = np.array([length], np.int32)
        batch = pad_batch(ids, lengths, types, bucket)
        assert batch.block.tobytes() == _general(ids, lengths, types, bucket).tobytes()
        assert batch.input_ids[:length].tolist() == ids.tolist() and batch.block.flags.writeable
        assert batch.cu_seqlens.tolist() == [0, length] + [bucket.num_tokens] * bucket.num_seqs


def test_larger_buckets_and_several_sequences_take_the_general_path():
    assert pad_batch(
        np.arange(600, dtype=np.int32), np.array([600], np.int32), None, Bucket(1, 640)
    ).block.flags.writeable
    before = staging._lone_layout.cache_info().currsize
    pad_batch(np.arange(600, dtype=np.int32), np.array([600], np.int32), None, Bucket(1, 640))
    pad_batch(np.arange(5, dtype=np.int32), np.array([2, 3], np.int32), None, Bucket(2, 64))
    assert staging._lone_layout.cache_info().currsize == before
