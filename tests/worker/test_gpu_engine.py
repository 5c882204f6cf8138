"""The CUDA engine on a real GPU (`pytest -m gpu`; CI has none and deselects these).

bf16 results against transformers in fp32 on the same weights, graph replay against eager for
buckets captured in any order, overlapping batches, and no host sync anywhere in the step path.
"""

import asyncio
import itertools
import random

import numpy as np
import pytest
import torch
import transformers
from st_pipeline import write_pipeline

from kembed.worker.buckets import Bucket
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.engine.cuda_engine import CudaEngine
from kembed.worker.engine.layers.attention_backends import cuda_backends
from kembed.worker.scheduling.scheduler import Scheduler

pytestmark = pytest.mark.gpu


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def ragged(rng: np.random.Generator, lengths, vocab: int):
    seqs = [rng.integers(5, vocab, n).astype(np.int32) for n in lengths]
    return seqs, np.concatenate(seqs), np.array(lengths, np.int32)


def reference_rows(model, seqs, pooling: str) -> np.ndarray:
    """transformers in float32, one unpadded sequence at a time."""
    rows = []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.from_numpy(seq.astype(np.int64))[None].cuda()
            hidden = model(input_ids=ids).last_hidden_state[0]
            rows.append({"cls": hidden[0], "mean": hidden.mean(0), "last": hidden[-1]}[pooling])
    return torch.stack(rows).float().cpu().numpy()


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    """all-MiniLM-L6-v2's shape (BERT, mean pooling) with random weights: the GPU machine has no
    copy of the bundled package, and correctness here is about the engine, not the weights."""
    path = tmp_path_factory.mktemp("minilm")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(path)
    write_pipeline(path, {"pooling_mode_mean_tokens": True}, normalize=True)
    return path


@pytest.fixture(scope="module")
def minilm(minilm_dir) -> CudaEngine:
    engine = load_engine(WorkerConfig(model=minilm_dir, device="cuda", dtype="bfloat16"))
    assert isinstance(engine, CudaEngine), "expected the CUDA engine with a varlen backend"
    return engine


@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory):
    """A small random XLM-RoBERTa (BGE-M3's family, CLS pooling) saved as a model directory."""
    path = tmp_path_factory.mktemp("xlmr")
    torch.manual_seed(0)
    config = transformers.XLMRobertaConfig(
        vocab_size=5000,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=1026,
    )
    transformers.XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(path)
    write_pipeline(path, {"pooling_mode_cls_token": True}, normalize=True)  # as BGE-M3 ships
    return path


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    """A small random Qwen3 decoder (grouped-query attention, last-token pooling) as a model directory."""
    path = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=5000, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, intermediate_size=512, max_position_embeddings=1024,
    )  # fmt: skip
    model = transformers.Qwen3Model(config).eval()
    with torch.no_grad():  # norm weights start at one: randomise them so a misplaced norm shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    write_pipeline(path, {"pooling_mode_lasttoken": True}, normalize=True)
    return path


def run(engine, token_ids, lengths) -> np.ndarray:
    return engine.step(engine.pack(token_ids, lengths)).wait()


def installed(backend: str) -> bool:
    return backend in cuda_backends(torch.device("cuda"))


