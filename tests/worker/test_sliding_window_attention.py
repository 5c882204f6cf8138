"""Sliding-window attention in the backend contract (CPU): the sdpa backends apply the band exactly
(against a softmax over a mask written out key by key), a window longer than every sequence is full
attention, and the GPU backends pass the window on in their own terms or say why they cannot. The
kernels themselves run on a GPU (test_gpu_sliding_window.py)."""

import itertools
import math

import numpy as np
import pytest
import torch

from kembed.worker.engine.layers.attention import (
    AttentionShape,
    FlashAttn4Attention,
    FlashInferAttention,
    TorchVarlenAttention,
    build_metadata,
)
from kembed.worker.engine.layers.attention_backends import ATTENTION_BACKENDS, window_refusal

LENGTHS = [1, 5, 17, 40, 9]


def packed(num_heads: int, num_kv_heads: int, seed: int = 0):
    torch.manual_seed(seed)
    num_tokens = sum(LENGTHS)
    q = torch.randn(num_tokens, num_heads, 16) * 2  # sharp enough that one key more or less shows
    k = torch.randn(num_tokens, num_kv_heads, 16) * 2
    v = torch.randn(num_tokens, num_kv_heads, 16)
    meta, _ = build_metadata(np.array(LENGTHS))
    return q, k, v, meta


def reference(q, k, v, causal: bool, window: int | None) -> torch.Tensor:
    """Each query's softmax over the keys of its sequence the pattern lets it see, one by one."""
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for start, end in itertools.pairwise(np.cumsum([0, *LENGTHS])):
        for i, head in itertools.product(range(end - start), range(q.shape[1])):
            seen = [
                j
                for j in range(end - start)
                if (not causal or j <= i) and (window is None or abs(i - j) <= window)
            ]
            keys = k[start + np.array(seen), head // group]
            weights = torch.softmax(keys @ q[start + i, head] / math.sqrt(q.shape[2]), dim=0)
            out[start + i, head] = weights @ v[start + np.array(seen), head // group]
    return out


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["symmetric", "causal"])
@pytest.mark.parametrize("window", [0, 3, 8])
def test_sdpa_backends_see_exactly_the_band(backend, causal, window):
    q, k, v, meta = packed(4, 2)
    got = ATTENTION_BACKENDS[backend](q, k, v, meta, causal, window)
    torch.testing.assert_close(got, reference(q, k, v, causal, window), rtol=1e-4, atol=1e-5)
    unwindowed = ATTENTION_BACKENDS[backend](q, k, v, meta, causal)
    long = np.repeat(np.array(LENGTHS) > window + 1, LENGTHS)
    assert not torch.allclose(got[long], unwindowed[long], atol=1e-3)  # the band did cut keys


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
@pytest.mark.parametrize("causal", [False, True], ids=["symmetric", "causal"])
def test_a_window_longer_than_every_sequence_is_full_attention(backend, causal):
    q, k, v, meta = packed(4, 4, seed=1)
    attend = ATTENTION_BACKENDS[backend]
    torch.testing.assert_close(
        attend(q, k, v, meta, causal, max(LENGTHS) - 1), attend(q, k, v, meta, causal), rtol=1e-5, atol=1e-6
    )


class Recorder:
    """A stand-in for a varlen kernel: records its keyword arguments, returns q."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def with_window(self, q, k, v, *args, window_size=(-1, -1), **kwargs):
        self.calls.append({"window_size": window_size, **kwargs})
        return q

    def without_window(self, q, k, v, *args, is_causal=False, **kwargs):
        self.calls.append({"is_causal": is_causal, **kwargs})
        return q


@pytest.mark.parametrize(
    ("causal", "window", "passed"),
    [(False, 64, (64, 64)), (True, 4095, (4095, 0)), (False, None, (-1, -1)), (True, None, (-1, 0))],
    ids=["symmetric", "causal", "full", "causal-full"],
)
def test_torch_varlen_passes_the_window_as_left_and_right_bounds(causal, window, passed):
    recorder = Recorder()
    attend = TorchVarlenAttention(recorder.with_window)
    q, k, v, meta = packed(4, 4)
    attend(q, k, v, meta, causal, window)
    assert recorder.calls[-1]["window_size"] == passed
    assert attend.window_refusal(causal) is None


@pytest.mark.parametrize(
    ("causal", "window", "passed"),
    [(False, 64, (64, 64)), (True, 100, (100, 0))],
    ids=["symmetric", "causal"],
)
def test_flash_attn_4_passes_the_window(causal, window, passed):
    recorder = Recorder()
    attend = FlashAttn4Attention(recorder.with_window)
    q, k, v, meta = packed(4, 4)
    attend(q, k, v, meta, causal, window)
    assert recorder.calls[-1]["window_size"] == passed and recorder.calls[-1]["causal"] == causal
    attend(q, k, v, meta, causal)
    assert "window_size" not in recorder.calls[-1] or recorder.calls[-1]["window_size"] == (-1, -1)


def test_a_kernel_without_a_window_refuses_windowed_models_and_windowed_calls():
    q, k, v, meta = packed(4, 4)
    for attend in (
        TorchVarlenAttention(Recorder().without_window),
        FlashAttn4Attention(Recorder().without_window),
    ):
        assert attend.window_refusal(False) is not None
        assert "window_size" in window_refusal(attend, AttentionShape(4, 4, 16, False, window=64))
        assert window_refusal(attend, AttentionShape(4, 4, 16, False)) is None  # no window, no refusal
        with pytest.raises(ValueError, match="window_size"):
            attend(q, k, v, meta, False, 8)


class WindowedWrapper:
    """flashinfer's ragged prefill wrapper, as far as planning goes: records each plan's window."""

    def __init__(self, float_workspace, layout, use_cuda_graph, qo_indptr_buf, kv_indptr_buf):
        self.windows: list[int | None] = []
        self._pin_memory_int_workspace_buffer = None

    def reset_workspace_buffer(self, float_workspace, int_workspace):
        pass

    def plan(self, qo, kv, num_heads, num_kv_heads, head_dim, *, causal, q_data_type, non_blocking, **kwargs):
        self.windows.append(kwargs.get("window_left"))

    def run(self, q, k, v):
        return q


def test_flashinfer_plans_a_causal_window_per_layer_kind_and_refuses_a_symmetric_one():
    attend = FlashInferAttention(torch.device("cpu"), compile_kernels=True, wrapper_class=WindowedWrapper)
    q, k, v, meta = packed(4, 2)
    attend(q, k, v, meta, True, 100)  # a local layer
    attend(q, k, v, meta, True)  # a global one: a wrapper of its own, planned without a window
    plans = [planned.wrapper.windows for shapes in attend._wrappers.values() for planned in shapes.values()]
    assert sorted(plans, key=str) == [[100], [None]]
    assert attend.window_refusal(True) is None
    assert "left only" in (attend.window_refusal(False) or "")
    with pytest.raises(ValueError, match="left only"):
        attend(q, k, v, meta, False, 8)


def test_the_cpu_backends_serve_both_kinds_of_window():
    for name in ("sdpa", "sdpa-padded"):
        for causal in (False, True):
            shape = AttentionShape(4, 4, 16, causal, window=8)
            assert window_refusal(ATTENTION_BACKENDS[name], shape) is None
