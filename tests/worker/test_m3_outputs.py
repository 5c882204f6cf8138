"""BGE-M3's dense, sparse and ColBERT outputs from one pass of the engine against FlagEmbedding's
computation (tests/worker/m3_model.py), on a small model directory with random weights."""

import numpy as np
import pytest
from m3_model import build_m3_dir, m3_reference

from kembed.proto.accuracy import MIN_COSINE
from kembed.proto.outputs import COLBERT, DENSE, SPARSE, TOKENS, OutputShape
from kembed.worker.config import WorkerConfig
from kembed.worker.engine.engine import load_engine

ALL = DENSE | SPARSE | COLBERT | TOKENS
SEQUENCES = [[0, 5, 9, 5, 17, 2], [0, 44, 2], [0, *range(4, 60), 9, 9, 2], [0, 3, 7, 2]]


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):
    return build_m3_dir(tmp_path_factory.mktemp("m3"))


@pytest.fixture(scope="module")
def engine(m3_dir):
    return load_engine(WorkerConfig(model=m3_dir, device="cpu", dtype="float32"))


def _sparse(weights: np.ndarray, ids: list[int]) -> dict[int, float]:
    """The gateway's reduction (max per id, specials dropped), written plainly."""
    out: dict[int, float] = {}
    for w, idx in zip(weights.tolist(), ids, strict=True):
        if idx not in {0, 1, 2, 3} and w > 0 and w > out.get(idx, 0):
            out[idx] = w
    return out


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return (a * b).sum(-1)


def test_the_model_offers_every_output(engine):
    info = engine.info
    assert info.outputs == ALL and info.colbert_dimensions == 32 and info.hidden_size == 32


@pytest.mark.parametrize(
    "outputs",
    [ALL, DENSE | SPARSE, COLBERT, SPARSE | COLBERT],
    ids=["all", "dense+sparse", "colbert", "sparse+colbert"],
)
def test_one_pass_matches_flagembedding(engine, m3_dir, outputs):
    reference = m3_reference(m3_dir, SEQUENCES)
    lengths = np.array([len(s) for s in SEQUENCES])
    ids = np.concatenate([np.array(s, np.int32) for s in SEQUENCES])
    masks = np.full(len(SEQUENCES), outputs, np.uint8)
    masks[1] = DENSE  # a dense-only sequence in the same batch keeps its one row
    rows = engine.step(engine.pack(ids, lengths, None, None, masks)).wait()
    info = engine.info
    shape = OutputShape(info.dimensions, info.colbert_dimensions, info.hidden_size)
    counts = shape.rows_of(lengths, masks)
    assert len(rows) == counts.sum()
    at = 0
    for seq, mask, count, ref in zip(SEQUENCES, masks.tolist(), counts.tolist(), reference, strict=True):
        got = shape.split(rows[at : at + count], len(seq), mask)
        at += count
        if mask & DENSE:
            assert _cosines(got["dense"], ref["dense"]) >= MIN_COSINE
        if mask & COLBERT:
            assert got["colbert"].shape == ref["colbert"].shape
            assert _cosines(got["colbert"], ref["colbert"]).min() >= MIN_COSINE
        if mask & TOKENS:
            assert _cosines(got["tokens"], ref["tokens"]).min() >= MIN_COSINE
        if mask & SPARSE:
            lexical = _sparse(got["sparse"], seq)
            assert lexical.keys() == ref["sparse"].keys() and lexical
            assert max(abs(lexical[k] - ref["sparse"][k]) for k in lexical) <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize(
    "masks, graphs",
    [
        ([ALL, DENSE, SPARSE | COLBERT, ALL], "token_graphs"),
        ([DENSE | SPARSE | COLBERT, DENSE, SPARSE, COLBERT], "multi_graphs"),
        ([DENSE | SPARSE | COLBERT], "multi_graphs"),  # a batch of one: its sparse weights as one run
    ],
    ids=["with-tokens", "without-tokens", "one-sequence"],
)
def test_the_multi_output_graph_replays_what_the_cpu_engine_computes(engine, m3_dir, masks, graphs):
    gpu = load_engine(WorkerConfig(model=m3_dir, device="cuda", dtype="bfloat16", prewarm="none"))
    sequences = SEQUENCES[: len(masks)]
    lengths = np.array([len(s) for s in sequences])
    ids = np.concatenate([np.array(s, np.int32) for s in sequences])
    masks = np.array(masks, np.uint8)
    want = engine.step(engine.pack(ids, lengths, None, None, masks)).wait()
    for _ in range(3):  # eager, captured, replayed
        got = gpu.step(gpu.pack(ids, lengths, None, None, masks)).wait()
        assert got.shape == want.shape
        nonzero = np.abs(want).sum(1) > 0
        assert _cosines(got[nonzero], want[nonzero]).min() >= 0.99  # bf16 against float32
    assert getattr(gpu, graphs).num_replays >= 1  # batches asking no token vectors leave them out


@pytest.mark.gpu
def test_prewarm_captures_the_multi_output_graph_too(engine, m3_dir):
    gpu = load_engine(WorkerConfig(model=m3_dir, device="cuda", dtype="bfloat16", prewarm="none"))
    lengths = np.array([len(s) for s in SEQUENCES])
    ids = np.concatenate([np.array(s, np.int32) for s in SEQUENCES])
    masks = np.array([DENSE | SPARSE | COLBERT, DENSE, SPARSE, COLBERT], np.uint8)
    bucket = gpu.buckets.lookup(len(lengths), int(lengths.sum()))
    assert gpu.prewarm([bucket]) == [bucket]
    assert gpu.multi_graphs.is_captured(bucket) and not gpu.token_graphs.is_captured(bucket)
    num_captures = len(gpu.multi_graphs.capture_seconds)
    got = gpu.step(gpu.pack(ids, lengths, None, None, masks)).wait()  # its first batch: a replay
    assert gpu.multi_graphs.num_replays == 1 and len(gpu.multi_graphs.capture_seconds) == num_captures
    want = engine.step(engine.pack(ids, lengths, None, None, masks)).wait()
    nonzero = np.abs(want).sum(1) > 0
    assert got.shape == want.shape and _cosines(got[nonzero], want[nonzero]).min() >= 0.99