@pytest.mark.parametrize("backend", ["auto", "torch-varlen", "triton", "flash-attn", "flashinfer"])
@pytest.mark.parametrize("model", ["minilm", "xlmr", "qwen3"])
def test_bf16_matches_transformers_fp32_on_ragged_batches(model, backend, minilm_dir, xlmr_dir, qwen3_dir):
    if backend in ("flash-attn", "flashinfer") and not installed(backend):
        pytest.skip(f"{backend} is not installed (or not for this GPU)")
    if backend == "flashinfer" and model == "minilm":
        pytest.skip("flashinfer has no kernels for MiniLM's head size (32)")
    rng = np.random.default_rng(0)
    dirs = {"minilm": (minilm_dir, "mean"), "xlmr": (xlmr_dir, "cls"), "qwen3": (qwen3_dir, "last")}
    path, pooling = dirs[model]
    config = WorkerConfig(model=path, device="cuda", dtype="bfloat16", attention_backend=backend)
    engine = load_engine(config)
    assert isinstance(engine, CudaEngine) and engine.info.pooling == pooling
    if backend != "auto":
        assert engine.info.attention_backend == backend
    reference = transformers.AutoModel.from_pretrained(path, torch_dtype=torch.float32).cuda().eval()
    for lengths in ([128], [3, 250, 17, 64, 1, 99], [512, 7, 300], list(rng.integers(1, 200, 40))):
        seqs, ids, lens = ragged(rng, lengths, engine.info.vocab_size)
        for _ in range(3):  # cold (eager), capture, replay: all three must be right
            got = run(engine, ids, lens)
            assert cosine_rows(got, reference_rows(reference, seqs, pooling)).min() >= 0.999


def test_replay_equals_eager_for_every_bucket_captured_in_any_order(minilm):
    rng = np.random.default_rng(1)
    buckets = [b for b in minilm.buckets.all() if b.num_tokens <= 2048 and b.num_seqs <= 64]
    random.Random(2).shuffle(buckets)
    for bucket in buckets[:40]:
        num_seqs = max(1, bucket.num_seqs // 2 + 1)
        total = max(num_seqs, bucket.num_tokens - rng.integers(0, 64))
        cuts = np.sort(rng.choice(np.arange(1, total), num_seqs - 1, replace=False)) if num_seqs > 1 else []
        lengths = np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int32)
        if lengths.max() > 512:
            continue
        batch = minilm.pack(rng.integers(5, 30000, total).astype(np.int32), lengths)
        if batch.bucket != bucket:
            continue
        eager, replayed = minilm.run_both(batch)
        assert np.isfinite(replayed).all()
        assert cosine_rows(eager, replayed).min() >= 0.999, bucket


def test_first_hit_runs_eager_second_captures_third_replays(minilm):
    rng = np.random.default_rng(3)
    _seqs, ids, lengths = ragged(rng, [37, 41, 20], 30000)
    bucket = minilm.pack(ids, lengths).bucket
    assert not minilm.graphs.is_captured(bucket)
    replays = minilm.graphs.num_replays
    first = run(minilm, ids, lengths)
    assert not minilm.graphs.is_captured(bucket)
    second = run(minilm, ids, lengths)
    assert minilm.graphs.is_captured(bucket) and minilm.graphs.num_replays == replays + 1
    third = run(minilm, ids, lengths)
    assert minilm.graphs.num_replays == replays + 2
    assert cosine_rows(first, second).min() >= 0.999 and cosine_rows(second, third).min() >= 0.99999


@pytest.fixture(scope="module")
def xlmr_flashinfer(xlmr_dir) -> CudaEngine:
    """An engine on flashinfer attention, which plans every batch on the host before its forward."""
    if not installed("flashinfer"):
        pytest.skip("flashinfer is not installed (or not for this GPU)")
    config = WorkerConfig(model=xlmr_dir, device="cuda", dtype="bfloat16", attention_backend="flashinfer")
    return load_engine(config)


ENGINES = ["minilm", "xlmr_flashinfer"]


@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
@pytest.mark.parametrize("engine", ENGINES)
def test_step_path_never_synchronises_the_host(engine, request):
    minilm = request.getfixturevalue(engine)
    rng = np.random.default_rng(4)
    _, ids, lengths = ragged(rng, [60, 61, 62], minilm.info.vocab_size)
    warm = minilm.pack(ids, lengths)
    minilm.prewarm([warm.bucket])
    cold = minilm.pack(*ragged(rng, [400, 300], minilm.info.vocab_size)[1:])  # a bucket not captured yet
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        handles = [minilm.step(warm), minilm.step(cold)]  # a replay and an eager cold run
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [h.wait().shape[0] for h in handles] == [3, 2]


