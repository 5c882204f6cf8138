"""`kembed-worker stats|prewarm|smoke` against an address where no worker listens say so within
seconds (a connect timeout, 10 s by default and shown in --help), not after the 600 s a call may take."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from local_ports import free_port

from kembed.worker.tools.admin import CONNECT_TIMEOUT_S


def dead_address() -> str:
    return f"127.0.0.1:{free_port()}"  # left in TIME_WAIT, never listening: connections are refused


@pytest.mark.parametrize(
    "command",
    [["stats"], ["prewarm", "--buckets", "1x64"], ["smoke"], ["prewarm", "--hot-from", "DEAD"]],
    ids=["stats", "prewarm", "smoke", "prewarm-hot-from"],
)
def test_a_tool_against_a_dead_port_exits_non_zero_in_seconds(command):
    command = [dead_address() if word == "DEAD" else word for word in command]
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "kembed.worker",
            *command,
            "--target",
            dead_address(),
            "--connect-timeout",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 15
    assert "worker unreachable: none answered at 127.0.0.1:" in done.stderr and "within 1 s" in done.stderr


def test_the_default_connect_timeout_is_short_and_shown_in_help():
    assert CONNECT_TIMEOUT_S <= 10
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kembed.worker", "stats", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    text = " ".join(done.stdout.split())
    assert "--connect-timeout CONNECT_TIMEOUT seconds to wait for each worker to accept a connection" in text
    assert f"(default: {CONNECT_TIMEOUT_S})" in text
