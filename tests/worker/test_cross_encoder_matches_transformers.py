"""Our cross-encoders on packed (query, document) pairs against transformers' *ForSequenceClassification
on the same random weights: raw logits per row, through the engine and through the Score RPC."""

import grpc
import numpy as np
import pytest
import torch
import transformers

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.config import WorkerConfig
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.engine import load_engine
from kembed.worker.engine.layers.attention import build_metadata
from kembed.worker.engine.layers.attention_backends import ATTENTION_BACKENDS
from kembed.worker.engine.models.families import build_model
from kembed.worker.engine.models.model_dir import read_model_dir
from kembed.worker.scheduling.scheduler import Scheduler

TINY = dict(
    vocab_size=300,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=80,
)
FAMILIES = {
    "bert": (transformers.BertConfig, transformers.BertForSequenceClassification),
    "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaForSequenceClassification),
}


def write_cross_encoder(path, family: str, num_labels: int):
    config_cls, model_cls = FAMILIES[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY, num_labels=num_labels)).eval()
    model.save_pretrained(path)  # safetensors, "bert."/"roberta." prefixed encoder, head at the top
    return model


def pairs(family: str, seed: int = 1) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Templated pairs [CLS] q [SEP] d [SEP] (BERT: segments 0 then 1; RoBERTa: one type, zeros)."""
    rng = np.random.default_rng(seed)
    shapes = [(1, 0), (5, 20), (3, 1), (12, 60 - 2 * (family != "bert")), (7, 7), (7, 7)]
    ids, types = [], []
    for num_query, num_doc in shapes:
        query = rng.integers(5, TINY["vocab_size"], num_query)
        doc = rng.integers(5, TINY["vocab_size"], num_doc)
        ids.append(np.concatenate([[2], query, [3], doc, [3]]).astype(np.int32))
        second = 1 if family == "bert" else 0
        types.append(np.array([0] * (num_query + 2) + [second] * (num_doc + 1), np.int32))
    return ids, types


def reference(model, ids: list[np.ndarray], types: list[np.ndarray]) -> np.ndarray:
    """transformers, one pair at a time (no padding), raw logits."""
    with torch.no_grad():
        rows = [
            model(
                input_ids=torch.from_numpy(i.astype(np.int64))[None],
                token_type_ids=torch.from_numpy(t.astype(np.int64))[None],
            ).logits[0]
            for i, t in zip(ids, types, strict=True)
        ]
    return torch.stack(rows).numpy()


@pytest.mark.parametrize("backend", ["sdpa", "sdpa-padded"])
@pytest.mark.parametrize(
    ("family", "num_labels"),
    [("bert", 1), ("xlm-roberta", 1), ("bert", 3)],
    ids=["bert-one-label", "xlm-roberta-one-label", "bert-three-labels"],
)
def test_packed_pairs_give_transformers_logits_per_row(tmp_path, family, num_labels, backend):
    model = write_cross_encoder(tmp_path, family, num_labels)
    engine = load_engine(WorkerConfig(model=tmp_path, attention_backend=backend, device="cpu"))
    ids, types = pairs(family)
    lengths = np.array([len(i) for i in ids], np.int32)
    ours = engine.step(engine.pack(np.concatenate(ids), lengths, np.concatenate(types))).wait()
    expected = reference(model, ids, types)
    assert ours.shape == expected.shape == (len(ids), num_labels)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=1e-4)
    assert (engine.info.task, engine.info.dimensions) == ("score", num_labels)


def test_bert_token_types_change_the_logits(tmp_path):
    """The second segment's type embedding is really read (a packing that dropped it would pass
    a test whose reference also ignored it)."""
    write_cross_encoder(tmp_path, "bert", 1)
    engine = load_engine(WorkerConfig(model=tmp_path, device="cpu"))
    ids, types = pairs("bert")
    lengths = np.array([len(i) for i in ids], np.int32)
    with_types = engine.step(engine.pack(np.concatenate(ids), lengths, np.concatenate(types))).wait()
    without = engine.step(engine.pack(np.concatenate(ids), lengths)).wait()
    assert not np.allclose(with_types[1:4], without[1:4])


def test_roberta_family_max_sequence_length_accounts_for_the_position_offset(tmp_path):
    write_cross_encoder(tmp_path, "xlm-roberta", 1)
    engine = load_engine(WorkerConfig(model=tmp_path, device="cpu"))
    assert engine.info.max_sequence_length == TINY["max_position_embeddings"] - 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype:UserWarning")
@pytest.mark.parametrize(
    ("backend", "dtype", "atol"),
    [("sdpa-padded", torch.float32, 1e-4), ("torch-varlen", torch.bfloat16, 3e-2)],
    ids=["sdpa-padded-fp32", "torch-varlen-bf16"],
)
def test_cuda_graph_replay_matches_eager_with_no_host_sync(tmp_path, backend, dtype, atol):
    if backend not in ATTENTION_BACKENDS:
        pytest.skip(f"this torch has no {backend}")
    reference_model = write_cross_encoder(tmp_path, "bert", 1)
    device = torch.device("cuda")
    model = build_model(read_model_dir(tmp_path), ATTENTION_BACKENDS[backend]).to(device, dtype).eval()
    ids, types = pairs("bert")
    meta, positions = build_metadata(np.array([len(i) for i in ids], np.int32))
    meta = meta.to(device)
    inputs = [
        torch.from_numpy(x.astype(np.int64)).to(device)
        for x in (np.concatenate(ids), positions, np.concatenate(types))
    ]
    with torch.inference_mode():
        model(*inputs, meta)  # first call: lazy kernel set-up may sync, as the engine's eager hit does
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any .item()/.cpu()/nonzero in forward raises
        try:
            eager = model(*inputs, meta)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = model(*inputs, meta)
            graph.replay()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    assert captured.dtype == torch.float32 and captured.shape == (len(ids), 1)
    np.testing.assert_allclose(captured.cpu().numpy(), eager.cpu().numpy(), rtol=0, atol=1e-6)
    expected = reference(reference_model, ids, types)
    np.testing.assert_allclose(captured.cpu().numpy(), expected, rtol=1e-3, atol=atol)


@pytest.fixture
async def scorer(tmp_path):
    """A real grpc.aio worker over a tiny BERT cross-encoder; the budget splits requests into batches."""
    model = write_cross_encoder(tmp_path, "bert", 1)
    engine = load_engine(WorkerConfig(model=tmp_path, device="cpu"))
    scheduler = Scheduler(engine, max_batch_tokens=40, max_queued_tokens=4096)
    server, port = build_server(EmbedderService(engine, scheduler, 40, revision=""), "127.0.0.1", 0)
    scheduler.start()
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield model, pb_grpc.EmbedderStub(channel)
    await channel.close()
    await server.stop(None)
    await scheduler.close()


def token_batch(ids: list[np.ndarray], types: list[np.ndarray] | None) -> pb.TokenBatch:
    batch = pb.TokenBatch(
        token_ids=np.concatenate(ids).astype("<i4").tobytes(), lengths=[len(i) for i in ids]
    )
    if types is not None:
        batch.token_type_ids = np.concatenate(types).astype("<i4").tobytes()
    return batch


async def test_score_rpc_answers_raw_logits_in_order_across_batches(scorer):
    model, stub = scorer
    ids, types = pairs("bert")
    response = await stub.Score(pb.ScoreRequest(batch=token_batch(ids, types), request_id="r"))
    logits = np.frombuffer(response.scores, "<f4").reshape(response.num_sequences, response.num_labels)
    np.testing.assert_allclose(logits, reference(model, ids, types), rtol=1e-3, atol=1e-4)
    info = await stub.Info(pb.InfoRequest())
    assert (info.task, info.dimensions) == ("score", 1)


@pytest.mark.parametrize(
    ("rpc", "request_", "code", "message"),
    [
        ("Embed", pb.EmbedRequest(batch=token_batch([np.array([2, 3])], None)), "UNIMPLEMENTED", "score"),
        (
            "Score",
            pb.ScoreRequest(batch=token_batch([np.array([2, 5, 3])], [np.array([0, 2, 1])])),
            "INVALID_ARGUMENT",
            "token type id 2",
        ),
        (
            "Score",
            pb.ScoreRequest(batch=token_batch([np.array([2, 5, 3])], [np.array([0, 1])])),
            "INVALID_ARGUMENT",
            "3 int32 values were expected",
        ),
    ],
    ids=["embed-on-a-cross-encoder", "token-type-past-a-pair", "token-types-mismatch-ids"],
)
async def test_scorer_refuses_what_it_cannot_answer(scorer, rpc, request_, code, message):
    _, stub = scorer
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(stub, rpc)(request_)
    assert caught.value.code() == grpc.StatusCode[code]
    assert message in caught.value.details()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("num_pairs", [5, 3, 8])
def test_cuda_engine_scores_buckets_with_empty_sequence_slots(tmp_path, num_pairs):
    """Pairs that fill a 64-token bucket exactly: no padding tokens, and (for 5 and 3 pairs) empty
    sequence slots up to the power of two, whose offsets equal the bucket's token count. Found on the
    H200: the head indexed those offsets past the last row (a device-side assert)."""
    model = write_cross_encoder(tmp_path, "bert", 1)
    engine = load_engine(WorkerConfig(model=tmp_path, device="cuda", dtype="bfloat16"))
    rng = np.random.default_rng(num_pairs)
    lengths = np.full(num_pairs, 64, np.int32)
    ids = [
        np.concatenate([[2], rng.integers(5, TINY["vocab_size"], 61), [3, 3]]).astype(np.int32)
        for _ in lengths
    ]
    types = [np.zeros(64, np.int32) for _ in lengths]
    want = reference(model, ids, types)
    for _ in range(3):  # cold eager, capture, replay
        batch = engine.pack(np.concatenate(ids), lengths, np.concatenate(types))
        assert batch.bucket.num_tokens == 64 * num_pairs
        got = engine.step(batch).wait()
        np.testing.assert_allclose(got, want, atol=3e-2)
