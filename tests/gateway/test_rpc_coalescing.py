"""Chunks that find a replica's RPC window full wait and go together as one RPC; each still gets its
own rows, its own errors, and nothing of a cancelled request is sent."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
import transformers
from gateway_fakes import BUNDLED_MODEL_DIR, FakeEmbedder, fake_vector, unpack

from kembed.gateway.coalescing import Part, RpcWindow
from kembed.proto import embedder_pb2 as pb


class GatedRpc:
    """An RPC double: records each call's parts and answers when the test opens its gate. Row i of a
    call holds the first token id of sequence i, so rows identify their sequences."""

    def __init__(self, refuse_id: int | None = None) -> None:
        self.calls: list[list[str]] = []  # request ids of each RPC's parts
        self.gates: list[asyncio.Event] = []
        self.refuse_id = refuse_id

    async def __call__(self, parts: list[Part]) -> np.ndarray:
        self.calls.append([part.request_id for part in parts])
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        ids = [int(seq[0]) for part in parts for seq in part.token_ids]
        if self.refuse_id in ids:
            raise ValueError(f"refused: {self.refuse_id}")
        return np.array(ids, dtype=np.float32)[:, None]

    async def open_all(self) -> None:
        for _ in range(20):
            for gate in self.gates:
                gate.set()
            await asyncio.sleep(0.01)


def part(name: str, *first_ids: int, num_tokens: int = 4) -> Part:
    """A part named `owner/index` belongs to request `owner`; any other name is its own request."""
    sequences = [np.full(num_tokens, first, np.int32) for first in first_ids]
    owner = name.partition("/")[0]
    return Part(name, sequences, None, num_tokens * len(sequences), deadline=float("inf"), owner=owner)


def window(
    rpc: GatedRpc, max_inflight: int = 1, max_tokens: int = 100, max_sequences: int = 100
) -> RpcWindow:
    return RpcWindow(
        rpc,
        max_inflight=max_inflight,
        max_tokens=max_tokens,
        max_sequences=max_sequences,
        is_refused_for_one=lambda error: isinstance(error, ValueError),
    )


async def test_chunks_arriving_while_the_window_is_full_share_the_next_rpc():
    rpc = GatedRpc()
    rpcs = window(rpc, max_inflight=1)
    first = asyncio.create_task(rpcs.call(part("a", 1)))
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(rpcs.call(part(name, i, i + 1))) for i, name in ((10, "b"), (20, "c"))]
    await asyncio.sleep(0.01)
    assert rpc.calls == [["a"]]  # b and c wait: one RPC is out
    await rpc.open_all()
    assert rpc.calls == [["a"], ["b", "c"]]
    assert (await first)[:, 0].tolist() == [1]
    assert [(await task)[:, 0].tolist() for task in waiting] == [[10, 11], [20, 21]]
    assert rpcs.num_inflight == 0


async def test_a_group_stays_within_one_chunks_limits_and_in_arrival_order():
    rpc = GatedRpc()
    rpcs = window(rpc, max_inflight=1, max_tokens=8, max_sequences=3)
    tasks = [asyncio.create_task(rpcs.call(part("first", 0)))]
    await asyncio.sleep(0.01)
    # 4 tokens each: two fit in 8 tokens; the 3-sequence part (12 tokens) goes alone.
    for name, ids in (("b", [1]), ("c", [2]), ("d", [3, 4, 5]), ("e", [6])):
        tasks.append(asyncio.create_task(rpcs.call(part(name, *ids))))
    await asyncio.sleep(0.01)
    await rpc.open_all()
    await asyncio.gather(*tasks)
    assert rpc.calls == [["first"], ["b", "c"], ["d"], ["e"]]


async def test_waiting_chunks_are_taken_round_robin_across_requests():
    """A query that arrives behind five chunks of one large request waits for one of them, not all;
    each request's chunks still go in order; small parts of different requests still share an RPC."""
    rpc = GatedRpc()
    rpcs = window(rpc, max_inflight=1, max_tokens=8)
    tasks = [asyncio.create_task(rpcs.call(part(f"bulk/{i}", 10 * i, 10 * i + 1))) for i in range(6)]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(rpcs.call(part("query/0", 100))))
    tasks.append(asyncio.create_task(rpcs.call(part("other/0", 200))))
    tasks.append(asyncio.create_task(rpcs.call(part("other/1", 201))))
    await asyncio.sleep(0.01)
    await rpc.open_all()
    await asyncio.gather(*tasks)
    assert rpc.calls == [
        ["bulk/0"],  # in flight when the others came
        ["bulk/1"],  # the oldest waiting request's turn (8 tokens: nothing else fits)
        ["query/0", "other/0"],  # then the others, one chunk each, sharing an RPC
        ["bulk/2"],
        ["other/1"],  # after bulk/2: bulk took its turn, "other" takes its second
        ["bulk/3"],
        ["bulk/4"],
        ["bulk/5"],
    ]
    assert [(await task)[:, 0].tolist() for task in tasks[:2]] == [[0, 1], [10, 11]]


async def test_without_a_window_every_chunk_is_its_own_rpc():
    rpc = GatedRpc()
    rpcs = window(rpc, max_inflight=0)
    tasks = [asyncio.create_task(rpcs.call(part(name, i))) for i, name in enumerate("abc")]
    await asyncio.sleep(0.01)
    assert rpc.calls == [["a"], ["b"], ["c"]]
    await rpc.open_all()
    await asyncio.gather(*tasks)


