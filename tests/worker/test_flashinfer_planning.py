"""The flashinfer backend's per-batch planning, on the CPU with a stand-in for flashinfer's wrapper:
when a plan is made (once per batch, before the first layer, never inside the forward otherwise),
which pinned buffer it is written into (one per in-flight batch), and the refusal to compile
kernels when `auto` merely probes. The kernels themselves are checked on a GPU (test_gpu_kernels)."""

import os
from typing import ClassVar

import pytest
import torch

from kembed.worker.engine.attention_choice import AttentionPlan, RoutedAttention
from kembed.worker.engine.layers.attention import Attention, AttentionMetadata, FlashInferAttention


class FakeWrapper:
    """Records what the backend asks of flashinfer's BatchPrefillWithRaggedKVCacheWrapper."""

    instances: ClassVar[list["FakeWrapper"]] = []

    def __init__(self, float_workspace, layout, use_cuda_graph, qo_indptr_buf, kv_indptr_buf):
        assert layout == "NHD" and use_cuda_graph and qo_indptr_buf is kv_indptr_buf
        self.indptr = qo_indptr_buf
        self.plans: list[tuple[list[int], int, bool]] = []  # (offsets, id of pinned buffer, jit disabled)
        self.runs = 0
        self._pin_memory_int_workspace_buffer = None
        FakeWrapper.instances.append(self)

    def reset_workspace_buffer(self, float_workspace, int_workspace):
        self.int_workspace = int_workspace

    def plan(self, qo, kv, num_heads, num_kv_heads, head_dim, *, causal, q_data_type, non_blocking):
        assert qo is kv and qo.dtype == torch.int32 and len(qo) == len(self.indptr)
        assert (num_heads, num_kv_heads, head_dim, causal) == (4, 2, 64, True)
        jit_disabled = os.environ.get("FLASHINFER_DISABLE_JIT") == "1"
        self.plans.append((qo.tolist(), id(self._pin_memory_int_workspace_buffer), jit_disabled))
        self.indptr.copy_(qo)

    def run(self, q, k, v):
        self.runs += 1
        return q * 2


def qkv(num_tokens: int):
    q = torch.randn(num_tokens, 4, 64)
    k = torch.randn(num_tokens, 2, 64)
    return q, k, k.clone()


def meta(offsets: list[int], host: bool = False) -> AttentionMetadata:
    cu = torch.tensor(offsets, dtype=torch.int32)
    host_cu = tuple(offsets) if host else ()
    return AttentionMetadata(cu, offsets[-1], torch.zeros(0), None, None, None, host_cu)


@pytest.fixture
def backend():
    FakeWrapper.instances.clear()
    return FlashInferAttention(torch.device("cpu"), compile_kernels=True, wrapper_class=FakeWrapper)


class Slot:  # the engine's pinned slot: any object that lives while its batch is in flight
    pass


def test_engine_batches_are_planned_once_before_the_first_layer_each(backend):
    slot_a, slot_b = Slot(), Slot()
    first, second = [0, 30, 100, 128, 128], [0, 64, 64, 120, 128]
    q, k, v = qkv(128)
    backend.plan_batch(torch.tensor(first, dtype=torch.int32), slot_a)  # cold: no wrapper yet
    for _ in range(3):  # three layers
        assert torch.equal(backend(q, k, v, meta(first), True), q * 2)
    [wrapper] = FakeWrapper.instances
    assert [offsets for offsets, _, _ in wrapper.plans] == [first] and wrapper.runs == 3
    # planned at once: a replayed graph runs no Python that could plan later
    backend.plan_batch(torch.tensor(second, dtype=torch.int32), slot_b)
    assert [offsets for offsets, _, _ in wrapper.plans] == [first, second]
    backend(q, k, v, meta(second), True)
    backend.plan_batch(torch.tensor(first, dtype=torch.int32), slot_a)
    assert len(wrapper.plans) == 3 and len(FakeWrapper.instances) == 1
    buffers = [buffer for _, buffer, _ in wrapper.plans]
    assert buffers[0] == buffers[2] != buffers[1]  # one pinned plan buffer per in-flight slot


