"""The data port closes a connection that stays silent for its idle bound with nothing in flight (one
that never sends a frame too, token or not), keeps one that has requests in flight or sends empty
frames, and the gateway's own transport, told the bound, keeps its one connection open across quiet
spells several bounds long. Real TCP, a real scheduler and the gateway's FrameTransport against the
worker's FrameService, a recording engine; bounds of a fraction of a second."""

import asyncio
import struct
import threading
import time

import numpy as np
import pytest
from test_frame_port import Port, Recorder, frame_of

from kembed.gateway.pool.batches import Part
from kembed.gateway.pool.transports import FrameTransport
from kembed.proto import embedder_pb2 as pb
from kembed.worker.edge.frames import FrameService, serve_frames
from kembed.worker.scheduling.scheduler import Scheduler

BOUND_S = 0.3
TOKEN = "idle-token"


@pytest.fixture
async def data_port():
    """start(runner, token="") -> (service, port) of a data port closing connections idle BOUND_S."""
    made = []

    async def start(runner: Recorder, token: str = "", idle_timeout_s: float = BOUND_S):
        scheduler = Scheduler(runner, max_batch_tokens=64, max_queued_tokens=4096)
        service = FrameService(scheduler, runner.info)
        listener, port = await serve_frames(service, "127.0.0.1", 0, 1 << 20, token, idle_timeout_s)
        scheduler.start()
        made.append((scheduler, listener, runner))
        return service, port

    yield start
    for scheduler, listener, runner in made:
        if runner.gate is not None:
            runner.gate.set()
        listener.close()
        await scheduler.close()


async def closed_after(reader: asyncio.StreamReader, limit_s: float) -> float:
    """Seconds until the worker closes the connection (reading past any frames it sends)."""
    started = time.monotonic()
    while await asyncio.wait_for(reader.read(1 << 16), limit_s):
        pass
    return time.monotonic() - started


def body(message: pb.RequestFrame) -> bytes:
    data = message.SerializeToString()
    return struct.pack("<I", len(data)) + data


@pytest.mark.parametrize(
    ("token", "first"),
    [("", None), (TOKEN, None), (TOKEN, pb.RequestFrame(auth_token=TOKEN))],
    ids=["no-token-never-a-frame", "token-never-a-frame", "token-then-silence"],
)
async def test_a_silent_connection_is_closed_after_the_idle_bound(data_port, token, first):
    _, port = await data_port(Recorder(), token)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if first is not None:
        writer.write(body(first))
    elapsed = await closed_after(reader, 5)
    assert BOUND_S * 0.9 <= elapsed < BOUND_S + 1.5  # the bound, not the 10 s allowed for a token
    writer.close()


async def test_a_connection_is_not_idle_while_its_request_is_in_flight(data_port):
    """A request answered after three bounds keeps its connection; the clock starts at its answer."""
    gate = threading.Event()
    _, port = await data_port(Recorder(gate=gate))
    connection = Port(*await asyncio.open_connection("127.0.0.1", port))
    await connection.send(frame_of([[np.array([5, 6], np.int32)]]))
    await asyncio.sleep(BOUND_S * 3)
    gate.set()
    await connection.until([1])
    answered_at = time.monotonic()
    np.testing.assert_array_equal(connection.rows[1], [[5, 2, 11]])
    await closed_after(connection.reader, 5)
    assert BOUND_S * 0.9 <= time.monotonic() - answered_at < BOUND_S + 1.5
    connection.writer.close()


async def test_empty_frames_keep_a_connection_open(data_port):
    _, port = await data_port(Recorder())
    connection = Port(*await asyncio.open_connection("127.0.0.1", port))
    for _ in range(9):  # three bounds, an empty frame each third of one
        await connection.send(pb.RequestFrame())
        await asyncio.sleep(BOUND_S / 3)
    await connection.send(frame_of([[np.array([7], np.int32)]]))
    await connection.until([1])
    np.testing.assert_array_equal(connection.rows[1], [[7, 1, 7]])
    connection.writer.close()


def part(first_id: int) -> Part:
    deadline = asyncio.get_running_loop().time() + 10
    return Part(f"r{first_id}", [np.array([first_id, 9], np.int32)], None, 2, deadline=deadline)


@pytest.mark.parametrize("token", ["", TOKEN], ids=["no-token", "token"])
async def test_the_gateway_keeps_its_connection_across_quiet_spells_longer_than_the_bound(data_port, token):
    """Told the bound (as Info tells it), the gateway's transport sends an empty frame once it has
    sent nothing for a third of it: requests after quiet spells of 3 bounds find the same connection
    open, none fails UNAVAILABLE (which would mark the replica down)."""
    service, port = await data_port(Recorder(), token)
    frames = FrameTransport(
        "w", "127.0.0.1", port, max_frame_bytes=1 << 20, connect_timeout_s=5, auth_token=token,
        worker_idle_timeout_s=BOUND_S,
    )  # fmt: skip
    try:
        np.testing.assert_array_equal(await frames.request("embed", part(3), 10), [[3, 2, 12]])
        (connection,) = service.connections
        for first_id in (4, 5):
            await asyncio.sleep(BOUND_S * 3)
            rows = await frames.request("embed", part(first_id), 10)
            np.testing.assert_array_equal(rows, [[first_id, 2, first_id + 9]])
            assert service.connections == {connection}  # never closed, never reopened
    finally:
        await frames.close()


async def test_without_keep_alives_the_idle_connection_closes_and_the_next_request_reopens_it(data_port):
    """A caller that sends none (an older gateway: Info's bound 0) loses its idle connection; with
    nothing in flight no request fails, and the next one connects again."""
    service, port = await data_port(Recorder())
    frames = FrameTransport("w", "127.0.0.1", port, max_frame_bytes=1 << 20, connect_timeout_s=5)
    try:
        await frames.request("embed", part(3), 10)
        (first,) = service.connections
        await asyncio.sleep(BOUND_S * 3)
        assert not service.connections  # closed by the worker
        np.testing.assert_array_equal(await frames.request("embed", part(4), 10), [[4, 2, 13]])
        assert len(service.connections) == 1 and first not in service.connections
    finally:
        await frames.close()
