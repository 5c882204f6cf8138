"""A configuration this machine cannot serve stops the worker with one line and exit status 2."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--attention-backend", "flash-attn", "--device", "cpu"], "'flash-attn' needs a CUDA device"),
        (["--attention-backend", "triton", "--device", "cpu"], "'triton' needs a CUDA device"),
        (["--model", "/nonexistent-model-dir"], "not a model directory"),
    ],
    ids=["gpu-backend-on-cpu", "triton-on-cpu", "no-model-dir"],
)
def test_unservable_configuration_exits_2_with_one_line(args, says):
    done = subprocess.run(
        [sys.executable, "-P", "-m", "kembed.worker", "--port", "0", "--metrics-port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr
