"""The `auto` attention plan and its router (plain Python: the timing itself needs a GPU)."""

import itertools
import sys

import pytest
import torch

from kembed.worker.buckets import BucketTable
from kembed.worker.config import WorkerConfig
from kembed.worker.engine.attention_choice import (
    RANGES,
    AttentionPlan,
    RoutedAttention,
    _merge,
    probe_inputs,
)
from kembed.worker.engine.layers.attention import Attention, AttentionShape


class Tagged(Attention):
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, q, k, v, meta, causal, window=None):
        return self.name


def test_router_sends_each_padded_size_to_its_range():
    plan = AttentionPlan(routes=((256, "a"), (2048, "b"), (sys.maxsize, "a")), timings_us=())
    router = RoutedAttention(plan, {"a": Tagged("a"), "b": Tagged("b")})
    for num_tokens, want in [(1, "a"), (256, "a"), (257, "b"), (2048, "b"), (2049, "a"), (40960, "a")]:
        assert router(torch.empty(num_tokens, 1, 1), None, None, None, False) == want
        assert plan.backend_for(num_tokens) == want


def test_plan_describes_one_backend_or_its_ranges():
    assert AttentionPlan(((sys.maxsize, "flash-attn"),), ()).describe() == "flash-attn"
    plan = AttentionPlan(((256, "torch-varlen"), (sys.maxsize, "flash-attn")), ())
    assert plan.describe() == "torch-varlen <= 256 tokens, flash-attn above"


def test_adjacent_ranges_with_one_winner_merge():
    assert _merge([(256, "a"), (2048, "a"), (sys.maxsize, "b")]) == ((2048, "a"), (sys.maxsize, "b"))
    alternating = [(256, "a"), (2048, "b"), (sys.maxsize, "a")]
    assert _merge(alternating) == tuple(alternating)


def test_gpu_kernels_are_known_backends_and_others_are_refused(tmp_path):
    for name in ("flash-attn", "flashinfer", "torch-varlen"):
        assert WorkerConfig(model=tmp_path, attention_backend=name).attention_backend == name
    with pytest.raises(ValueError, match="attention backend"):
        WorkerConfig(model=tmp_path, attention_backend="flash-attn-2")


def test_probes_are_laid_out_as_the_engine_lays_out_their_bucket():
    shape = AttentionShape(16, 8, 128, True)
    table = BucketTable(16384, 256)
    for lengths in (p for _, probes in RANGES for p in probes):
        q, k, v, meta = probe_inputs(shape, lengths, table, torch.device("cpu"), torch.float32)
        bucket = table.lookup(len(lengths), sum(lengths))
        assert q.shape == (bucket.num_tokens, 16, 128) and k.shape == v.shape == (bucket.num_tokens, 8, 128)
        assert meta.max_seqlen == bucket.num_tokens
        offsets = meta.cu_seqlens.tolist()
        assert len(offsets) == bucket.num_seqs + 2  # real sequences, the padding slot, empty slots
        assert [b - a for a, b in itertools.pairwise(offsets)][: len(lengths)] == list(lengths)
        assert offsets[len(lengths) + 1 :] == [bucket.num_tokens] * (bucket.num_seqs + 1 - len(lengths))
