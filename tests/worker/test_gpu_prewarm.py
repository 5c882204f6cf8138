"""Start-up prewarm, pad-up and the one-block staging on a real GPU (`pytest -m gpu`; CI has none).

After a start-up prewarm the serving path neither captures nor runs eagerly, and its rows match
transformers in float32; a batch padded up to a larger captured bucket is still right; a budget that
runs out leaves uncovered buckets to `capture_deferred`; one host-to-device copy of one block gives
the same rows as the model run on each input copied on its own.
"""

import numpy as np
import pytest
import torch
import transformers
from st_pipeline import write_random_minilm

from kembed.worker.__main__ import hot_first
from kembed.worker.buckets import Bucket
from kembed.worker.config import WorkerConfig
from kembed.worker.engine import load_engine
from kembed.worker.engine.cuda_engine import CudaEngine

pytestmark = pytest.mark.gpu
MAX_TOKENS, MAX_SEQS = 512, 16  # a small table (40 buckets) so a full prewarm takes seconds


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """all-MiniLM-L6-v2's shape (BERT, mean pooling, 512 positions) with random weights."""
    path = tmp_path_factory.mktemp("minilm")
    write_random_minilm(path)
    return path


@pytest.fixture(scope="module")
def reference(model_dir):
    return transformers.AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).cuda().eval()


def new_engine(model_dir) -> CudaEngine:
    config = WorkerConfig(
        model=model_dir, device="cuda", dtype="bfloat16", max_batch_tokens=MAX_TOKENS,
        max_batch_sequences=MAX_SEQS,
    )  # fmt: skip
    engine = load_engine(config)
    assert isinstance(engine, CudaEngine), "expected the CUDA engine with a varlen backend"
    return engine


def random_batch(rng: np.random.Generator):
    """(sequences, ids, lengths) of a batch the scheduler could form: 1-16 sequences, <= 512 tokens."""
    num_seqs = int(rng.integers(1, MAX_SEQS + 1))
    lengths = rng.integers(1, MAX_TOKENS // num_seqs + 1, num_seqs).astype(np.int32)
    seqs = [rng.integers(1000, 30000, n).astype(np.int32) for n in lengths]
    return seqs, np.concatenate(seqs), lengths


def reference_rows(model, seqs) -> np.ndarray:
    """transformers in float32, one sequence at a time, mean pooling."""
    rows = []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.from_numpy(seq.astype(np.int64))[None].cuda()
            rows.append(model(input_ids=ids).last_hidden_state[0].mean(0))
    return torch.stack(rows).float().cpu().numpy()


def eager_steps(engine: CudaEngine) -> int:
    return sum(engine.stats().eager_steps.values())


@pytest.mark.parametrize(
    "prewarm",
    ["all", (Bucket(4, 256), Bucket(16, 512))],
    ids=["all", "two-buckets-everything-pads-up"],
)
def test_after_prewarm_fifty_random_batches_only_replay_and_match_transformers(model_dir, reference, prewarm):
    engine = new_engine(model_dir)
    report = engine.prewarm_at_start(prewarm, (), 120.0)
    assert report is not None and not report.is_cut_short
    expected = len(engine.buckets.reachable()) if prewarm == "all" else len(prewarm)
    assert report.num_captured == expected == engine.graphs.num_resident  # the interactive lane's apart
    before = engine.stats()
    rng = np.random.default_rng(0)
    for _ in range(50):
        seqs, ids, lengths = random_batch(rng)
        batch = engine.pack(ids, lengths)
        assert engine.can_launch_inline(batch)
        if prewarm != "all":
            assert batch.bucket in prewarm  # padded up, sequences and tokens
        rows = engine.step(batch).wait()
        assert cosine_rows(rows, reference_rows(reference, seqs)).min() >= 0.999
    after = engine.stats()
    assert after.num_captures == before.num_captures and after.num_serving_captures == 0
    assert eager_steps(engine) == 0 and after.num_replays == before.num_replays + 50


def test_a_budget_that_runs_out_leaves_uncovered_buckets_to_idle_time(model_dir, reference):
    engine = new_engine(model_dir)
    report = engine.prewarm_at_start("all", (), 0.0)
    assert report.num_captured == 0 and report.stopped_by == "budget"
    seqs, ids, lengths = random_batch(np.random.default_rng(1))
    batch = engine.pack(ids, lengths)
    assert not engine.can_launch_inline(batch)
    first = engine.step(batch).wait()  # uncovered: eager, never a capture on the serving path
    assert engine.stats().eager_steps["uncovered"] == 1 and engine.stats().num_captures == 0
    assert engine.capture_deferred(60.0) >= 1  # the uncovered bucket first, then prewarm's backlog
    assert engine.graphs.is_captured(batch.own_bucket)
    again = engine.pack(ids, lengths)
    assert engine.can_launch_inline(again)
    second = engine.step(again).wait()
    expected = reference_rows(reference, seqs)
    assert cosine_rows(first, expected).min() >= 0.999 and cosine_rows(second, expected).min() >= 0.999
    assert engine.stats().num_serving_captures == 0


def test_one_block_one_copy_gives_the_rows_of_each_input_copied_on_its_own(model_dir):
    engine = new_engine(model_dir)
    rng = np.random.default_rng(2)
    _seqs, ids, lengths = random_batch(rng)
    types = rng.integers(0, 2, len(ids)).astype(np.int32)  # BERT reads token types: check their slot
    batch = engine.pack(ids, lengths, types)
    engine.prewarm([batch.bucket])
    rows = engine.step(batch).wait()
    torch.cuda.synchronize()
    # the static block holds exactly the batch's bytes: one copy moved the whole padded batch
    assert engine.static.block[: batch.block.nbytes].cpu().numpy().tobytes() == batch.block.tobytes()

    def device(array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).cuda()

    with torch.inference_mode():
        meta = engine._meta(device(batch.cu_seqlens), device(batch.seq_ids), batch.bucket)
        separate = engine.model(
            device(batch.input_ids), device(batch.position_ids), device(batch.token_type_ids), meta
        )[: batch.num_seqs]
    assert cosine_rows(rows, separate.float().cpu().numpy()).min() >= 0.9999


def test_the_operators_hot_list_is_captured_first_at_start_and_hits_are_reported(model_dir):
    """What a pod added by scaling does with KEMBED_WORKER_PREWARM_OBSERVED: the listed hot bucket,
    then the observed ones, head the start-up prewarm's order and are captured as graphs; the
    buckets serving hits are what the metrics port reports for the next hot list."""
    hot = (Bucket(1, 64), Bucket(4, 128), Bucket(2, 64))
    config = WorkerConfig(
        model=model_dir, prewarm="all", prewarm_hot=hot[:1], prewarm_observed=hot[1:], prewarm_seconds=120.0
    )
    engine = new_engine(model_dir)
    assert tuple(engine.buckets.prewarm_order(hot_first(config))[:3]) == hot
    report = engine.prewarm_at_start(config.prewarm, hot_first(config), config.prewarm_seconds)
    assert report is not None and not report.is_cut_short
    assert set(hot) <= set(engine.captured_buckets())
    assert engine.stats().bucket_hits == {}  # captures are not hits
    ids, lengths = np.arange(1000, 1090, dtype=np.int32), np.array([30, 30, 30], np.int32)  # 4x128
    engine.step(engine.pack(ids, lengths)).wait()
    assert engine.stats().bucket_hits == {"4x128": 1}
