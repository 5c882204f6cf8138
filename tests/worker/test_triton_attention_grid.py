"""The triton attention kernel's grid (CPU): enough query blocks for every packing of a bucket.

The kernel maps program i to the i-th query block of the batch, counting each sequence's blocks in
turn from `cu_seqlens` on the device; programs past the last block return. A grid one block short
would leave a sequence's last rows unwritten, silently, so the bound is checked here for any
lengths a bucket can hold, as the engine lays them out (real sequences, the padding slot, empty
slots), and for every tile the kernel uses.
"""

from hypothesis import given
from hypothesis import strategies as st

from kembed.worker.engine.layers.triton_attention import HEAD_DIMS, grid_blocks, tiles


@st.composite
def buckets(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    """(bucket tokens, sequence slots incl. padding and empty ones, every slot's length)."""
    num_tokens = draw(st.integers(1, 16384))
    real = draw(st.lists(st.integers(1, 4096), min_size=1, max_size=64))
    lengths: list[int] = []
    for n in real:
        if sum(lengths) + n > num_tokens:
            break
        lengths.append(n)
    lengths.append(num_tokens - sum(lengths))  # the padding slot (may be empty)
    empty = draw(st.integers(0, 8))
    return num_tokens, len(lengths) + empty, lengths + [0] * empty


@given(buckets(), st.sampled_from(HEAD_DIMS))
def test_the_grid_holds_every_query_block_of_any_packing(bucket, head_dim):
    num_tokens, num_slots, lengths = bucket
    assert sum(lengths) == num_tokens and len(lengths) == num_slots
    block_m = tiles(num_tokens, num_slots, head_dim)[0]
    needed = sum(-(-n // block_m) for n in lengths)
    assert needed <= grid_blocks(num_tokens, num_slots, block_m)


def test_the_bound_is_tight_for_slots_one_token_past_a_block():
    # 3 sequences of 65 tokens and 64-row blocks: 2 blocks each, 6 in all, from 195 tokens
    assert grid_blocks(195, 3, 64) == 4 + 3 >= 6
    assert sum(-(-n // 64) for n in (65, 65, 65)) == 6
