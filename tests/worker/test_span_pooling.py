"""Span pooling ("late chunking") in the worker: one sequence run whole, one row per span, equal to
transformers run on the same ids and mean-pooled per span; malformed spans refused INVALID_ARGUMENT."""

import asyncio
import itertools

import grpc
import numpy as np
import pytest
import torch
import transformers
from tokenizers import Tokenizer

from kembed.proto import embedder_pb2 as pb
from kembed.proto import embedder_pb2_grpc as pb_grpc
from kembed.worker.config import WorkerConfig, bundled_model_dir
from kembed.worker.edge.server import EmbedderService, build_server
from kembed.worker.engine import load_engine
from kembed.worker.engine.spans import SpanIndex
from kembed.worker.scheduling.scheduler import Scheduler

CHUNKS = [
    "The Eiffel Tower was finished in 1889 for the World's Fair.",
    "It was the tallest structure in the world for four decades.",
    "Its designer's company also built the frame of the Statue of Liberty.",
]


@pytest.fixture(scope="module")
def engine():
    return load_engine(WorkerConfig(model=bundled_model_dir(), device="cpu"))


@pytest.fixture(scope="module")
def document():
    """[CLS] chunk ids ... [SEP] as int32, and the k + 1 span boundaries of the chunks."""
    tokenizer = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    chunk_ids = [tokenizer.encode(chunk, add_special_tokens=False).ids for chunk in CHUNKS]
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    ids = np.array([cls_id, *[t for c in chunk_ids for t in c], sep_id], dtype=np.int32)
    bounds = np.cumsum([1, *[len(c) for c in chunk_ids]]).astype(np.int64)
    return ids, bounds, chunk_ids, (cls_id, sep_id)


def _normalized(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_span_index_maps_tokens_and_rows():
    index = SpanIndex.build(np.array([3, 6, 2]), [None, np.array([1, 3, 5]), None])
    # sequence 1's tokens 1-2 are span row 0, 3-4 row 1; the rest (row 2) are pooled into no span
    assert index.token_rows.tolist() == [2, 2, 2, 2, 0, 0, 1, 1, 2, 2, 2]
    assert index.span_sizes.tolist() == [2, 2]
    assert index.out_rows.tolist() == [0, 3, 4, 2]  # sequence 0, its two spans, sequence 2


def test_late_chunking_matches_transformers_on_the_whole_document(engine, document):
    ids, bounds, chunk_ids, (cls_id, sep_id) = document
    lengths = np.array([len(ids)], dtype=np.int32)
    rows = engine.step(engine.pack(ids, lengths, None, [bounds])).wait()
    assert rows.shape == (len(CHUNKS), engine.info.dimensions)

    model = transformers.AutoModel.from_pretrained(bundled_model_dir()).eval()
    with torch.no_grad():
        hidden = model(input_ids=torch.from_numpy(ids.astype(np.int64))[None]).last_hidden_state[0].numpy()
    expected = np.stack([hidden[a:b].mean(0) for a, b in itertools.pairwise(bounds)])
    cosines = (_normalized(rows) * _normalized(expected)).sum(1)
    assert cosines.min() >= 0.999, cosines

    # ... and differs from each chunk embedded alone ([CLS] chunk [SEP], the model's own pooling)
    alone = [np.array([cls_id, *c, sep_id], dtype=np.int32) for c in chunk_ids]
    alone_rows = engine.step(
        engine.pack(np.concatenate(alone), np.array([len(a) for a in alone], dtype=np.int32))
    ).wait()
    alone_cosines = (_normalized(rows) * _normalized(alone_rows)).sum(1)
    assert alone_cosines.max() < 0.99, alone_cosines


async def test_a_batch_mixing_span_and_plain_sequences_answers_each_its_own_rows(engine, document):
    ids, bounds, _, _ = document
    plain = np.array([101, 7592, 2088, 102], dtype=np.int32)
    scheduler = Scheduler(engine, max_batch_tokens=512, max_queued_tokens=4096)
    scheduler.start()
    try:
        alone_plain, alone_spans, mixed_plain, mixed_spans = await asyncio.gather(
            scheduler.submit(plain, np.array([4], dtype=np.int32)),
            scheduler.submit(ids, np.array([len(ids)], dtype=np.int32), None, [bounds]),
            scheduler.submit(plain, np.array([4], dtype=np.int32)),
            scheduler.submit(
                np.concatenate([plain, ids]), np.array([4, len(ids)], dtype=np.int32), None, [None, bounds]
            ),
        )
    finally:
        await scheduler.close()
    assert alone_spans.shape == (len(CHUNKS), engine.info.dimensions)
    assert mixed_spans.shape == (1 + len(CHUNKS), engine.info.dimensions)
    np.testing.assert_allclose(mixed_spans[0], alone_plain[0], atol=1e-5)
    np.testing.assert_allclose(mixed_spans[1:], alone_spans, atol=1e-5)
    np.testing.assert_allclose(mixed_plain, alone_plain, atol=1e-5)


@pytest.fixture
async def stub(engine):
    scheduler = Scheduler(engine, max_batch_tokens=512, max_queued_tokens=4096)
    service = EmbedderService(engine, scheduler, scheduler.max_batch_tokens, revision="r1")
    server, port = build_server(service, "127.0.0.1", 0)
    scheduler.start()
    await server.start()
    await service.set_serving()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield pb_grpc.EmbedderStub(channel)
    await channel.close()
    await server.stop(None)
    await scheduler.close()


def _request(lengths: list[int], num_spans: list[int], span_bounds: list[int]) -> pb.EmbedRequest:
    ids = np.full(sum(lengths), 1000, dtype="<i4")
    batch = pb.TokenBatch(
        token_ids=ids.tobytes(), lengths=lengths, num_spans=num_spans, span_bounds=span_bounds
    )
    return pb.EmbedRequest(batch=batch)


async def test_embed_with_spans_answers_one_row_per_span(stub):
    response = await stub.Embed(_request([6, 3], [2, 0], [1, 3, 5]))
    assert response.num_sequences == 3
    assert len(response.embeddings) == 3 * response.dimensions * 4


@pytest.mark.parametrize(
    ("lengths", "num_spans", "span_bounds", "message"),
    [
        ([6, 3], [2], [1, 3, 5], "num_spans has 1 values for 2 sequences"),
        ([6], [2], [1, 3], "span_bounds has 2 values; num_spans asks for 3"),
        ([6], [2], [1, 3, 3], "not strictly increasing"),
        ([6], [2], [3, 1, 5], "not strictly increasing"),
        ([6], [1], [1, 7], "out of range"),
        ([6, 3], [0, 1], [0, 4], "out of range"),
    ],
    ids=["count-per-sequence", "bounds-count", "empty-span", "decreasing", "past-the-end", "second-seq"],
)
async def test_malformed_spans_are_invalid_argument(stub, lengths, num_spans, span_bounds, message):
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Embed(_request(lengths, num_spans, span_bounds))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.value.details()
