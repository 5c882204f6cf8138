"""A gateway serving one port from several processes (`--processes`): every process answers, a scrape
of any of them reports the sum of all, stopping the parent stops them all and removes their metrics
files, and one that cannot start stops the gateway; a lone gateway stopped cleanly exits 0."""

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from processes import start_stack

from kembed.gateway.metrics import FOLD_S

NUM_REQUESTS = 24


def children(pid: int) -> list[int]:
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]


def metrics_dir_of(pid: int) -> Path:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    value = next(item for item in environ if item.startswith(b"PROMETHEUS_MULTIPROC_DIR="))
    return Path(value.split(b"=", 1)[1].decode())


@pytest.fixture(scope="module")
def multi_gateway(stack, log_dir):
    started = start_stack(
        log_dir, num_workers=0, worker_addresses=stack.workers, gateway_args=("--processes", "2")
    )
    yield started
    for proc in started.processes:
        proc.stop()


def test_every_process_answers_and_any_scrape_reports_the_sum(multi_gateway, client):
    texts = [f"request number {i} through one of two gateway processes" for i in range(NUM_REQUESTS)]
    expected = client.post("/embed", json={"inputs": texts}).json()
    for text, vector in zip(texts, expected, strict=True):
        # A new connection each time: the kernel spreads connections over the processes.
        response = httpx.post(f"{multi_gateway.url}/embed", json={"inputs": text}, timeout=30)
        assert response.status_code == 200
        np.testing.assert_allclose(response.json()[0], vector, rtol=1e-4, atol=1e-6)
    pattern = re.compile(r'kembed_gateway_request_duration_seconds_count\{code="200",route="/embed"\} (\S+)')

    def counted() -> float:
        text = httpx.get(f"{multi_gateway.url}/metrics", timeout=10).text
        return float(pattern.search(text).group(1))

    # Each process folds what its requests recorded at least every FOLD_S (and at once for a scrape
    # it answers itself): within that the sum is whole, whichever process answers the scrape.
    deadline = time.monotonic() + 3 * FOLD_S
    while counted() != NUM_REQUESTS and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(6):
        assert counted() == NUM_REQUESTS


def test_stopping_the_parent_stops_every_process_and_removes_the_metrics_files(multi_gateway):
    parent = multi_gateway.processes[-1].popen
    servers = [
        pid for pid in children(parent.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()
    ]
    assert len(servers) == 2
    metrics_dir = metrics_dir_of(servers[0])
    assert metrics_dir.is_dir()
    parent.terminate()
    assert parent.wait(20) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in servers)
    assert not metrics_dir.exists()


def test_a_lone_gateway_stopped_by_sigterm_drains_and_exits_0(stack, log_dir):
    """uvicorn raises the signal again after its drain; the gateway must not die of it (exit -15)."""
    lone = start_stack(log_dir, num_workers=0, worker_addresses=stack.workers)
    gateway = lone.processes[-1].popen
    try:
        assert httpx.post(f"{lone.url}/embed", json={"inputs": "one"}, timeout=30).status_code == 200
        gateway.terminate()
        assert gateway.wait(20) == 0
    finally:
        for proc in lone.processes:
            proc.stop()


def test_a_process_that_cannot_start_stops_the_gateway_with_an_error():
    with socket.socket() as taken:  # listening without SO_REUSEPORT: no other socket may bind the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway = subprocess.run(
            [sys.executable, "-P", "-m", "kembed.gateway", "--port", str(port), "--processes", "2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert gateway.returncode == 1
    assert "Address already in use" in gateway.stderr and "stopping the others" in gateway.stderr
