"""`ClientLoad`: a few clients posting small embedding requests to the gateway the whole time, as
traffic does while a cluster scales; every answer is checked, and every one that is not a 200 with
one 384-wide vector per input is kept as a failure for the test to show.

Each client is a thread with its own connection, sending its next request as soon as the last is
answered; inputs vary from 1 to 4 short texts so chunks of several sizes are in flight.

`posting_to_gateway_pods`: one client posting to the gateway's ready pods straight (no Service), for
a rollout that moves the gateway itself; it keeps every answer's status code.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from operator_cluster import MODEL_NAME, Cluster

DIMENSIONS = 384  # all-MiniLM-L6-v2


@dataclass
class ClientLoad:
    url: str
    num_clients: int = 3
    num_ok: int = 0
    failures: list[str] = field(default_factory=list)  # "t=…s client …: what went wrong"
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _started: float = field(default_factory=time.monotonic)

    def __enter__(self) -> ClientLoad:
        self._threads = [
            threading.Thread(target=self._client, args=(i,), name=f"client-{i}", daemon=True)
            for i in range(self.num_clients)
        ]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def answered(self) -> int:
        """Answers checked so far, failures included."""
        with self._lock:
            return self.num_ok + len(self.failures)

    def wait_for_more(self, num_answers: int, timeout_s: float = 30) -> None:
        """Until `num_answers` more answers have come back (the load is flowing)."""
        target = self.answered() + num_answers
        deadline = time.monotonic() + timeout_s
        while self.answered() < target:
            assert time.monotonic() < deadline, f"the load stalled: {self.failures[-5:]}"
            time.sleep(0.05)

    def _client(self, index: int) -> None:
        with httpx.Client(timeout=30) as client:
            for num in itertools.count():
                if self._stop.is_set():
                    return
                inputs = [f"client {index} request {num} sentence {j}" for j in range(1 + num % 4)]
                failure = self._post(client, inputs)
                with self._lock:
                    if failure:
                        self.failures.append(
                            f"t={time.monotonic() - self._started:.1f}s client {index}: {failure}"
                        )
                    else:
                        self.num_ok += 1

    def _post(self, client: httpx.Client, inputs: list[str]) -> str:
        """What was wrong with the answer; empty when nothing."""
        try:
            answer = client.post(f"{self.url}/v1/embeddings", json={"model": MODEL_NAME, "input": inputs})
        except httpx.HTTPError as error:
            return repr(error)
        if answer.status_code != 200:
            return f"{answer.status_code} {answer.text[:200]}"
        data = answer.json()["data"]
        if len(data) != len(inputs) or any(len(d["embedding"]) != DIMENSIONS for d in data):
            return f"{len(data)} vectors for {len(inputs)} inputs"
        return ""


@contextmanager
def posting_to_gateway_pods(
    cluster: Cluster, body: dict[str, Any], each: Callable[[], None] | None = None
) -> Iterator[list[int]]:
    """A client posting `body` to /v1/embeddings on the newest ready gateway pod every 50 ms while
    the block runs (calling `each` before every request); yields the answers' status codes, all of
    them once the block has ended. A pod going away as it was picked is passed over, as a Service
    would move on."""
    answers: list[int] = []
    done = threading.Event()

    def client() -> None:
        while not done.is_set():
            if each is not None:
                each()
            pods = [p for p in cluster.kubelet.pods_of("minilm-gateway") if p.is_ready]
            try:
                answer = httpx.post(f"http://{pods[-1].ip}:8080/v1/embeddings", json=body, timeout=10)
            except (httpx.HTTPError, IndexError):
                continue
            answers.append(answer.status_code)
            time.sleep(0.05)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        yield answers
    finally:
        done.set()
        thread.join(30)
