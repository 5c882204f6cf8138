"""DistilBERT, NomicBERT, GTE and jina-embeddings-v3 on the CUDA engine (`pytest -m gpu`; CI has
none): bf16 rows against kembed's CPU engine in float32 on the same directory (which the CPU tests
hold to sentence-transformers) and against transformers in float32 on the GPU, cold (eager), captured
and replayed, on every attention backend installed; graph replay against eager per bucket; no host
sync in the step path. Head size 64, as the published models have (every varlen backend's kernels)."""

import numpy as np
import pytest
import torch
import transformers
from st_pipeline import write_pipeline

from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.engine.cuda_engine import CudaEngine
from kembed.worker.engine.layers.attention_backends import cuda_backends

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VOCAB = 5000
SHAPE = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512
)


def _model(class_name: str, config_name: str, **config):
    """transformers' class, or a skip where this transformers predates it (5.x added these)."""
    if not hasattr(transformers, class_name):
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    return getattr(transformers, class_name)(getattr(transformers, config_name)(**config))


FAMILIES = {  # id -> (the transformers model, pooling)
    "distilbert": (
        lambda: _model(
            "DistilBertModel",
            "DistilBertConfig",
            vocab_size=VOCAB,
            dim=256,
            n_layers=4,
            n_heads=4,
            hidden_dim=1024,
            max_position_embeddings=1024,
        ),
        "mean",
    ),
    "nomic-bert": (
        lambda: _model("NomicBertModel", "NomicBertConfig", **SHAPE, max_position_embeddings=1024),
        "mean",
    ),
    "gte": (
        lambda: _model("GteModel", "GteConfig", **SHAPE, max_position_embeddings=1024, type_vocab_size=1),
        "cls",
    ),
    "jina-embeddings-v3": (
        lambda: _model(
            "JinaEmbeddingsV3Model", "JinaEmbeddingsV3Config", **SHAPE, max_position_embeddings=1024
        ),
        "mean",
    ),
}
BACKENDS = ["auto", "torch-varlen", "triton", "flash-attn", "flashinfer", "sdpa-padded"]
LENGTHS = ([128], [3, 250, 17, 64, 1, 99], [512, 7, 300])


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module", params=FAMILIES)
def family_dir(request, tmp_path_factory):
    make, pooling = FAMILIES[request.param]
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():  # norms away from one and zero, so a misplaced one shows
        for name, param in model.named_parameters():
            if "norm" in name.lower() or "_ln" in name:
                low, high = (0.5, 1.5) if name.endswith("weight") else (-0.2, 0.2)
                param.uniform_(low, high)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    write_pipeline(path, {"word_embedding_dimension": 256, "pooling_mode": pooling}, normalize=True)
    return path, pooling


def batches() -> list[tuple[list[np.ndarray], np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    out = []
    for lengths in (*LENGTHS, list(rng.integers(1, 200, 40))):
        seqs = [rng.integers(5, VOCAB, n).astype(np.int32) for n in lengths]
        out.append((seqs, np.concatenate(seqs), np.array(lengths, np.int32)))
    return out


def transformers_rows(path, seqs: list[np.ndarray], pooling: str) -> np.ndarray:
    """transformers in float32 on the GPU, one unpadded sequence at a time."""
    model = transformers.AutoModel.from_pretrained(path, torch_dtype=torch.float32).cuda().eval()
    rows = []
    with torch.no_grad():
        for seq in seqs:
            hidden = model(input_ids=torch.from_numpy(seq.astype(np.int64))[None].cuda()).last_hidden_state[0]
            rows.append(hidden[0] if pooling == "cls" else hidden.mean(0))
    return torch.stack(rows).float().cpu().numpy()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_cuda_engine_matches_the_cpu_engine_cold_captured_and_replayed(family_dir, backend):
    path, pooling = family_dir
    if backend not in ("auto", "sdpa-padded") and backend not in cuda_backends(torch.device("cuda")):
        pytest.skip(f"{backend} is not installed (or not for this GPU)")
    cpu = load_engine(WorkerConfig(model=path, device="cpu", dtype="float32"))
    gpu = load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16", attention_backend=backend))
    assert isinstance(gpu, CudaEngine) == (backend != "sdpa-padded")  # sdpa-padded: the eager engine
    assert gpu.info.pooling == pooling
    for _seqs, ids, lengths in batches():
        want = cpu.step(cpu.pack(ids, lengths)).wait()
        for _ in range(3):  # cold (eager), capture, replay: all three must be right
            got = gpu.step(gpu.pack(ids, lengths)).wait()
            assert np.isfinite(got).all()
            assert cosine_rows(got, want).min() >= 0.999
    seqs, ids, lengths = batches()[1]
    reference = transformers_rows(path, seqs, pooling)
    assert cosine_rows(gpu.step(gpu.pack(ids, lengths)).wait(), reference).min() >= 0.999


def test_replay_equals_eager_for_buckets_captured_in_any_order(family_dir):
    path, _ = family_dir
    engine = load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16"))
    assert isinstance(engine, CudaEngine)
    rng = np.random.default_rng(1)
    for lengths in ([37, 41, 20], [200], [1, 1, 1, 1, 5], [300, 211]):
        batch = engine.pack(
            rng.integers(5, VOCAB, sum(lengths)).astype(np.int32), np.array(lengths, np.int32)
        )
        eager, replayed = engine.run_both(batch)
        assert np.isfinite(replayed).all()
        assert cosine_rows(eager, replayed).min() >= 0.999, batch.bucket


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
def test_step_path_never_synchronises_the_host(family_dir):
    path, _ = family_dir
    engine = load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16"))
    rng = np.random.default_rng(4)
    warm = engine.pack(rng.integers(5, VOCAB, 183).astype(np.int32), np.array([60, 61, 62], np.int32))
    engine.prewarm([warm.bucket])
    cold = engine.pack(rng.integers(5, VOCAB, 700).astype(np.int32), np.array([400, 300], np.int32))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        handles = [engine.step(warm), engine.step(cold)]  # a replay and an eager cold run
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [h.wait().shape[0] for h in handles] == [3, 2]
