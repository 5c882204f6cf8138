"""The relative-position-bias families on a real GPU (`pytest -m gpu`; CI has none and deselects these).

MPNet, T5 and DeBERTa run in the CUDA engine on the Triton kernel, which adds their bias in each score
tile (a distance table; DeBERTa's disentangled per-token terms): cold (eager), captured and replayed
steps in bf16 against the CPU engine in float32 on the same directory (embedders: cosine >= 0.999 a
row; the reranker: scores within 5 % of the largest, 1 % in float32), no host sync on a replayed step.
The kernel alone against the sdpa loop. DeBERTa on sdpa-padded in the eager engine too (where Triton is
missing). No backend that adds no bias is ever chosen."""

import copy

import numpy as np
import pytest
import torch
from bias_models import MAX_LENGTH, write_deberta_reranker, write_mpnet, write_sentence_t5

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import Engine, load_engine
from kembed.worker.engine.cuda_engine import CudaEngine
from kembed.worker.engine.layers.attention import AttentionShape, SdpaLoopAttention, build_metadata
from kembed.worker.engine.layers.attention_backends import cuda_backends
from kembed.worker.engine.layers.relative_bias import (
    DISENTANGLED,
    DISTANCE,
    DisentangledBias,
    RelativePositionBias,
    log_bucket_positions,
)
from kembed.worker.errors import StartupError

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
# ragged batches: a query alone, mixed short and long (past every bucket's exact range), many short
LENGTHS = (
    [17],
    [3, 200, 17, 64, 1, 99],
    [200, 7, 150],
    [int(n) for n in np.random.default_rng(0).integers(1, 120, 40)],
)


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def has_triton() -> bool:
    return "triton" in cuda_backends(torch.device("cuda"))