@pytest.mark.parametrize("engine", ENGINES)
async def test_overlapping_batches_through_the_scheduler_stay_correct(engine, request):
    minilm = request.getfixturevalue(engine)  # flashinfer: a plan per batch while others are in flight
    rng = np.random.default_rng(5)
    scheduler = Scheduler(minilm, max_batch_tokens=512, max_queued_tokens=1 << 20, max_inflight_batches=2)
    scheduler.start()
    try:
        vocab = minilm.info.vocab_size
        requests = [ragged(rng, list(rng.integers(1, 120, rng.integers(1, 9))), vocab) for _ in range(60)]
        results = await asyncio.gather(*(scheduler.submit(ids, lens) for _, ids, lens in requests))
    finally:
        await scheduler.close()
    for (seqs, _, _), rows in zip(requests, results, strict=True):
        alone = np.stack([run(minilm, s, np.array([len(s)], np.int32))[0] for s in seqs])
        assert cosine_rows(rows, alone).min() >= 0.999


def test_prewarm_captures_at_once_and_counts_no_hit(minilm):
    bucket = Bucket(4, 192)
    assert minilm.prewarm([bucket]) == [bucket]
    assert minilm.graphs.is_captured(bucket)


def test_smoke_test_replays_every_captured_bucket_against_eager(minilm):
    wanted = [Bucket(1, 128), Bucket(8, 1024), Bucket(64, 2048)]
    minilm.prewarm(wanted)
    results = minilm.smoke_test([], 0.999, seed=1)
    assert {r.bucket for r in results} >= set(wanted)
    assert all(r.passed and r.min_cosine >= 0.999 and not r.has_nonfinite for r in results), results


def test_engine_stats_follow_captures_replays_and_the_pinned_ring(minilm):
    rng = np.random.default_rng(5)
    # A bucket no earlier test in this module has hit (they share the engine): many short sequences.
    for num_seqs, length in ((128, 15), (96, 13), (100, 9), (72, 11)):
        _seqs, ids, lengths = ragged(rng, [length] * num_seqs, 30000)
        if minilm.pack(ids, lengths).bucket not in minilm.graphs.policy.states:
            break
    else:
        pytest.fail("every candidate bucket was already hit")
    before = minilm.stats()
    for _ in range(3):  # cold (eager), captured, replayed
        run(minilm, ids, lengths)
    after = minilm.stats()
    assert after.eager_steps["cold"] == before.eager_steps["cold"] + 1
    assert after.num_captures == before.num_captures + 1 == len(after.capture_seconds)
    assert after.num_replays == before.num_replays + 2
    assert after.num_graphs_resident == before.num_graphs_resident + 1
    assert after.pinned_in_use_bytes == 0 < after.pinned_reserved_bytes  # every slot given back
    assert after.gpu_memory_bytes > 0


