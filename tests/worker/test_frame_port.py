"""The worker's data port with many requests in each frame (RequestFrame in, ResultFrame out), over real
TCP against a real scheduler and a recording engine: each request answered to its id with its own
rows (as a unary call answers it), a wrong request failing alone with its reason, deadlines and
cancels per request inside a frame, a ResultFrame per batch, classes, pairs and span pooling."""

import asyncio
import itertools
import struct
import threading

import grpc
import numpy as np
import pytest

from kembed.proto import embedder_pb2 as pb
from kembed.worker.edge.frames import FrameService, serve_frames
from kembed.worker.info import ModelInfo
from kembed.worker.scheduling.scheduler import Scheduler

INFO = ModelInfo(
    model_name="stand-in", model_type="bert", task="embed", dimensions=3, max_sequence_length=64,
    vocab_size=1000, pooling="mean", normalize=False, dtype="float32", device="cpu", attention_backend="sdpa",
)  # fmt: skip
SCORER = ModelInfo(
    model_name="ranker", model_type="bert", task="score", dimensions=1, max_sequence_length=64,
    vocab_size=1000, pooling="cls", normalize=False, dtype="float32", device="cpu", attention_backend="sdpa",
)  # fmt: skip
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


class _Rows:
    def __init__(self, rows: np.ndarray, gate: threading.Event | None) -> None:
        self._rows, self._gate = rows, gate

    def wait(self) -> np.ndarray:
        if self._gate is not None:
            assert self._gate.wait(10), "test gate never opened"
        return self._rows


class Recorder:
    """Row of a sequence: [first id, length, sum of ids * (token type + 1)]; span pooling gives a row
    per span: [first id of the span, span length, -1]. Records each batch's lengths."""

    def __init__(self, info: ModelInfo = INFO, gate: threading.Event | None = None) -> None:
        self.info = info
        self.gate = gate
        self.batches: list[list[int]] = []

    def pack(self, token_ids, lengths, token_type_ids=None, spans=None):
        return token_ids.copy(), lengths.copy(), token_type_ids, spans

    def step(self, packed):
        token_ids, lengths, types, spans = packed
        self.batches.append(lengths.tolist())
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
        types = np.zeros_like(token_ids) if types is None else types
        rows = []
        for i, (start, length) in enumerate(zip(starts, lengths, strict=True)):
            ids = token_ids[start : start + length]
            bounds = None if spans is None else spans[i]
            if bounds is None:
                rows.append([ids[0], length, float((ids * (types[start : start + length] + 1)).sum())])
            else:
                rows += [[ids[a], b - a, -1.0] for a, b in itertools.pairwise(bounds)]
        return _Rows(np.array(rows, dtype=np.float32), self.gate)

    def can_launch_inline(self, packed) -> bool:
        return False

    def capture_deferred(self, max_seconds: float) -> int:
        return 0


def reference_row(ids: np.ndarray, types: np.ndarray | None = None) -> list[float]:
    types = np.zeros_like(ids) if types is None else types
    return [float(ids[0]), float(len(ids)), float((ids * (types + 1)).sum())]