def batch(lengths: list[int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = [np.concatenate([[101], rng.integers(1000, 30000, n - 1)]).astype(np.int32) for n in lengths]
    return np.concatenate(ids), np.array(lengths, np.int32)


@pytest.fixture(scope="module")
def embedder_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bias-gpu")
    return {
        "mpnet": write_mpnet(root / "mpnet"),
        "sentence-t5": write_sentence_t5(root / "sentence-t5", "gated-gelu"),
    }


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@torch.no_grad()  # the bias table is a parameter's gather
def test_triton_kernel_adds_a_distance_bias_as_sdpa_does(head_dim, causal):
    if not has_triton():
        pytest.skip("triton is not installed")
    from kembed.worker.engine.layers.triton_attention import varlen_attention

    torch.manual_seed(0)
    lengths = np.array([1, 7, 300, 3, 140, 64])
    meta, _ = build_metadata(lengths)
    num_tokens, heads = int(lengths.sum()), 4
    q, k, v = (torch.randn(num_tokens, heads, head_dim) for _ in range(3))
    position_bias = RelativePositionBias(32, heads, 32, 40)  # distances clamped past 40
    with torch.no_grad():
        position_bias.relative_attention_bias.weight.normal_(0.0, 2.0)
    on_device = copy.deepcopy(position_bias).to("cuda", torch.bfloat16)
    qkv = [x.to("cuda", torch.bfloat16) for x in (q, k, v)]
    for scale in (None, 1.0 / head_dim):  # the default 1/sqrt(d), and another (T5's is 1)
        expected = SdpaLoopAttention()(q, k, v, meta, causal, bias=position_bias(scale))  # float32, CPU
        for tile in (None, (128, 64, 8, 3, True), (64, 32, 4, 3, False)):
            got = varlen_attention(*qkv, meta.cu_seqlens.cuda(), causal, tile, bias=on_device(scale))
            flat = got.float().cpu().reshape(num_tokens, -1)
            assert cosine_rows(flat.numpy(), expected.reshape(num_tokens, -1).numpy()).min() >= 0.999


@pytest.mark.parametrize("terms", [("c2p", "p2c"), ("c2p",), ("p2c",)], ids=["both", "c2p", "p2c"])
def test_triton_kernel_gathers_disentangled_terms_as_sdpa_does(terms):
    if not has_triton():
        pytest.skip("triton is not installed")
    from kembed.worker.engine.layers.triton_attention import varlen_attention

    torch.manual_seed(1)
    lengths = np.array([300, 1, 9, 64, 130])
    meta, _ = build_metadata(lengths)
    num_tokens, heads, head_dim, limit, span = int(lengths.sum()), 4, 64, 512, 32
    q, k, v = (torch.randn(num_tokens, heads, head_dim) for _ in range(3))
    positions = (log_bucket_positions(torch.arange(-(limit - 1), limit), span, limit) + span).clamp(
        0, 2 * span - 1
    )
    c2p, p2c = (torch.randn(num_tokens, heads, 2 * span) if t in terms else None for t in ("c2p", "p2c"))
    scale = 1.0 / (head_dim * (1 + len(terms))) ** 0.5
    expected = SdpaLoopAttention()(
        q, k, v, meta, False, bias=DisentangledBias(c2p, p2c, positions, limit, scale)
    )

    def cuda(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to("cuda", torch.bfloat16)

    bias = DisentangledBias(cuda(c2p), cuda(p2c), positions.cuda(), limit, scale)
    qkv = [x.to("cuda", torch.bfloat16) for x in (q, k, v)]
    for tile in (None, (128, 64, 8, 3, True), (64, 32, 4, 3, False)):
        got = varlen_attention(*qkv, meta.cu_seqlens.cuda(), False, tile, bias=bias)
        flat = got.float().cpu().reshape(num_tokens, -1).numpy()
        assert cosine_rows(flat, expected.reshape(num_tokens, -1).numpy()).min() >= 0.999


def test_only_backends_that_add_the_bias_are_offered():
    device = torch.device("cuda")
    for kind in (DISTANCE, DISENTANGLED):
        offered = cuda_backends(device, AttentionShape(12, 12, 64, False, bias=kind))
        assert set(offered) == ({"triton"} if has_triton() else set()), kind
    head_16 = AttentionShape(12, 12, 16, False, bias=DISTANCE)
    assert "triton" not in cuda_backends(device, head_16)  # a head size the kernel lacks


@pytest.mark.parametrize("family", ["mpnet", "sentence-t5"])
def test_bias_embedder_replays_in_cuda_graphs_as_the_cpu_engine_computes(embedder_dirs, family):
    if not has_triton():
        pytest.skip("triton is not installed: the model runs in the eager engine")
    path = embedder_dirs[family]
    # a budget that holds LENGTHS' largest batch (40 sequences, ~2,400 tokens): every one captured
    config = WorkerConfig(model=path, device="cuda", dtype="bfloat16", max_batch_tokens=4096)
    engine = load_engine(config)
    assert isinstance(engine, CudaEngine) and engine.info.attention_backend == "triton"
    reference = load_engine(WorkerConfig(model=path, device="cpu", dtype="float32"))
    for seed, lengths in enumerate(LENGTHS):
        ids, lens = batch(lengths, seed)
        expected = reference.step(reference.pack(ids, lens)).wait()
        bucket = engine.pack(ids, lens).bucket
        for _ in range(3):  # cold (eager), capture, replay
            got = engine.step(engine.pack(ids, lens)).wait()
            assert cosine_rows(got, expected).min() >= 0.999, lengths
        assert engine.graphs.is_captured(bucket)


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
def test_a_replayed_mpnet_step_never_synchronises_the_host(embedder_dirs):
    if not has_triton():
        pytest.skip("triton is not installed")
    engine = load_engine(WorkerConfig(model=embedder_dirs["mpnet"], device="cuda", dtype="bfloat16"))
    ids, lens = batch([60, 61, 62], 4)
    warm = engine.pack(ids, lens)
    engine.prewarm([warm.bucket])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        handle = engine.step(warm)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert np.isfinite(handle.wait()).all()


def test_a_varlen_backend_without_the_bias_is_refused(embedder_dirs):
    with pytest.raises(StartupError, match="adds no distance position bias"):
        load_engine(
            WorkerConfig(model=embedder_dirs["mpnet"], device="cuda", attention_backend="torch-varlen")
        )


@pytest.mark.parametrize(
    ("backend", "dtype", "rtol"),
    [("auto", "bfloat16", 5e-2), ("auto", "float32", 1e-2), ("sdpa-padded", "bfloat16", 5e-2)],
    ids=["triton-graphs-bf16", "triton-graphs-fp32", "sdpa-padded-eager-bf16"],
)
def test_deberta_reranker_scores_as_the_cpu_engine_does(tmp_path, backend, dtype, rtol):
    path = write_deberta_reranker(tmp_path / "mxbai-rerank", "v3")
    engine = load_engine(WorkerConfig(model=path, device="cuda", dtype=dtype, attention_backend=backend))
    is_graphed = backend == "auto" and has_triton()
    if is_graphed:
        assert isinstance(engine, CudaEngine) and engine.info.attention_backend == "triton"
    else:  # no varlen kernel: the eager engine
        assert isinstance(engine, Engine) and engine.info.attention_backend == "sdpa-padded"
    reference = load_engine(WorkerConfig(model=path, device="cpu", dtype="float32"))
    for seed, lengths in enumerate(LENGTHS):
        ids, lens = batch([min(n, MAX_LENGTH) for n in lengths], seed)
        expected = reference.step(reference.pack(ids, lens)).wait()
        for _ in range(3 if is_graphed else 1):  # cold (eager), capture, replay
            got = engine.step(engine.pack(ids, lens)).wait()
            np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * np.abs(expected).max())