async def test_a_group_refused_as_a_whole_is_sent_again_part_by_part():
    rpc = GatedRpc(refuse_id=20)
    rpcs = window(rpc, max_inflight=1)
    first = asyncio.create_task(rpcs.call(part("a", 1)))
    await asyncio.sleep(0.01)
    good = asyncio.create_task(rpcs.call(part("b", 10)))
    bad = asyncio.create_task(rpcs.call(part("c", 20)))
    await asyncio.sleep(0.01)
    await rpc.open_all()
    assert rpc.calls == [["a"], ["b", "c"], ["b"], ["c"]]
    await first
    assert (await good)[:, 0].tolist() == [10]
    with pytest.raises(ValueError, match="refused: 20"):
        await bad


async def test_a_cancelled_waiting_chunk_is_never_sent():
    rpc = GatedRpc()
    rpcs = window(rpc, max_inflight=1)
    first = asyncio.create_task(rpcs.call(part("a", 1)))
    await asyncio.sleep(0.01)
    victim = asyncio.create_task(rpcs.call(part("b", 10)))
    survivor = asyncio.create_task(rpcs.call(part("c", 20)))
    await asyncio.sleep(0.01)
    victim.cancel()
    await rpc.open_all()
    await asyncio.gather(first, survivor)
    assert rpc.calls == [["a"], ["c"]]
    assert victim.cancelled()


@dataclass
class PickyEmbedder(FakeEmbedder):
    """Refuses, as a worker would an id past its vocabulary, any batch holding token id 999."""

    num_refused: int = 0

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        if 999 in np.frombuffer(request.batch.token_ids, dtype="<i4"):
            self.num_refused += 1
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "token id 999 is out of range")
        return await super().Embed(request, context)


async def test_concurrent_single_queries_through_the_gateway_share_rpcs_and_get_their_own_vectors(
    gateway_with,
):
    fake = PickyEmbedder(delay_s=0.05)
    sequences = [[i + 1, i + 2, i + 3] for i in range(12)]
    async with gateway_with(fake, max_inflight_rpcs=1) as client:
        responses = await asyncio.gather(*(client.post("/embed", json={"inputs": [s]}) for s in sequences))
    for sequence, response in zip(sequences, responses, strict=True):
        expected = fake_vector(np.array(sequence))
        np.testing.assert_allclose(response.json()[0], expected / np.linalg.norm(expected), rtol=1e-6)
    assert len(fake.batches) < len(sequences)  # some RPCs carried several requests
    assert max(len(batch) for batch in fake.batches) > 1


async def test_a_request_the_worker_refuses_does_not_fail_those_that_shared_its_rpc(gateway_with):
    fake = PickyEmbedder(delay_s=0.05)
    async with gateway_with(fake, max_inflight_rpcs=1) as client:
        first = asyncio.create_task(client.post("/embed", json={"inputs": [[7, 8]]}))
        await asyncio.sleep(0.02)  # its RPC is out: the next two wait and go together
        refused, accepted = await asyncio.gather(
            client.post("/embed", json={"inputs": [[999, 1]]}),
            client.post("/embed", json={"inputs": [[5, 6]]}),
        )
        assert (await first).status_code == 200
    assert refused.status_code == 422 and accepted.status_code == 200
    assert fake.num_refused == 2  # the shared RPC, then the culprit's own


@dataclass
class SlowScorer(FakeEmbedder):
    """A cross-encoder double whose logit depends on every id and token type of the pair."""

    task: str = "score"
    num_labels: int = 1
    batch_sizes: list[int] = field(default_factory=list)

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        await asyncio.sleep(0.05)
        ids = unpack(request.batch)
        types = unpack(pb.TokenBatch(token_ids=request.batch.token_type_ids, lengths=request.batch.lengths))
        self.batch_sizes.append(len(ids))
        logits = np.array([[pair_logit(i, t)] for i, t in zip(ids, types, strict=True)], dtype="<f4")
        return pb.ScoreResponse(scores=logits.tobytes(), num_sequences=len(ids), num_labels=1)


def pair_logit(ids: np.ndarray, types: np.ndarray) -> float:
    return float(int((ids.astype(np.int64) * (types.astype(np.int64) + 1)).sum()) % 997) / 100 - 5


async def test_concurrent_reranks_sharing_rpcs_keep_each_pairs_token_types(gateway_with):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(BUNDLED_MODEL_DIR))
    query, docs = "which city is the capital?", [f"document {i} about city number {i}" for i in range(10)]
    fake = SlowScorer()
    async with gateway_with(fake, max_inflight_rpcs=1) as client:
        responses = await asyncio.gather(
            *(
                client.post("/rerank", json={"query": query, "texts": [doc], "raw_scores": True})
                for doc in docs
            )
        )
    for doc, response in zip(docs, responses, strict=True):
        encoded = tokenizer(query, doc)
        expected = pair_logit(np.array(encoded["input_ids"]), np.array(encoded["token_type_ids"]))
        assert response.json()[0]["score"] == pytest.approx(expected, rel=1e-6)
    assert max(fake.batch_sizes) > 1  # some RPCs carried several requests' pairs
