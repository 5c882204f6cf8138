"""A worker with a shared token behind a gateway that has it, all real processes: requests are served
over the data port; a gateway without the token gets no worker; the admin tools need it. The
worker's data port closes a silent connection after its idle bound, and the gateway keeps its own
open across quiet spells longer than that."""

import contextlib
import socket
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from processes import free_port, spawn, start_stack

from kembed.proto import embedder_pb2 as pb
from kembed.proto.embedder_pb2_grpc import EmbedderStub

TOKEN = "e2e-worker-token"
IDLE_S = 1.5  # the worker's data-port idle bound here (30 s by default)


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("secret") / "token"
    path.write_text(TOKEN + "\n")  # a mounted Secret's file may end in a newline
    return path


@pytest.fixture(scope="module")
def guarded(log_dir, token_file):
    stack = start_stack(
        log_dir,
        num_workers=1,
        worker_flags=("--auth-token-file", str(token_file), "--data-idle-timeout-s", str(IDLE_S)),
        gateway_args=("--worker-auth-token-file", str(token_file)),
    )
    yield stack
    for proc in stack.processes:
        proc.stop()


def admin(*args: str, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-P", "-m", "kembed.worker", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_gateway_with_the_token_serves_over_the_data_port(guarded):
    response = httpx.post(f"{guarded.url}/v1/embeddings", json={"input": ["a b c", "d"]}, timeout=30)
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 2
    workers = httpx.get(f"{guarded.url}/info", timeout=5).json()["workers"]
    assert [w["transport"] for w in workers] == ["frames"]


def test_gateway_without_the_token_finds_no_worker_serving(guarded, log_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = spawn(f"bare-gateway-{port}", ["kembed.gateway", "--port", str(port),
                                             "--worker", guarded.workers[0]], log_dir)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # up (its first probe of the worker is done by then)
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        assert httpx.get(f"{url}/ready", timeout=5).status_code == 503
        workers = httpx.get(f"{url}/info", timeout=5).json()["workers"]
        assert not workers[0]["serving"] and "UNAUTHENTICATED" in workers[0]["last_error"]
    finally:
        gateway.stop()


def test_admin_tools_need_the_token_and_health_stays_open(guarded, token_file):
    address = guarded.workers[0]
    refused = admin("stats", "--target", address, "--timeout", "10")
    assert refused.returncode == 2 and "token" in refused.stderr
    allowed = admin("stats", "--target", address, "--timeout", "10", "--auth-token-file", str(token_file))
    assert allowed.returncode == 0, allowed.stderr
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert check.status == health_pb2.HealthCheckResponse.SERVING


def data_port_of(address: str) -> tuple[int, int]:
    """(the data port, its idle bound in ms) as the worker's Info advertises them."""
    with grpc.insecure_channel(address) as channel:
        info = EmbedderStub(channel).Info(
            pb.InfoRequest(), timeout=5, metadata=(("authorization", f"Bearer {TOKEN}"),)
        )
    return info.frame_port, info.frame_idle_timeout_ms


def test_a_silent_connection_to_the_data_port_is_closed_after_the_idle_bound(guarded):
    port, idle_ms = data_port_of(guarded.workers[0])
    assert idle_ms == IDLE_S * 1000
    with socket.create_connection(("127.0.0.1", port), timeout=10) as silent:
        started = time.monotonic()
        assert silent.recv(1) == b""  # closed by the worker, before the 10 s a token may take
        assert IDLE_S * 0.9 <= time.monotonic() - started < IDLE_S + 3


def test_the_gateway_keeps_its_data_connection_across_a_quiet_spell_past_the_idle_bound(guarded):
    """Told the bound by Info, the gateway sends an empty frame on its connection idle for a third of
    it: a request after a spell of 2.5 bounds is served over the same connection (the worker closed
    none meanwhile), the replica never marked down."""
    worker_log = next(p.log for p in guarded.processes if p.name.startswith("worker"))
    url = f"{guarded.url}/v1/embeddings"
    assert httpx.post(url, json={"input": ["before"]}, timeout=30).status_code == 200
    logged = len(worker_log.read_text())
    time.sleep(IDLE_S * 2.5)
    response = httpx.post(url, json={"input": ["after a quiet spell"]}, timeout=30)
    assert response.status_code == 200, response.text
    assert "closing data connection" not in worker_log.read_text()[logged:]
    (worker,) = httpx.get(f"{guarded.url}/info", timeout=5).json()["workers"]
    assert worker["transport"] == "frames" and worker["serving"] and not worker["last_error"]