@pytest.mark.parametrize("backend", ["torch-varlen", "triton", "flash-attn", "flashinfer"])
@pytest.mark.parametrize("model", ["minilm", "xlmr", "qwen3"])
def test_span_batches_run_eagerly_and_match_transformers_per_span(
    model, backend, minilm_dir, xlmr_dir, qwen3_dir
):
    """Late chunking on the GPU: a batch holding a document with spans runs unbucketed, never in a
    graph; each span row is the mean of its tokens' last hidden states (transformers, fp32, the
    whole document run once), and the plain sequences sharing the batch get the rows they get alone
    (from a replayed graph)."""
    if backend in ("flash-attn", "flashinfer") and not installed(backend):
        pytest.skip(f"{backend} is not installed (or not for this GPU)")
    if backend == "flashinfer" and model == "minilm":
        pytest.skip("flashinfer has no kernels for MiniLM's head size (32)")
    rng = np.random.default_rng(1)
    path = {"minilm": minilm_dir, "xlmr": xlmr_dir, "qwen3": qwen3_dir}[model]
    engine = load_engine(WorkerConfig(model=path, device="cuda", dtype="bfloat16", attention_backend=backend))
    reference = transformers.AutoModel.from_pretrained(path, torch_dtype=torch.float32).cuda().eval()
    document = rng.integers(5, engine.info.vocab_size, 300).astype(np.int32)
    bounds = np.array([1, 40, 41, 180, 299], dtype=np.int64)  # a one-token span, a long one
    plain_seqs, plain_ids, plain_lens = ragged(rng, [17, 64], engine.info.vocab_size)
    for _ in range(3):  # the plain batch alone: eager, capture, replay
        alone = run(engine, plain_ids, plain_lens)
    ids = np.concatenate([plain_seqs[0], document, plain_seqs[1]])
    lengths = np.array([17, 300, 64], dtype=np.int32)
    rows = engine.step(engine.pack(ids, lengths, None, [None, bounds, None])).wait()
    assert rows.shape == (2 + len(bounds) - 1, engine.info.dimensions)
    with torch.no_grad():
        hidden = reference(input_ids=torch.from_numpy(document.astype(np.int64))[None].cuda())
        hidden = hidden.last_hidden_state[0].float().cpu().numpy()
    expected = np.stack([hidden[a:b].mean(0) for a, b in itertools.pairwise(bounds)])
    spans = rows[1:-1]

    def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    assert cosines(spans, expected).min() >= 0.999, cosines(spans, expected)
    assert cosines(rows[[0, -1]], alone).min() >= 0.999


async def test_queries_on_the_interactive_lane_beside_bulk_match_transformers(minilm_dir):
    """Queries submitted while bulk steps run go to the lane (its own stream, graphs and pool) and
    come back as transformers computes them; so do the bulk rows beside them."""
    from kembed.worker.scheduling.queues import Priority

    engine = load_engine(
        WorkerConfig(model=minilm_dir, device="cuda", dtype="bfloat16", max_batch_tokens=1024)
    )
    assert isinstance(engine, CudaEngine) and engine.lane is not None
    engine.prewarm_at_start("all", (), 300)
    assert engine.lane.graphs.num_resident > 0
    scheduler = Scheduler(
        engine, max_batch_tokens=1024, max_queued_tokens=1 << 20, lane=engine.lane, lane_max_batch_tokens=256
    )
    scheduler.start()
    rng = np.random.default_rng(11)
    vocab = engine.info.vocab_size
    bulk = [ragged(rng, list(rng.integers(20, 200, 24)), vocab) for _ in range(12)]
    queries = [ragged(rng, [int(rng.integers(4, 40))], vocab) for _ in range(60)]
    try:
        bulk_calls = [
            asyncio.ensure_future(scheduler.submit(ids, lens, priority=Priority.BULK))
            for _, ids, lens in bulk
        ]
        await asyncio.sleep(0)  # admitted: the main path is busy from here on
        query_calls = []
        for _, ids, lens in queries:  # spread over the bulk work
            query_calls.append(
                asyncio.ensure_future(scheduler.submit(ids, lens, priority=Priority.INTERACTIVE))
            )
            await asyncio.sleep(0.001)
        results = await asyncio.gather(*bulk_calls, *query_calls)
    finally:
        await scheduler.close()
    assert scheduler.num_lane_batches > 0, "no query took the lane while bulk ran"
    model = transformers.AutoModel.from_pretrained(minilm_dir, torch_dtype=torch.float32).cuda().eval()
    for (seqs, _, _), rows in zip([*bulk, *queries], results, strict=True):
        assert cosine_rows(rows, reference_rows(model, seqs, "mean")).min() >= 0.999
    assert engine.stats().num_graphs_resident == engine.graphs.num_resident + engine.lane.graphs.num_resident
