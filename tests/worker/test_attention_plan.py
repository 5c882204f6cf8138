"""The `auto` attention plan and its router (plain Python: the timing itself needs a GPU)."""

import sys

import pytest
import torch

from kembed.worker.config import WorkerConfig
from kembed.worker.engine.attention_choice import AttentionPlan, RoutedAttention, _merge


def tagged(name):
    def attend(q, k, v, meta, causal):
        return name

    return attend


def test_router_sends_each_padded_size_to_its_range():
    plan = AttentionPlan(routes=((256, "a"), (2048, "b"), (sys.maxsize, "a")), timings_us=())
    router = RoutedAttention(plan, {"a": tagged("a"), "b": tagged("b")})
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


def test_flash_attn_is_a_known_backend_but_needs_a_gpu(tmp_path):
    assert WorkerConfig(model=tmp_path, attention_backend="flash-attn").attention_backend == "flash-attn"
    with pytest.raises(ValueError, match="attention backend"):
        WorkerConfig(model=tmp_path, attention_backend="flashinfer")
