"""A worker whose port another process holds says so in one line and exits 2: for gRPC even when the
holder allows port sharing (gRPC's default would share it, and a stale worker keep getting traffic),
for the metrics port and for the data port."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from kembed.worker.config import bundled_model_dir


@pytest.fixture
def taken_port():
    with socket.socket() as holder:  # as a running worker's gRPC server: port sharing allowed
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


@pytest.mark.skipif(bundled_model_dir() is None, reason="needs the bundled model package")
@pytest.mark.parametrize(
    ("flag", "what"),
    [
        ("--port", "for gRPC (--port)"),
        ("--metrics-port", "for metrics"),
        ("--data-port", "for the data port"),
    ],
    ids=["grpc", "metrics", "data"],
)
def test_a_taken_port_is_a_one_line_error(taken_port: int, flag: str, what: str):
    ports = {"--port": "0", "--metrics-port": "0", "--data-port": "0", flag: str(taken_port)}
    done = subprocess.run(
        [
            sys.executable, "-P", "-m", "kembed.worker", "--device", "cpu", "--prewarm", "none",
            *(word for item in ports.items() for word in item),
        ],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert f"error: cannot listen on 127.0.0.1:{taken_port} {what}" in done.stderr