def test_other_shapes_get_their_own_wrapper_and_a_batch_of_another_shape_plans_none(backend):
    q, k, v = qkv(128)
    backend.plan_batch(torch.tensor([0, 128, 128], dtype=torch.int32), Slot())
    backend(q, k, v, meta([0, 128, 128]), True)
    backend.plan_batch(torch.tensor([0, 10, 64, 64], dtype=torch.int32), Slot())
    assert len(FakeWrapper.instances[0].plans) == 1  # the 128-token wrapper was not re-planned
    q2, k2, v2 = qkv(64)
    backend(q2, k2, v2, meta([0, 10, 64, 64]), True)
    assert len(FakeWrapper.instances) == 2 and FakeWrapper.instances[1].plans[0][0] == [0, 10, 64, 64]


def test_a_forward_nobody_planned_is_refused(backend):
    q, k, v = qkv(128)
    with pytest.raises(RuntimeError, match="not planned"):
        backend(q, k, v, meta([0, 128, 128]), True)
    backend.plan_batch(torch.tensor([0, 64, 64], dtype=torch.int32), Slot())  # another shape's plan
    with pytest.raises(RuntimeError, match="not planned"):
        backend(q, k, v, meta([0, 128, 128]), True)


def test_callers_with_host_offsets_are_planned_when_the_offsets_change(backend):
    q, k, v = qkv(128)
    for offsets in ([0, 100, 128], [0, 100, 128], [0, 28, 128], [0, 28, 128]):
        backend(q, k, v, meta(offsets, host=True), True)
    [wrapper] = FakeWrapper.instances
    assert [offsets for offsets, _, _ in wrapper.plans] == [[0, 100, 128], [0, 28, 128]]


def test_auto_never_compiles_and_says_how_to_build_the_kernels():
    class Unbuilt(FakeWrapper):
        def plan(self, *args, **kwargs):
            if os.environ.get("FLASHINFER_DISABLE_JIT"):
                raise RuntimeError("JIT compilation is disabled via FLASHINFER_DISABLE_JIT")

    probing = FlashInferAttention(torch.device("cpu"), compile_kernels=False, wrapper_class=Unbuilt)
    q, k, v = qkv(128)
    with pytest.raises(RuntimeError, match="--attention-backend flashinfer"):
        probing(q, k, v, meta([0, 128, 128], host=True), True)
    assert "FLASHINFER_DISABLE_JIT" not in os.environ  # set for the first plan only, then removed

    FakeWrapper.instances.clear()
    built = FlashInferAttention(torch.device("cpu"), compile_kernels=False, wrapper_class=FakeWrapper)
    built(q, k, v, meta([0, 128, 128], host=True), True)
    built(q, k, v, meta([0, 100, 128], host=True), True)
    assert [disabled for _, _, disabled in FakeWrapper.instances[0].plans] == [True, False]
    assert "FLASHINFER_DISABLE_JIT" not in os.environ


def test_router_hands_the_offsets_to_the_routed_backend_only(backend):
    class Plain(Attention):
        def __call__(self, q, k, v, meta, causal, window=None):
            return q

    plan = AttentionPlan(routes=((256, "flashinfer"), (2**62, "plain")), timings_us=())
    router = RoutedAttention(plan, {"flashinfer": backend, "plain": Plain()})
    assert router.plans_batches  # one of its backends plans each batch
    router.plan_batch(torch.tensor([0, 1000, 1024], dtype=torch.int32), Slot())  # routed to plain
    assert backend._pending is None
    offsets = torch.tensor([0, 100, 128], dtype=torch.int32)
    router.plan_batch(offsets, Slot())
    q, k, v = qkv(128)
    assert torch.equal(router(q, k, v, meta([0, 100, 128]), True), q * 2)
    assert FakeWrapper.instances[0].plans[0][0] == [0, 100, 128]


def test_a_flashinfer_without_the_per_batch_plan_buffer_is_refused():
    class Renamed(FakeWrapper):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            del self._pin_memory_int_workspace_buffer

    backend = FlashInferAttention(torch.device("cpu"), compile_kernels=True, wrapper_class=Renamed)
    q, k, v = qkv(128)
    with pytest.raises(RuntimeError, match="_pin_memory_int_workspace_buffer"):
        backend(q, k, v, meta([0, 128, 128], host=True), True)