class Port:
    """A connection to the data port that sends RequestFrames and collects every answer by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.rows: dict[int, np.ndarray] = {}
        self.errors: dict[int, tuple[int, str]] = {}
        self.num_frames = 0

    async def send(self, frame: pb.RequestFrame) -> None:
        body = frame.SerializeToString()
        self.writer.write(struct.pack("<I", len(body)) + body)
        await self.writer.drain()

    async def read(self) -> None:
        (length,) = struct.unpack("<I", await asyncio.wait_for(self.reader.readexactly(4), 5))
        result = pb.ResultFrame.FromString(await self.reader.readexactly(length))
        self.num_frames += 1
        ids = np.frombuffer(result.ids, "<u8").tolist()
        counts = np.frombuffer(result.num_rows, "<u4").tolist()
        rows = np.frombuffer(result.rows, "<f4").reshape(-1, result.width or 1)
        at = 0
        for request_id, count in zip(ids, counts, strict=True):
            self.rows[request_id] = rows[at : at + count]
            at += count
        for error in result.errors:
            for request_id in np.frombuffer(error.ids, "<u8").tolist():
                self.errors[request_id] = (error.code, error.message)

    async def until(self, ids) -> None:
        while not set(ids) <= set(self.rows) | set(self.errors):
            await self.read()


def frame_of(requests, *, kind=pb.FRAME_KIND_EMBED, ids=None, timeouts=None, priorities=None, types=None):
    """A RequestFrame of `requests`, each a list of int32 id arrays (its sequences)."""
    ids = list(range(1, len(requests) + 1)) if ids is None else ids
    sequences = [seq for request in requests for seq in request]
    frame = pb.RequestFrame(
        kind=kind,
        ids=np.array(ids, "<u8").tobytes(),
        num_sequences=np.array([len(r) for r in requests], "<u4").tobytes(),
        lengths=np.array([len(s) for s in sequences], "<u4").tobytes(),
        token_ids=np.concatenate(sequences).astype("<i4").tobytes(),
    )
    if timeouts is not None:
        frame.timeouts_ms = np.array(timeouts, "<u4").tobytes()
    if priorities is not None:
        frame.priorities = np.array(priorities, "u1").tobytes()
    if types is not None:
        frame.token_type_ids = np.concatenate(types).astype("<i4").tobytes()
    return frame


@pytest.fixture
async def worker():
    made = []

    async def start(runner: Recorder, **kwargs):
        kwargs.setdefault("max_batch_tokens", 64)
        kwargs.setdefault("max_queued_tokens", 4096)
        scheduler = Scheduler(runner, **kwargs)
        service = FrameService(scheduler, runner.info)
        listener, port = await serve_frames(service, "127.0.0.1", 0, 1 << 20)
        scheduler.start()
        connection = Port(*await asyncio.open_connection("127.0.0.1", port))
        made.append((scheduler, listener, connection, runner))
        return scheduler, connection

    yield start
    for scheduler, listener, connection, runner in made:
        if runner.gate is not None:
            runner.gate.set()
        connection.writer.close()
        listener.close()
        await scheduler.close()


def requests_of(seed: int, count: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        [rng.integers(1, 1000, rng.integers(1, 20)).astype(np.int32) for _ in range(rng.integers(1, 5))]
        for _ in range(count)
    ]


async def test_every_request_of_a_frame_is_answered_to_its_id_with_its_own_rows(worker):
    scheduler, port = await worker(Recorder())
    requests = requests_of(0, 50)
    await port.send(frame_of(requests, ids=[1000 + i for i in range(50)]))
    await port.until(range(1000, 1050))
    assert not port.errors
    for i, request in enumerate(requests):
        np.testing.assert_array_equal(port.rows[1000 + i], [reference_row(seq) for seq in request])
    assert scheduler.queued_tokens == 0


async def test_a_frame_is_answered_as_its_requests_one_by_one_are(worker):
    _scheduler, port = await worker(Recorder())
    requests = requests_of(1, 12)
    await port.send(frame_of(requests))
    for i, request in enumerate(requests):
        await port.send(frame_of([request], ids=[100 + i]))
    await port.until([*range(1, 13), *range(100, 112)])
    for i in range(12):
        np.testing.assert_array_equal(port.rows[i + 1], port.rows[100 + i])


async def test_a_wrong_request_fails_alone_with_its_reason(worker):
    _, port = await worker(Recorder())
    good = [np.array([5, 6], np.int32)]
    requests = [good, [np.array([5, 5000], np.int32)], good, [np.arange(1, 100, dtype=np.int32)], good]
    await port.send(frame_of(requests))
    await port.until(range(1, 6))
    assert sorted(port.rows) == [1, 3, 5]
    assert (
        port.errors[2][0] == INVALID
        and "token id 5000 at position 1 is outside [0, 1000)" in port.errors[2][1]
    )
    assert port.errors[4][0] == INVALID and "has 99 tokens; the model takes at most 64" in port.errors[4][1]


async def test_a_frame_whose_arrays_disagree_fails_all_its_requests_and_the_connection_serves_on(worker):
    _, port = await worker(Recorder())
    broken = frame_of([[np.array([5, 6], np.int32)], [np.array([7], np.int32)]])
    broken.lengths = np.array([2], "<u4").tobytes()  # two sequences announced, one length
    await port.send(broken)
    await port.until([1, 2])
    assert port.errors[1][0] == port.errors[2][0] == INVALID and "lengths" in port.errors[1][1]
    await port.send(frame_of([[np.array([9], np.int32)]], ids=[3]))
    await port.until([3])
    np.testing.assert_array_equal(port.rows[3], [[9, 1, 9]])


async def test_deadlines_expire_per_request_inside_a_frame(worker):
    gate = threading.Event()
    scheduler, port = await worker(Recorder(gate=gate), max_inflight_batches=1)
    await port.send(frame_of([[np.arange(1, 61, dtype=np.int32)]], ids=[1]))  # fills a batch, held
    await asyncio.sleep(0.05)
    queued = [[np.array([i, 2, 3], np.int32)] for i in range(4)]
    await port.send(frame_of(queued, ids=[10, 11, 12, 13], timeouts=[50, 0, 50, 0]))
    await port.until([10, 12])
    deadline = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert port.errors[10][0] == port.errors[12][0] == deadline
    assert scheduler.queued_tokens == 60 + 6  # the expired ones gave their tokens back
    gate.set()
    await port.until([1, 11, 13])
    assert sorted(port.rows) == [1, 11, 13]


async def test_cancels_inside_a_frame_free_their_place_and_get_no_answer(worker):
    gate = threading.Event()
    runner = Recorder(gate=gate)
    scheduler, port = await worker(runner, max_inflight_batches=1)
    await port.send(frame_of([[np.arange(1, 61, dtype=np.int32)]], ids=[1]))
    await asyncio.sleep(0.05)
    await port.send(frame_of([[np.array([i, 7], np.int32)] for i in range(5)], ids=[20, 21, 22, 23, 24]))
    await asyncio.sleep(0.05)
    assert scheduler.queued_tokens == 70
    await port.send(pb.RequestFrame(cancel_ids=np.array([21, 23], "<u8").tobytes()))
    for _ in range(100):
        if scheduler.queued_tokens == 66:
            break
        await asyncio.sleep(0.01)
    assert scheduler.queued_tokens == 66
    gate.set()
    await port.until([1, 20, 22, 24])
    await asyncio.sleep(0.05)
    assert sorted(port.rows) == [1, 20, 22, 24] and not port.errors
    assert sorted(n for batch in runner.batches for n in batch) == [2, 2, 2, 60]  # 21 and 23 never ran


async def test_a_batch_answers_a_connection_with_one_result_frame(worker):
    runner = Recorder()
    _, port = await worker(runner, max_batch_tokens=40, max_inflight_batches=1)
    requests = [[np.full(10, i + 1, np.int32)] for i in range(8)]  # 80 tokens: two batches of 40
    await port.send(frame_of(requests))
    await port.until(range(1, 9))
    assert runner.batches == [[10] * 4, [10] * 4]
    assert port.num_frames == 2  # one ResultFrame per batch, each with its four requests


async def test_requests_of_both_classes_in_one_frame_are_each_answered(worker):
    scheduler, port = await worker(Recorder())
    small = [np.array([3, 4], np.int32)]
    large = [np.array([5, 6, 7], np.int32)] * 12  # unspecified and 12 sequences: bulk by size
    await port.send(frame_of([small, large, small], priorities=[1, 0, 2]))
    await port.until([1, 2, 3])
    assert not port.errors and [len(port.rows[i]) for i in (1, 2, 3)] == [1, 12, 1]
    assert scheduler.queued_tokens_by_class == {"interactive": 0, "bulk": 0}


async def test_pairs_keep_their_token_types(worker):
    _, port = await worker(Recorder(SCORER))
    pairs = [[np.array([1, 2, 3, 4], np.int32)], [np.array([9, 8, 7], np.int32)]]
    types = [np.array([0, 0, 1, 1], np.int32), np.array([0, 1, 1], np.int32)]
    await port.send(frame_of(pairs, kind=pb.FRAME_KIND_SCORE, types=types))
    await port.until([1, 2])
    np.testing.assert_array_equal(port.rows[1], [reference_row(pairs[0][0], types[0])])
    np.testing.assert_array_equal(port.rows[2], [reference_row(pairs[1][0], types[1])])


async def test_a_kind_the_model_lacks_fails_the_frame_with_unimplemented(worker):
    _, port = await worker(Recorder())
    await port.send(frame_of([[np.array([1, 2], np.int32)]], kind=pb.FRAME_KIND_SCORE))
    await port.until([1])
    assert port.errors[1][0] == grpc.StatusCode.UNIMPLEMENTED.value[0]


async def test_span_pooled_requests_get_a_row_per_span(worker):
    _, port = await worker(Recorder())
    frame = frame_of([[np.arange(10, 20, dtype=np.int32)], [np.array([4, 5], np.int32)]])
    frame.num_spans = np.array([2, 0], "<u4").tobytes()
    frame.span_bounds = np.array([1, 4, 9], "<u4").tobytes()
    await port.send(frame)
    await port.until([1, 2])
    np.testing.assert_array_equal(port.rows[1], [[11, 3, -1], [14, 5, -1]])
    np.testing.assert_array_equal(port.rows[2], [reference_row(np.array([4, 5]))])
