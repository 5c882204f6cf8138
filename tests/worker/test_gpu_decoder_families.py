"""The decoder families on the CUDA engine (`pytest -m gpu`; CI has none and deselects these): Qwen2
causal and bidirectional, EuroBERT, and an LLM reranker (Qwen3 with LogitScore), in bfloat16 through
the fused decoder kernels and every varlen attention backend installed, against kembed's CPU engine in
float32 on the same directory: cosine >= 0.999 per row (scores within 0.04), on the first (eager),
second (captured) and third (replayed) run of each bucket."""

import numpy as np
import pytest
import torch
from decoder_dirs import QWEN3_RERANKER_TEMPLATE, reranker_dir, save_decoder
from st_pipeline import write_pipeline

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.engine.cuda_engine import CudaEngine
from kembed.worker.engine.layers.attention_backends import cuda_backends

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Head size 64 (every backend has kernels for it; half of it a power of two, so the fused kernels
# run), grouped-query attention, the real models' 0.02 initialisation.
GPU_SHAPE = dict(
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    max_position_embeddings=1024,
    initializer_range=0.02,
)
BATCHES = ([128], [3, 250, 17, 64, 1, 99], [512, 7, 300], list(np.random.default_rng(0).integers(1, 200, 40)))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    built = {}
    for name, family, pooling, config in (
        ("qwen2-causal", "qwen2", "lasttoken", {}),
        ("qwen2-bidirectional", "qwen2", "mean", {"is_causal": False}),
        ("eurobert", "eurobert", "mean", {}),
    ):
        path = tmp_path_factory.mktemp(name)
        save_decoder(path, family, **{**GPU_SHAPE, **config})
        write_pipeline(path, {"word_embedding_dimension": 256, "pooling_mode": pooling}, normalize=True)
        built[name] = path
    built["qwen3-reranker"] = reranker_dir(
        tmp_path_factory.mktemp("reranker"), "qwen3", QWEN3_RERANKER_TEMPLATE, shape=GPU_SHAPE
    )
    return built


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def installed(backend: str) -> bool:
    return backend in cuda_backends(torch.device("cuda"))


@pytest.mark.parametrize("backend", ["auto", "torch-varlen", "triton", "flash-attn", "flashinfer"])
@pytest.mark.parametrize("model", ["qwen2-causal", "qwen2-bidirectional", "eurobert", "qwen3-reranker"])
def test_bf16_graph_replay_matches_the_cpu_engine_in_fp32(dirs, model, backend):
    if backend in ("flash-attn", "flashinfer") and not installed(backend):
        pytest.skip(f"{backend} is not installed (or not for this GPU)")
    path = dirs[model]
    cpu = load_engine(WorkerConfig(model=path, device="cpu", dtype="float32"))
    gpu = load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16", attention_backend=backend))
    assert isinstance(gpu, CudaEngine), "expected the CUDA engine with a varlen backend"
    if backend != "auto":
        assert gpu.info.attention_backend == backend
    rng = np.random.default_rng(1)
    for lengths in BATCHES:
        lens = np.array(lengths, np.int32)
        ids = rng.integers(5, gpu.info.vocab_size, int(lens.sum())).astype(np.int32)
        want = cpu.step(cpu.pack(ids, lens)).wait()
        for _ in range(3):  # cold (eager), capture, replay: all three must be right
            got = gpu.step(gpu.pack(ids, lens)).wait()
            assert got.shape == want.shape and np.isfinite(got).all()
            if gpu.info.task == "score":
                # measured bf16 against fp32 on the CPU: at most 0.013 apart, scores spread over ~0.5-2.5
                np.testing.assert_allclose(got, want, rtol=0, atol=4e-2)
            else:
                assert cosine_rows(got, want).min() >= 0.999, (lengths, cosine_rows(got, want).min())
