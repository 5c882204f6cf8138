"""The worker binds its gRPC port only after the engine's start-up prewarm has finished, so neither a
request nor a Kubernetes TCP probe reaches a worker that is still capturing graphs."""

import asyncio
import gc
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
from local_ports import free_port

from kembed.worker.__main__ import serve
from kembed.worker.buckets import Bucket
from kembed.worker.config import WorkerConfig
from kembed.worker.info import EngineStats, ModelInfo
from kembed.worker.results import ResultHandle

INFO = ModelInfo(
    model_name="standin", model_type="bert", task="embed", dimensions=4, max_sequence_length=512,
    vocab_size=1000, pooling="cls", normalize=True, dtype="float32", device="cpu", attention_backend="none",
)  # fmt: skip


class _Rows(ResultHandle):
    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def is_ready(self) -> bool:
        return True

    def wait(self) -> np.ndarray:
        return self._rows


class SlowPrewarmEngine:
    """An engine whose start-up prewarm holds until the test releases it; it records the thread and
    the settings it was called with."""

    def __init__(self) -> None:
        self.info = INFO
        self.started, self.release = threading.Event(), threading.Event()
        self.calls: list[tuple] = []
        self.lane = None  # no interactive lane
        self.buckets = None  # no bucket table: admin calls take any batch shape

    def prewarm_at_start(self, prewarm, hot, max_seconds: float) -> None:
        self.calls.append((prewarm, hot, max_seconds, threading.current_thread().name))
        self.started.set()
        assert self.release.wait(10)

    def pack(self, token_ids, lengths, token_type_ids=None):
        return len(lengths)

    def step(self, num_seqs: int) -> _Rows:
        return _Rows(np.ones((num_seqs, INFO.dimensions), np.float32))

    def can_launch_inline(self, packed) -> bool:
        return False  # as an engine without CUDA graphs: every step goes through the launcher thread

    def capture_deferred(self, max_seconds: float) -> int:
        return 0  # nothing to capture

    def captured_buckets(self) -> list[Bucket]:
        return []

    def stats(self) -> EngineStats:
        return EngineStats()

    def bucket_stats(self) -> list:
        return []

    def prewarm(self, buckets: list[Bucket]) -> list[Bucket]:
        return list(buckets)

    def smoke_test(self, buckets, min_cosine: float, seed: int) -> list:
        return []


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


@pytest.fixture
def unfreeze_gc():
    yield
    gc.unfreeze()  # serve() freezes what exists once it serves: give this process's objects back


async def test_the_port_opens_only_once_prewarm_has_finished(tmp_path, unfreeze_gc):
    engine, port = SlowPrewarmEngine(), free_port()
    config = WorkerConfig(
        model=tmp_path, port=port, metrics_port=0, prewarm=(Bucket(8, 512),), prewarm_hot=(Bucket(1, 64),),
        prewarm_seconds=7.0,
    )  # fmt: skip
    task = asyncio.create_task(serve(config, engine))
    try:
        assert await asyncio.to_thread(engine.started.wait, 10)
        await asyncio.sleep(0.2)
        assert not await asyncio.to_thread(accepts, port)  # still prewarming: nothing listens
        engine.release.set()
        deadline = time.monotonic() + 10
        while not await asyncio.to_thread(accepts, port):
            assert time.monotonic() < deadline, "the worker never opened its port after prewarm"
            await asyncio.sleep(0.05)
    finally:
        engine.release.set()
        os.kill(os.getpid(), signal.SIGINT)  # serve's own stop signal
        await asyncio.wait_for(task, 30)
    ((prewarm, hot, seconds, thread),) = engine.calls
    assert (prewarm, hot, seconds) == ((Bucket(8, 512),), (Bucket(1, 64),), 7.0)
    assert thread.startswith("kembed-launch")  # where steps and idle-time captures run too
