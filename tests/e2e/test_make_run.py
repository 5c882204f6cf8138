"""`make run`, the README's first command, fails fast and says why when it cannot serve: a taken port
makes it exit non-zero within seconds, naming the ports and the variables that move them."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_make_run_with_a_taken_port_exits_non_zero_in_seconds():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # something else serves here (and never answers)
        port = taken.getsockname()[1]
        env = os.environ | {
            "PORT": str(port),
            "WORKER_PORT": str(free_port()),
            "WORKER_METRICS_PORT": str(free_port()),
        }
        started = time.monotonic()
        # its own session: on failure `make run` stops its whole process group, as Ctrl-C would
        done = subprocess.run(
            ["make", "--no-print-directory", "run"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            start_new_session=True,
            check=False,
        )
        elapsed = time.monotonic() - started
    assert done.returncode != 0
    assert elapsed < 10, elapsed
    assert "kembed did not start" in done.stdout and f"PORT={port} (gateway)" in done.stdout
