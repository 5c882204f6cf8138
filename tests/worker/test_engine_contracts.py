"""The engine's typed contracts: every attention backend is an `Attention` (a no-op `plan_batch` unless
it `plans_batches`), every engine a `BaseEngine`, and every step's result a `ResultHandle`."""

import time
import typing

import numpy as np
import pytest
import torch
import transformers
from st_pipeline import write_pipeline

from kembed.operator.spec.spec import WorkerSpec
from kembed.worker.buckets import BucketTable
from kembed.worker.config import ATTENTION_BACKEND_CHOICES, WorkerConfig
from kembed.worker.engine import BaseEngine, Engine, load_engine
from kembed.worker.engine.attention_choice import AttentionPlan, RoutedAttention
from kembed.worker.engine.cuda_engine import CudaEngine, CudaLazyTensor
from kembed.worker.engine.layers.attention import Attention, FlashInferAttention, build_metadata
from kembed.worker.engine.layers.attention_backends import ATTENTION_BACKENDS
from kembed.worker.engine.lazy import LazyTensor
from kembed.worker.results import ResultHandle

LENGTHS = np.array([5, 17, 1, 9], np.int32)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A two-layer BERT with random weights (heads of 64, which every varlen kernel has), mean pooling."""
    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=256, max_position_embeddings=128,
    )  # fmt: skip
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(path)
    write_pipeline(path, {"pooling_mode_mean_tokens": True}, normalize=True)
    return path


def test_the_worker_and_the_operator_offer_the_same_attention_backends():
    """The operator may not import the worker, so its spec lists the names again: the same ones."""
    offered = typing.get_args(WorkerSpec.model_fields["attention_backend"].annotation)
    assert offered == ATTENTION_BACKEND_CHOICES
    assert set(ATTENTION_BACKENDS) < set(ATTENTION_BACKEND_CHOICES) - {"auto"}


@pytest.mark.parametrize("name", sorted(ATTENTION_BACKENDS), ids=sorted(ATTENTION_BACKENDS))
def test_every_built_in_backend_is_an_attention_that_plans_nothing(name):
    backend = ATTENTION_BACKENDS[name]
    assert isinstance(backend, Attention)
    assert not backend.plans_batches
    assert backend.plan_batch(torch.tensor([0, 5, 22], dtype=torch.int32), object()) is None


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_the_two_cpu_backends_agree_on_a_ragged_batch(causal):
    torch.manual_seed(1)
    meta, _ = build_metadata(LENGTHS)
    num_tokens = int(LENGTHS.sum())
    q, k, v = (torch.randn(num_tokens, heads, 16) for heads in (4, 2, 2))  # grouped-query heads
    loop = ATTENTION_BACKENDS["sdpa"](q, k, v, meta, causal)
    padded = ATTENTION_BACKENDS["sdpa-padded"](q, k, v, meta, causal)
    assert loop.shape == (num_tokens, 4, 16)
    torch.testing.assert_close(loop, padded, atol=1e-5, rtol=1e-5)


def test_a_router_plans_batches_exactly_when_a_backend_it_routes_to_does():
    plain = {"sdpa": ATTENTION_BACKENDS["sdpa"], "sdpa-padded": ATTENTION_BACKENDS["sdpa-padded"]}
    plan = AttentionPlan(routes=((256, "sdpa"), (2**62, "sdpa-padded")), timings_us=())
    router = RoutedAttention(plan, plain)
    assert isinstance(router, Attention) and not router.plans_batches
    router.plan_batch(torch.tensor([0, 300], dtype=torch.int32))  # routed to a backend with no plan
    planning = FlashInferAttention(torch.device("cpu"), compile_kernels=False, wrapper_class=object)
    assert isinstance(planning, Attention) and planning.plans_batches
    plan = AttentionPlan(routes=((256, "flashinfer"), (2**62, "sdpa")), timings_us=())
    assert RoutedAttention(plan, {**plain, "flashinfer": planning}).plans_batches


@pytest.mark.parametrize("backend", ["auto", "sdpa", "sdpa-padded"])
def test_a_cpu_engine_is_a_base_engine_whose_step_returns_a_result_handle(tiny_bert, backend):
    engine = load_engine(WorkerConfig(model=tiny_bert, device="cpu", attention_backend=backend))
    assert isinstance(engine, BaseEngine) and isinstance(engine, Engine)
    attentions = [m.attend for m in engine.model.modules() if hasattr(m, "attend")]
    assert attentions and all(a is ATTENTION_BACKENDS[engine.info.attention_backend] for a in attentions)
    rng = np.random.default_rng(0)
    handle = engine.step(engine.pack(rng.integers(5, 1000, int(LENGTHS.sum())).astype(np.int32), LENGTHS))
    assert isinstance(handle, ResultHandle)
    assert handle.is_ready()  # a CPU step is computed inside `step`
    rows = handle.wait()
    assert rows.shape == (len(LENGTHS), engine.info.dimensions) and np.isfinite(rows).all()
    # the shared surface counts the step's bucket, as the CUDA engine's does
    ((bucket, hits, is_captured),) = engine.bucket_stats()
    assert (bucket.num_seqs, hits, is_captured) == (len(LENGTHS), 1, False)
    assert engine.stats().bucket_hits == {str(bucket): 1}


def test_a_cpu_engine_answers_the_scheduler_and_the_server_as_an_engine_without_graphs(tiny_bert):
    engine = load_engine(WorkerConfig(model=tiny_bert, device="cpu"))
    batch = engine.pack(_ids(3), LENGTHS)
    assert not engine.can_launch_inline(batch)  # a whole eager forward: never on the event loop
    assert engine.capture_deferred(1.0) == 0  # nothing is ever deferred
    assert isinstance(engine.buckets, BucketTable) and batch.bucket in engine.buckets.reachable()
    assert engine.captured_buckets() == []
    assert engine.prewarm([batch.bucket]) == [batch.bucket]  # recorded, so a smoke test covers it
    assert engine.captured_buckets() == [batch.bucket]


def test_both_engines_and_their_handles_share_one_type():
    assert issubclass(Engine, BaseEngine) and issubclass(CudaEngine, BaseEngine)
    assert issubclass(LazyTensor, ResultHandle) and issubclass(CudaLazyTensor, ResultHandle)
    with pytest.raises(TypeError, match="abstract"):
        ResultHandle()  # a handle must say both is_ready and wait


SPANS = [None, np.array([0, 8, 17]), None, None]  # the 17-token sequence pooled in two spans: 5 rows


def _ids(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(5, 1000, int(LENGTHS.sum())).astype(np.int32)


def test_a_cpu_span_step_returns_a_result_handle_too(tiny_bert):
    engine = load_engine(WorkerConfig(model=tiny_bert, device="cpu"))
    handle = engine.step(engine.pack(_ids(1), LENGTHS, None, SPANS))
    assert isinstance(handle, ResultHandle) and handle.is_ready()
    assert handle.wait().shape == (5, engine.info.dimensions)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.gpu
def test_a_cuda_engine_is_a_base_engine_whose_replayed_and_eager_steps_return_result_handles(tiny_bert):
    cpu = load_engine(WorkerConfig(model=tiny_bert, device="cpu"))
    config = WorkerConfig(model=tiny_bert, device="cuda", dtype="bfloat16", attention_backend="torch-varlen")
    gpu = load_engine(config)
    assert isinstance(gpu, CudaEngine) and isinstance(gpu, BaseEngine)
    assert gpu.attention is ATTENTION_BACKENDS["torch-varlen"] and not gpu.attention.plans_batches
    ids = _ids(2)
    batch = gpu.pack(ids, LENGTHS)
    gpu.prewarm([batch.bucket])  # captured: the next step replays
    assert gpu.can_launch_inline(batch)
    replayed = gpu.step(batch)
    spans = gpu.step(gpu.pack(ids, LENGTHS, None, SPANS))  # a span batch runs eagerly, off the ring
    assert isinstance(replayed, CudaLazyTensor) and isinstance(spans, LazyTensor)
    for handle in (replayed, spans):
        assert isinstance(handle, ResultHandle)
        for _ in range(10_000):  # is_ready never blocks; the step is done within a second
            if handle.is_ready():
                break
            time.sleep(1e-4)
        assert handle.is_ready()
    want = cpu.step(cpu.pack(ids, LENGTHS)).wait()
    want_spans = cpu.step(cpu.pack(ids, LENGTHS, None, SPANS)).wait()
    assert _cosines(replayed.wait(), want).min() > 0.99
    assert _cosines(spans.wait(), want_spans).min() > 0.99
    ((bucket, hits, is_captured),) = gpu.bucket_stats()
    assert (bucket, hits, is_captured) == (batch.own_bucket, 1, True)
    assert gpu.stats().num_replays == 1
