"""The multi-output gather (worker/engine/payload.py) against each sequence's outputs written out
plainly from a flat block of known values: uniform masks (the scalar fast path) and mixed ones."""

import numpy as np
import pytest
import torch

from kembed.proto.outputs import COLBERT, DENSE, SPARSE, TOKENS, OutputShape
from kembed.worker.engine.payload import PayloadIndex, assemble, zero_rows

WIDTH = 8
ALL = DENSE | SPARSE | COLBERT | TOKENS


def _flat(num_slots: int, num_tokens: int, rng: np.random.Generator):
    """A flat block as the multi-output forward lays it out, and its parts."""
    parts = {
        "dense": rng.standard_normal((num_slots, WIDTH)),
        "colbert": rng.standard_normal((num_tokens, WIDTH)),
        "tokens": rng.standard_normal((num_tokens, WIDTH)),
        "zeros": np.zeros((zero_rows(num_tokens, WIDTH), WIDTH)),
        "sparse": rng.random(num_tokens),
    }
    flat = np.concatenate([p.reshape(-1) for p in parts.values()]).astype(np.float32)
    return torch.from_numpy(flat), parts


@pytest.mark.parametrize(
    "masks",
    [
        [ALL] * 3,
        [DENSE | SPARSE] * 3,
        [COLBERT] * 3,
        [DENSE] * 3,
        [ALL, 0, SPARSE | COLBERT],
        [SPARSE, TOKENS, DENSE],
    ],
    ids=["all", "dense+sparse", "colbert", "dense", "mixed", "mixed-sparse-first"],
)
# 19 sparse weights: three rows of 8, the last padded; a batch of one takes a path of its own
@pytest.mark.parametrize("lengths", [[5, 1, 19], [19], [1]], ids=["three", "one", "one-token"])
def test_each_sequence_gets_its_outputs_in_its_rows(masks, lengths):
    rng = np.random.default_rng(0)
    lengths = np.array(lengths)
    num_slots, num_tokens = 4, 32  # a bucket: a padding slot, padding tokens
    flat, parts = _flat(num_slots, num_tokens, rng)
    shape = OutputShape(WIDTH, WIDTH, WIDTH)
    outputs = np.array(masks[: len(lengths)], np.uint8)
    index = PayloadIndex.build(lengths, outputs, shape, ALL, num_slots, num_tokens)
    rows = assemble(flat, index).numpy()
    counts = shape.rows_of(lengths, np.where(outputs == 0, DENSE, outputs))
    assert rows.shape == (counts.sum(), WIDTH)
    at, token_at = 0, 0
    for i, (length, mask, count) in enumerate(zip(lengths, outputs.tolist(), counts, strict=True)):
        mask = mask or DENSE
        got = shape.split(rows[at : at + count], int(length), mask)
        if mask & DENSE:
            np.testing.assert_array_equal(got["dense"], parts["dense"][i].astype(np.float32))
        if mask & COLBERT:
            want = parts["colbert"][token_at + 1 : token_at + length]
            np.testing.assert_array_equal(got["colbert"], want.astype(np.float32))
        if mask & TOKENS:
            want = parts["tokens"][token_at : token_at + length]
            np.testing.assert_array_equal(got["tokens"], want.astype(np.float32))
        if mask & SPARSE:
            want = parts["sparse"][token_at : token_at + length]
            np.testing.assert_array_equal(got["sparse"], want.astype(np.float32))
        words = shape.words(int(length), mask)
        assert not rows[at : at + count].reshape(-1)[words:].any()  # the last row's padding is zero
        at, token_at = at + count, token_at + int(length)


def test_a_batch_of_one_reuses_its_index_only_for_the_same_shape():
    """A query alone reuses the index built for its length, outputs and bucket: another bucket,
    another set of outputs the flat block holds, or another mask gets an index of its own."""
    shape = OutputShape(WIDTH, WIDTH, WIDTH)
    length, mask = np.array([19]), np.array([ALL], np.uint8)
    first = PayloadIndex.build(length, mask, shape, ALL, 4, 32)
    assert PayloadIndex.build(length, mask, shape, ALL, 4, 32) is first
    others = [
        PayloadIndex.build(length, mask, shape, ALL, 4, 64),  # a larger bucket: sources move
        PayloadIndex.build(length, np.array([ALL & ~TOKENS], np.uint8), shape, ALL & ~TOKENS, 4, 32),
        PayloadIndex.build(length, np.array([SPARSE], np.uint8), shape, ALL, 4, 32),
        PayloadIndex.build(np.array([18]), mask, shape, ALL, 4, 32),
    ]
    for other in others:
        assert other is not first and not np.array_equal(other.index, first.index)
    rng = np.random.default_rng(1)
    flat, parts = _flat(4, 64, rng)
    got = shape.split(assemble(flat, others[0]).numpy(), 19, ALL)
    np.testing.assert_array_equal(got["colbert"], parts["colbert"][1:19].astype(np.float32))
