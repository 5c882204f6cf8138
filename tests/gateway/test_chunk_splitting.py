"""A request's sequences split into ordered chunks within the token and sequence limits."""

from __future__ import annotations

import numpy as np
import pytest

from kembed.gateway.pool.batches import Chunk, pack, split_into_chunks


@pytest.mark.parametrize(
    ("lengths", "max_tokens", "max_sequences", "expected"),
    [
        ([], 10, 4, []),
        ([3], 10, 4, [Chunk(0, 1, 3)]),
        ([4, 4, 4], 8, 4, [Chunk(0, 2, 8), Chunk(2, 3, 4)]),
        ([4, 4, 4], 12, 4, [Chunk(0, 3, 12)]),
        ([1] * 5, 100, 2, [Chunk(0, 2, 2), Chunk(2, 4, 2), Chunk(4, 5, 1)]),
        ([2, 20, 2], 10, 4, [Chunk(0, 1, 2), Chunk(1, 2, 20), Chunk(2, 3, 2)]),
        ([20], 10, 4, [Chunk(0, 1, 20)]),
    ],
    ids=[
        "no-sequences",
        "one-small",
        "token-limit-splits",
        "exactly-at-token-limit",
        "sequence-limit-splits",
        "overlong-sequence-travels-alone",
        "single-overlong",
    ],
)
def test_chunks_respect_limits_in_order(lengths, max_tokens, max_sequences, expected):
    assert split_into_chunks(lengths, max_tokens=max_tokens, max_sequences=max_sequences) == expected


def test_chunks_cover_every_sequence_once_within_limits():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 257, size=1000).tolist()
    chunks = split_into_chunks(lengths, max_tokens=4096, max_sequences=64)
    assert [c.start for c in chunks] == [0] + [c.stop for c in chunks[:-1]]
    assert chunks[-1].stop == len(lengths)
    for chunk in chunks:
        assert chunk.num_tokens == sum(lengths[chunk.start : chunk.stop]) <= 4096
        assert 1 <= chunk.num_sequences <= 64


def test_pack_writes_ragged_int32_little_endian():
    batch = pack([np.array([101, 7, 102], dtype=np.int32), np.array([5], dtype=np.int32)])
    assert list(batch.lengths) == [3, 1]
    assert np.frombuffer(batch.token_ids, dtype="<i4").tolist() == [101, 7, 102, 5]
    assert batch.token_type_ids == b""


def test_pack_includes_token_type_ids_for_pairs():
    ids = [np.array([1, 2, 3], dtype=np.int32)]
    batch = pack(ids, [np.array([0, 0, 1], dtype=np.int32)])
    assert np.frombuffer(batch.token_type_ids, dtype="<i4").tolist() == [0, 0, 1]
